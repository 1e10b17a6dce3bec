"""CREW in the simulator: all-to-all replayed as the model, flow-level FCFS against fair sharing, the
stepped engine against the exact one, link failures in job mode (repaired or abandoned), non-blocking
scatter, and job mode's engines named."""

import random

import pytest

from core.plan import Job, Plan, direct_group, make_layout
from emulation.simnet import sim_network
from emulation.topology import build, uniform
from scheduler import planners
from scheduler.planners import crew
from scheduler.view import NetworkView
from sim import TaskRun, make_network, simulate, simulate_tasks
from sim.stepped import NotOneHop, Stepped
from wansync.predict import oracle_view

pytestmark = pytest.mark.unit


# --- the simulator --------------------------------------------------------------------------------------------
def test_the_simulator_replays_all_to_all_as_the_model_over_the_slowest_link():
    rates = {(a, b): 8.0 * (1 + a + b) for a in range(4) for b in range(4) if a != b}
    layout = make_layout(1_000_000, 100_000)
    plan = Plan(0, "a2a", (0, 1, 2), dict.fromkeys((0, 1, 2), 1.0), layout,
                (direct_group(range(len(layout)), (0, 1, 2), (0, 1, 2)),))
    pred = simulate(plan, make_network(rates))
    assert pred.round_s == pytest.approx(4e6 / (8.0 * 2 * 1e6 / 8))  # 0<->1 at 16 Mbit/s is the slowest
    assert pred.link_bytes[(0, 1)] == 4_000_000 and (0, 3) not in pred.link_bytes


def test_flow_level_fcfs_lets_the_first_flow_finish_first_where_fair_sharing_splits_the_link():
    """Two tasks' scatters on link 0->2 (member 0 to aggregator 2), the second 0.1 s later: FCFS ends
    the first as if alone, FS shares; both engines agree."""
    net = make_network({(a, b): 8.0 for a in range(3) for b in range(3) if a != b})
    for sched in ("fl", "fs"):
        plans = [crew.plan(NetworkView(uniform(3).links),
                           Job(250_000, 10_000, (0, 1), {"sched": sched, "blocks": [[2, [[0, 25]]]]})).with_version(v)
                 for v in (1, 2)]
        runs = [TaskRun(0, plans[0], 0.0), TaskRun(1, plans[1], 0.1)]
        exact = simulate_tasks(runs, net)
        eng = Stepped(net, 0.005)
        for r in runs:
            eng.add(r)
        stepped = eng.run()
        alone = 2 * 1e6 / 1e6  # 1 MB scatter + 1 MB multicast back, each 1 s at 8 Mbit/s, pipelined
        first = exact.tasks[0].end_s
        if sched == "fl":
            assert first < 0.75 * alone + 0.1  # ~1 s: it never shared the link with the later task
        else:
            assert first > 1.5  # the link was shared
        assert stepped[0][0] == pytest.approx(first, rel=0.05)
        assert stepped[1][0] == pytest.approx(exact.tasks[1].end_s, rel=0.05)


def test_the_stepped_engine_agrees_with_the_exact_one_on_concurrent_one_hop_tasks():
    topo = build("crew:10:seed=5")
    view, net = oracle_view(topo), sim_network(topo)
    rng = random.Random(3)
    for scheme in ("crew", "crew-ed-fs", "crew-na-c2", "opr", "a2a", "ps"):
        spec, tol = planners.resolve(scheme), 0.12 if scheme == "ps" else 0.05  # ps: see sim/stepped.py
        runs = []
        for i in range(4):
            members = tuple(sorted(rng.sample(range(10), 4)))
            plan = spec.plan(view, Job(2_000_000, 5_000, members, dict(spec.options))).with_version(i + 1)
            runs.append(TaskRun(i, plan, 0.15 * i))
        exact = simulate_tasks(runs, net)
        eng = Stepped(net, 0.005)
        for r in runs:
            eng.add(r)
        got = eng.run()
        for i in range(4):
            assert got[i][0] == pytest.approx(exact.tasks[i].end_s, rel=tol), (scheme, i)


def test_the_stepped_engine_refuses_what_it_does_not_model():
    topo = build("crew:4:seed=1")
    ring = planners.resolve("ring").plan(oracle_view(topo), Job(10_000, 1_000, (0, 1, 2), {}))
    with pytest.raises(NotOneHop, match="stars"):
        Stepped(sim_network(topo)).add(TaskRun(0, ring))
    capped = make_network({(0, 1): 10.0, (1, 0): 10.0}, uplink_mbps={0: 5.0})
    with pytest.raises(NotOneHop, match="node caps"):
        Stepped(capped)



# --- failures (§2.9) in the simulator ------------------------------------------------------------------
def test_a_link_failure_in_the_simulators_job_mode_is_repaired_or_abandoned():
    """Link 0-1 fails at once: every early task over it stalls until the failure is known, then is re-run
    with its blocks moved (Eq. 3) or, with no repair, abandoned and its members queue again."""
    from core.compute import ComputeModel
    from sim.job import Queue
    from sim.outage import simulate_outages
    topo = build("crew:6:seed=4:x=0.1")
    net = sim_network(topo)
    for fix in (True, False):
        view = oracle_view(topo)

        def plan_for(members, receivers, view=view):
            return crew.plan(view, Job(250_000, 5_000, members, {}))

        def bw(a, b, view=view):
            e = view.g.adj[a].get(b)
            return 0.0 if e is None else e["rate"]

        def repair(plan, dead, running, view=view, fix=fix):
            out = crew.move_blocks(plan, range(6), bw, crew.loads({0: plan})) if fix else None
            return None if out is None else crew.plan(view, Job(250_000, 5_000, plan.participants,
                                                                 {"blocks": out[0]}))
        pred = simulate_outages(Queue(3), plan_for, ComputeModel("constant:0.05"), range(6), net, 20.0,
                                [(0.0, 0, 1)], detect_s=1.0, on_detect=lambda links, view=view: [
                                    view.suspend(*link) for link in links], repair=repair, dt=0.005)
        hit = pred.repaired if fix else pred.abandoned
        assert hit >= 1 and (pred.abandoned == 0 if fix else pred.repaired == 0)
        assert min(pred.iterations.values()) >= 3  # everyone goes on (abandoned members queue again)
        assert pred.detected == [(1.0, (0, 1))]


def test_non_blocking_scatter_rearranges_the_default_plan_and_counts_what_was_sent():
    """The group's plan moves the fewest chunks off the default assignment (Algorithm 2); in the
    stepped engine, contribution bytes already sent count, so a fully pre-sent scatter leaves only the
    multicast; a whole non-blocking job runs to its budget."""
    from core.compute import ComputeModel
    from sim.job import Queue
    from sim.nonblocking import default_blocks, simulate_nonblocking
    topo = build("crew:6:seed=4:x=0.1")
    view, net = oracle_view(topo), sim_network(topo)
    default = crew.plan(view, Job(300_000, 5_000, tuple(range(6)), {}))
    plan = crew.plan(view, Job(300_000, 5_000, (0, 2, 4), {"from_blocks": crew.blocks_of(default)}))
    fresh = crew.plan(view, Job(300_000, 5_000, (0, 2, 4), {}))
    assert [len(g.chunks) for g in plan.groups] == [len(g.chunks) for g in fresh.groups]  # the same split
    before, after = default_blocks(default), default_blocks(plan)
    moved = sum(len(set(after[j]) - set(before.get(j, ()))) for j in after)
    assert moved == sum(max(0, len(before.get(j, ())) - len(after.get(j, ()))) for j in before)  # the fewest
    alone = Stepped(net, 0.002)
    alone.add(TaskRun(0, plan, 0.0))
    sent = {(m, g.root): 4.0 * 5_000 * len(g.chunks) for g in plan.groups for m in plan.members if m != g.root}
    ahead = Stepped(net, 0.002)
    ahead.add(TaskRun(0, plan, 0.0), credit=sent)
    assert ahead.run()[0][0] < 0.75 * alone.run()[0][0]
    pred = simulate_nonblocking(Queue(3), lambda m, r: crew.plan(view, Job(300_000, 5_000, m, {
        "from_blocks": crew.blocks_of(default)})), before, default.layout, ComputeModel("constant:0.05"),
        range(6), net, 5.0, dt=0.005)
    assert min(pred.iterations.values()) >= 3




def test_job_mode_names_its_engines():
    from core.compute import ComputeModel
    from sim import simulate_job
    from sim.job import Queue
    with pytest.raises(ValueError, match="engine: .fluid. is not exact, ring or stepped"):
        simulate_job(Queue(2), lambda m, r: None, ComputeModel(), [0, 1], make_network({(0, 1): 1.0, (1, 0): 1.0}),
                     1.0, engine="fluid")
