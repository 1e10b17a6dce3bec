"""CREW (seed 004): LP (2) in closed form against HiGHS, Algorithms 1 and 2, Eq. (3), the planner and its
flow scheduling on the data plane's classes, all-to-all groups, the stepped engine against the exact
one, and failures: an aggregator killed mid-scatter (its block moves, the task ends exact on the
replacement) and a task that cannot be saved (abandoned, recorded, nothing applied). Live tests run
real agents over TCP on loopback; every result is compared with the exact sum computed here."""

import asyncio
import dataclasses
import random
import re
import signal
import time

import numpy as np
import pytest
from harness import assert_round_exact
from scipy.optimize import linprog
from test_checks_bite import _Wire
from test_cluster import start_cluster, stop_cluster
from test_failures import Cluster
from waiting import until

from agents.engine import ChunkEngine
from agents.workload import contribution
from core.classes import TrafficClass
from core.plan import Job, Plan, PlanError, direct_group, make_layout
from emulation.simnet import sim_network
from emulation.topology import build, uniform
from overlay.routing import Routes
from scheduler import planners
from scheduler.planners import crew
from scheduler.planners.crew_split import assign, bounds, rearrange, replacement, solve_ed, solve_na, split
from scheduler.progress.crew import CrewQueue
from scheduler.service import Scheduler
from scheduler.tasks import JobState, Task
from scheduler.view import NetworkView
from sim import TaskRun, make_network, simulate, simulate_tasks
from sim.stepped import NotOneHop, Stepped
from wansync.cluster import RunConfig
from wansync.predict import oracle_view


# --- LP (2) ----------------------------------------------------------------------------------------------
def lp2_highs(a: np.ndarray, c: np.ndarray) -> float:
    """LP (2) as the paper states it, solved by HiGHS: min T_s + T_m, x_j <= a_j T_s, x_j <= c_j T_m."""
    n = len(a)
    rows, rhs = [], []
    for j in range(n):
        for col, cap in ((n, a[j]), (n + 1, c[j])):
            r = np.zeros(n + 2)
            r[j], r[col] = 1.0, -cap
            rows.append(r)
            rhs.append(0.0)
    res = linprog(np.r_[np.zeros(n), 1.0, 1.0], A_ub=np.array(rows), b_ub=rhs,
                  A_eq=[np.r_[np.ones(n), 0.0, 0.0]], b_eq=[1.0], method="highs")
    assert res.status == 0
    return float(res.fun)


def test_lp2_closed_form_equals_linprog_on_50_random_instances():
    rng = np.random.default_rng(2024)
    for trial in range(50):
        n, p = int(rng.integers(3, 40)), int(rng.integers(2, 8))
        b = rng.uniform(1.0, 250.0, size=(n, n)) * (rng.random((n, n)) > 0.05 * (trial % 3))  # some links down
        members = sorted(rng.choice(n, size=min(p, n), replace=False).tolist())
        s = split(members, range(n), lambda i, j, b=b: float(b[i, j]), "na")
        a = np.array([min(b[i, j] for i in members if i != j) for j in range(n)])
        c = np.array([min(b[j, i] for i in members if i != j) for j in range(n)])
        if not ((a > 0) & (c > 0)).any():
            continue
        x = np.array(s.x)
        assert s.t == pytest.approx(lp2_highs(a, c), rel=1e-7), f"instance {trial}"
        assert x.sum() == pytest.approx(1.0) and (x >= 0).all()
        assert (x <= a * s.t_scatter * (1 + 1e-9)).all() and (x <= c * s.t_multicast * (1 + 1e-9)).all()
        assert (x[(a == 0) | (c == 0)] == 0).all()  # a dead link to a member: no block


def test_lp2_symmetric_links_split_in_proportion_and_even_division_over_live_aggregators():
    a = np.array([1.0, 2.0, 3.0, 0.0])
    x, ts, tm = solve_na(a, a)
    assert ts == pytest.approx(tm) and x == pytest.approx([1 / 6, 2 / 6, 3 / 6, 0.0])
    x, ts, tm = solve_ed(a, np.array([1.0, 1.0, 1.0, 1.0]))
    assert x == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0]) and ts == pytest.approx(1 / 3) and tm == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="no aggregator has live links"):
        solve_na([0.0, 1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="members: a partial reduce needs at least 2 members"):
        split([3], [0, 1], lambda i, j: 1.0)
    with pytest.raises(ValueError, match="mode must be 'na'"):
        split([0, 1], [0, 1], lambda i, j: 1.0, "lp")


# --- Algorithms 1 and 2 -------------------------------------------------------------------------------------
def test_algorithm1_cuts_contiguous_blocks_by_cumulative_bounds():
    assert assign([0.5, 0.25, 0.25], 8) == [[0, 1, 2, 3], [4, 5], [6, 7]]
    assert assign([1 / 3, 1 / 3, 1 / 3], 10) == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]  # float-safe: U_n = k
    assert assign([0.05, 0.95, 0.0], 4) == [[], [0, 1, 2, 3], []]  # x_i k < 1: an empty block
    with pytest.raises(ValueError, match="weights must sum to 1"):
        bounds([0.5, 0.4], 10)
    with pytest.raises(ValueError, match="weights must be finite and >= 0"):
        bounds([1.5, -0.5], 10)


def test_algorithm2_moves_the_fewest_chunks_largest_indexes_first():
    current = [[0, 1, 2, 3], [4, 5], [6, 7]]
    new = rearrange([0.25, 0.25, 0.5], current)
    assert new == [[0, 1], [4, 5], [2, 3, 6, 7]]  # block 0 gives up its largest two, block 2 takes them
    moved = sum(len(set(n) - set(c)) for n, c in zip(new, current, strict=True))
    assert moved == 2  # the fewest possible: |4 - 2| chunks
    # from a non-contiguous assignment (an earlier re-arrangement): still every chunk exactly once
    again = rearrange([0.5, 0.5, 0.0], new)
    assert again == [[0, 1, 2, 3], [4, 5, 6, 7], []]
    assert sorted(c for b in again for c in b) == list(range(8))
    with pytest.raises(ValueError, match="every chunk 0..k-1 exactly once"):
        rearrange([0.5, 0.5], [[0, 1], [1, 2]])


# --- Eq. (3) ----------------------------------------------------------------------------------------------
def test_eq3_picks_the_least_loaded_over_the_bottleneck_and_skips_dead_links():
    members = [0, 1]
    rates = {(0, 2): 10.0, (2, 0): 10.0, (1, 2): 10.0, (2, 1): 10.0,  # 2: fast, but loaded
             (0, 3): 5.0, (3, 0): 5.0, (1, 3): 5.0, (3, 1): 5.0,  # 3: slower, idle
             (0, 4): 100.0, (4, 0): 100.0, (1, 4): 0.0, (4, 1): 100.0}  # 4: a dead link to member 1

    def b(i: int, j: int) -> float:
        return rates.get((i, j), 1.0)
    # (load + 0.2) / bottleneck: node 2: (0.9 + 0.2) / 10 = 0.11; node 3: 0.2 / 5 = 0.04
    assert replacement(members, 5, 0.2, [2, 3, 4], b, {2: 0.9}) == 3
    assert replacement(members, 5, 0.2, [2, 3, 4], b, {2: 0.1}) == 2  # 0.03 < 0.04
    assert replacement(members, 5, 0.2, [4, 5], b, {}) is None  # the failed one and a dead link: nobody


# --- the planner --------------------------------------------------------------------------------------------
def test_crew_plan_gives_every_active_worker_a_block_and_opr_only_the_members():
    topo = build("crew:8:seed=3")
    view = oracle_view(topo)
    members = (1, 4, 6)
    plan = crew.plan(view, Job(40_000, 500, members, {})).validate(topo.links)
    assert plan.scheme == "crew" and plan.members == members and plan.receiver_set == members
    assert sorted(g.root for g in plan.groups) == list(range(8))  # all 8 aggregate (LP gives each a block)
    for g in plan.groups:  # a star: the members scatter to the root, the root multicasts back
        assert g.parent == {**{m: g.root for m in members if m != g.root}, g.root: None}
        assert set(g.children[g.root]) == set(members) - {g.root}
        assert g.fcfs  # flow-level FCFS by default
    assert sum(plan.info["x"].values()) == pytest.approx(1.0)
    opr = crew.plan(view, Job(40_000, 500, members, {"aggregate": "members"})).validate()
    assert opr.scheme == "opr" and sorted(g.root for g in opr.groups) == list(members)
    # a worker the view lost has no links left: it aggregates nothing
    view.node_down(3)
    assert 3 not in {g.root for g in crew.plan(view, Job(40_000, 500, members, {})).groups}


@pytest.mark.parametrize("sched, fields", [
    ("fs", {"own_class": True, "fcfs": False, "deadline_s": None, "bcast_priority": None}),
    ("fl", {"fcfs": True, "priority": 0, "bcast_priority": 1 - 1}),
    ("tl", {"fcfs": False, "deadline_s": crew.TL_DEADLINE_S}),
    ("c1", {"fcfs": True, "priority": 0, "bcast_priority": 1}),
    ("c2", {"fcfs": True, "priority": 1, "bcast_priority": 0}),
])
def test_each_flow_scheduling_scheme_maps_onto_traffic_classes(sched, fields):
    plan = crew.plan(NetworkView(uniform(5).links), Job(10_000, 500, (0, 1), {"sched": sched})).validate()
    for g in plan.groups:
        for k, v in fields.items():
            got = getattr(g, k) if k != "bcast_priority" or v is None else g.priority_of("bcast")
            assert got == v, (sched, k)
        assert Plan.from_wire(plan.to_wire()).groups == plan.groups  # survives the wire
    with pytest.raises(PlanError, match="sched: 'lifo' is not one of"):
        crew.plan(NetworkView(uniform(5).links), Job(10_000, 500, (0, 1), {"sched": "lifo"}))


def test_a_fixed_assignment_must_cover_every_chunk_once():
    view = NetworkView(uniform(4).links)
    plan = crew.plan(view, Job(8_000, 1_000, (0, 1), {"blocks": [[2, [[0, 3]]], [3, [[3, 8]]]]})).validate()
    assert [(g.root, g.chunks) for g in plan.groups] == [(2, (0, 1, 2)), (3, (3, 4, 5, 6, 7))]
    assert crew.blocks_of(plan) == [[2, [[0, 3]]], [3, [[3, 8]]]]
    with pytest.raises(PlanError, match="blocks: must cover chunks 0..7 exactly once"):
        crew.plan(view, Job(8_000, 1_000, (0, 1), {"blocks": [[2, [[0, 3]]], [3, [[2, 8]]]]}))


def test_an_all_to_all_group_must_send_from_every_member_to_every_other_receiver():
    layout = make_layout(1_000, 100)
    good = Plan(1, "a2a", (0, 1, 2), {0: 1.0, 1: 1.0, 2: 1.0}, layout, (direct_group(range(10), (0, 1, 2), (0, 1, 2)),))
    good.validate()
    g = good.groups[0]
    short = dataclasses.replace(g, children={**g.children, 1: (0,)})
    with pytest.raises(PlanError, match=re.escape("member 1 must send to exactly the other receivers [0, 2]")):
        dataclasses.replace(good, groups=(short,)).validate()
    tree = dataclasses.replace(g, parent={0: None, 1: 0, 2: None})
    with pytest.raises(PlanError, match="maps exactly its members and receivers to no parent"):
        dataclasses.replace(good, groups=(tree,)).validate()


# --- the wire: the classes a CREW block's chunks carry --------------------------------------------------------
async def test_fcfs_chunks_carry_their_flows_arrival_as_deadline_and_c1_lifts_the_multicast():
    params = 3_000
    plan = crew.plan(NetworkView(uniform(3).links),
                     Job(params, 1_000, (0, 2), {"sched": "c1", "blocks": [[1, [[0, 3]]]]})).with_version(1)
    root = ChunkEngine(1, Routes({0: {1, 2}, 1: {0, 2}, 2: {0, 1}}))
    root.overlay = wire = _Wire()  # type: ignore[assignment]
    member = ChunkEngine(0, Routes({0: {1, 2}, 1: {0, 2}, 2: {0, 1}}))
    member.overlay = mwire = _Wire()  # type: ignore[assignment]
    mwire.clock, wire.clock = (lambda: 100.0), (lambda: 101.0)  # the multicast's first chunk is ready later
    member.begin_task(1, 0, 0, plan, contribution(0, 0, 0, params))
    scatter = [TrafficClass.from_wire(h["cls"]) for h, _ in mwire.sent]
    assert len(scatter) == 3 and len({c for _, c in scatter}) == 1  # one flow: one arrival for all its chunks
    assert scatter[0][1].priority == 0 and scatter[0][1].deadline is not None
    root.begin_task(1, 0, 0, plan, None)
    for src in (0, 2):
        for c in range(3):
            h = {"t": "CHUNK", "job": 1, "task": 0, "attempt": 0, "version": 1, "chunk": c, "kind": "agg",
                 "origin": src, "contributors": bytes([1 << src]), "t_send": 0.0, "path": [src, 1], "hop": 0,
                 "off": 0, "total": 4_000, "nbytes": 4_000}
            root.chunk_buffer(h)
            root.chunk_segment(h, memoryview(contribution(0, 0, src, params)[c * 1000:(c + 1) * 1000]).cast("B"))
    bcast = [(h, TrafficClass.from_wire(h["cls"])[1]) for h, _ in wire.sent if h["kind"] == "bcast"]
    assert len(bcast) == 6  # 3 chunks to each of the 2 members
    assert {c.priority for _, c in bcast} == {1}  # C1: multicast above scatter
    assert len({c.deadline for _, c in bcast}) == 1 and bcast[0][1].deadline > scatter[0][1].deadline


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


# --- live: the schemes exact over TCP ------------------------------------------------------------------------
async def test_crew_opr_and_all_to_all_partial_reduces_are_exact_over_tcp():
    sched, agents, tasks = await start_cluster(build("crew:6:seed=2:x=0.2"), cluster="crew-ex", shaped=True)
    try:
        for scheme in ("crew", "opr", "a2a", "crew-na-c1"):
            js = sched.open_tasks(scheme, params=60_000, chunk_params=3_000, in_flight=8)
            recs = await asyncio.wait_for(asyncio.gather(
                sched.run_task(js, (0, 1, 2)), sched.run_task(js, (3, 4, 5)), sched.run_task(js, (1, 3, 5))), 120)
            for rec in recs:
                assert rec.ok and not rec.aborted, rec
                assert_round_exact(rec, sched.plans[rec.version])
            if scheme.startswith("crew"):  # every worker aggregated: those outside the members too
                assert sorted(recs[0].aggregators) == [3, 4, 5]
            else:
                assert recs[0].aggregators == []
            await asyncio.wait_for(sched.close_job(js), 30)
    finally:
        await stop_cluster(sched, tasks)
    assert not sched.errors


# --- failures (§2.9) ---------------------------------------------------------------------------------------
def queue_task(sched: Scheduler, plan: Plan, members: tuple[int, ...]) -> tuple[CrewQueue, Task]:
    """A scheduler (not started) that knows `plan` as a task's aborted attempt, and the policy."""
    pol = CrewQueue(group=len(members))
    js = sched.current = JobState(1, "crew", 10, Job(plan.params, plan.layout[0][1], members), plan, 0,
                                  planner=planners.resolve("crew"), progress=pol)
    t = js.tasks[0] = Task(0, 0, barrier=False, members=members, iters=dict.fromkeys(members, 0))
    pol.formed_t[0] = time.time()
    return pol, t


async def test_the_policy_moves_a_dead_aggregators_block_and_abandons_what_cannot_be_saved():
    sched = Scheduler("pol", 5)
    for n in range(5):
        sched.view.add_node(n)
    for a, b in uniform(5).links:
        sched.view.add_link(a, b)
    sched.alive = lambda: [0, 1, 2, 3]  # type: ignore[method-assign]  # node 4 is gone
    plan = sched._publish(crew.plan(sched.view, Job(5_000, 100, (0, 1), {})))
    pol, t = queue_task(sched, plan, (0, 1))
    # another task running: its blocks load nodes 0, 1 and 2, so node 3 is the least loaded (Eq. 3)
    busy = sched._publish(crew.plan(sched.view, Job(5_000, 100, (1, 2), {"blocks": [[0, [[0, 20]]], [1, [[20, 35]]],
                                                                                  [2, [[35, 50]]]]})))
    sched.current.tasks[1] = Task(1, 0, barrier=False, members=(1, 2), version=busy.version)
    sched.view.node_down(4)
    assert pol.retry(sched, sched.current, t, plan.version, "agent 4 lost") is None  # re-planned, not abandoned
    moved = {m["from"]: m["to"] for m in pol.failovers}
    assert moved == {4: 3}
    blocks = dict((r, rs) for r, rs in t.options["blocks"])
    assert 4 not in blocks and sum(hi - lo for rs in blocks.values() for lo, hi in rs) == len(plan.layout)
    # a lost member: abandoned; over the budget: abandoned
    sched.alive = lambda: [1, 2, 3]  # type: ignore[method-assign]
    assert "member(s) [0] lost" in pol.retry(sched, sched.current, t, plan.version, "agent 0 lost")
    sched.alive = lambda: [0, 1, 2, 3]  # type: ignore[method-assign]
    pol.budget_s = 1.0
    pol.formed_t[0] = time.time() - 2.0
    assert "over its time budget" in pol.retry(sched, sched.current, t, plan.version, "stall")
    assert len(pol.abandoned) == 2


CREW7 = RunConfig(topology="uniform:20", topo=uniform(7, rate_mbps=20.0).scaled(0.2), schemes=[],
                  model="resnet50", scale=0.2, rounds=1)


async def first_started_task(sched):
    """The running job and its first task under way (a version frozen, data moving)."""
    def started():
        return [t for t in sched.current.tasks.values() if t.started_t is not None and t.version is not None] \
            if sched.current is not None else []
    await until(lambda: bool(started()), "a task to start")
    return sched.current, started()[0]


async def test_an_aggregator_killed_mid_scatter_moves_its_block_and_the_task_ends_exact():
    """Workers 0..6, p = 3, CREW over all: a task's block held by a worker outside its members; that
    worker is killed while the members scatter to it. The task is retried with that block on the Eq.
    (3) replacement and ends exact; a task the killed worker was a member of is abandoned, and its
    other members' contributions end up exactly once in a later exact task."""
    async with Cluster("crew-kill", agents=CREW7) as c:
        sched = c.sched
        run = asyncio.create_task(sched.run_job("crew", rounds=3, params=1_200_000, chunk_params=20_000,
                                                progress="crew", group=3, compute="constant:0.05"))
        js, t = await first_started_task(sched)
        plan = sched.plans[t.version]
        victim = max(g.root for g in plan.groups if g.root not in plan.members)
        c.procs[victim].send_signal(signal.SIGKILL)  # 4.8 MB a member at 20 Mbit/s: mid-scatter
        js = await asyncio.wait_for(run, 180)
        pol = js.progress
        mine = [m for m in pol.failovers if m["task"] == t.id and m["from"] == victim]
        assert mine, pol.failovers
        rec = next(r for r in js.records if r.task == t.id)
        assert rec.ok and not rec.aborted and rec.attempt >= 1, rec
        assert_round_exact(rec, sched.plans[rec.version])
        assert mine[0]["to"] in {g.root for g in sched.plans[rec.version].groups}
        assert victim not in {g.root for g in sched.plans[rec.version].groups}
        seen: set[tuple[int, int]] = set()
        for r in js.records:
            if r.aborted:
                assert not r.digests and not r.ok  # nothing of it reached anyone
                continue
            assert_round_exact(r, sched.plans[r.version])
            assert not seen & set(r.iters.items()), "a contribution summed twice"
            seen |= set(r.iters.items())
        survivors = [n for n in range(7) if n != victim]
        assert {(n, k) for n in survivors for k in range(3)} <= seen  # every survivor's every iteration, once


async def test_a_task_whose_member_is_killed_is_abandoned_and_recorded_with_nothing_applied():
    async with Cluster("crew-abandon", agents=CREW7) as c:
        sched = c.sched
        run = asyncio.create_task(sched.run_job("crew", rounds=2, params=1_200_000, chunk_params=20_000,
                                                progress="crew", group=3, compute="constant:0.05"))
        js, t = await first_started_task(sched)
        victim = t.members[0]
        c.procs[victim].send_signal(signal.SIGKILL)
        js = await asyncio.wait_for(run, 180)
        rec = next(r for r in js.records if r.task == t.id)
        assert rec.aborted and not rec.ok and not rec.digests and f"member(s) [{victim}] lost" in rec.errors[0]
        assert any(a["task"] == t.id for a in js.progress.abandoned)
        # the other members applied nothing of it: their iteration went into a later exact task, once
        for n in t.members:
            if n == victim:
                continue
            later = [r for r in js.records if not r.aborted and r.iters.get(n) == t.iters[n]]
            assert len(later) == 1 and later[0].task > t.id
            assert_round_exact(later[0], sched.plans[later[0].version])


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


# --- every check the CREW pieces make refuses bad input, naming what is wrong -----------------------------------
def _plan_with(**group_fields):
    base = crew.plan(NetworkView(uniform(4).links), Job(4_000, 1_000, (0, 1), {"sched": "fs"}))
    return dataclasses.replace(base, groups=tuple(dataclasses.replace(g, **group_fields) for g in base.groups))


def _a2a_with(**group_fields):
    g = direct_group(range(4), (0, 1, 2), (0, 1, 2))
    return Plan(1, "a2a", (0, 1, 2), dict.fromkeys((0, 1, 2), 1.0), make_layout(4_000, 1_000),
                (dataclasses.replace(g, **group_fields),))


@pytest.mark.parametrize("make, message", [
    (lambda: _plan_with(fcfs=True, deadline_s=2.0), "fcfs orders flows by their arrival; it takes no deadline_s"),
    (lambda: _plan_with(bcast_priority=9), "(broadcast): priority 9 is not a level"),
    (lambda: _plan_with(fcfs=1), "fcfs 1 is not true or false"),
    (lambda: _a2a_with(root=1), "an all-to-all group's root is its lowest member (0), not 1"),
    (lambda: _a2a_with(children={0: (1, 2), 1: (0, 2), 2: (0, 1), 3: (0,)}), "nodes [3] send in an all-to-all group"),
    (lambda: _a2a_with(rates={(0, 1): 5.0}), "an all-to-all group takes no auxiliary routes or rates"),
])
def test_plans_with_bad_crew_fields_are_refused_naming_them(make, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        make().validate()


@pytest.mark.parametrize("call, error, message", [
    (lambda: crew.plan(NetworkView(uniform(4).links), Job(4_000, 1_000, (0, 1), {"chunks": 0})), PlanError,
     "chunks: 0 is not a number of chunks >= 1"),
    (lambda: crew.plan(NetworkView(uniform(4).links), Job(4_000, 1_000, (0, 1), {"aggregate": "some"})), PlanError,
     "aggregate: 'some' is not 'all' or 'members'"),
    (lambda: crew.plan(NetworkView(uniform(4).links), Job(4_000, 1_000, (0, 1), {"blocks": "all"})), PlanError,
     "blocks: 'all' is not [[root, [[lo, hi], ...]], ...]"),
    (lambda: bounds([1.0], 0), ValueError, "k must be >= 1 chunk, got 0"),
    (lambda: rearrange([1.0], [[0], [1]]), ValueError, "1 weights for 2 blocks"),
    (lambda: split([0, 1], [2, 2], lambda i, j: 1.0), ValueError, "aggregators must be non-empty and unique"),
    (lambda: CrewQueue(group=3, budget_s=0), ValueError, "budget_s must be > 0, got 0"),
    (lambda: Stepped(make_network({(0, 1): 1.0, (1, 2): 1.0, (2, 1): 1.0, (1, 0): 1.0})).add(TaskRun(0, crew.plan(
        NetworkView([(0, 1), (1, 2), (2, 1), (1, 0)]), Job(4_000, 1_000, (0, 2), {"blocks": [[0, [[0, 4]]]]})))),
     NotOneHop, "edge 2->0 is not a direct link"),
])
def test_bad_crew_input_is_refused_naming_the_field(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


def test_job_mode_names_its_engines():
    from core.compute import ComputeModel
    from sim import simulate_job
    from sim.job import Queue
    with pytest.raises(ValueError, match="engine: .fluid. is not exact, ring or stepped"):
        simulate_job(Queue(2), lambda m, r: None, ComputeModel(), [0, 1], make_network({(0, 1): 1.0, (1, 0): 1.0}),
                     1.0, engine="fluid")


def test_a_members_repeated_ready_never_puts_its_contribution_in_a_second_task():
    """After an abort a member's agent says READY again for the same iteration, whether its task is being
    retried or already ended on the retry: the policy keeps the contribution in that one task. Abandoned,
    the members queue again, except one that had received the whole result before the failure."""
    from scheduler.tasks import TaskRecord

    class Forms:  # the policy's view of the scheduler (scheduler.progress.Control): what it formed
        def __init__(self) -> None:
            self.formed: list[dict[int, int]] = []

        def form(self, js, members, receivers, rnd, iters=None, options=None):
            js.tasks[len(js.tasks)] = Task(len(js.tasks), rnd, barrier=False, members=tuple(members), iters=iters)
            self.formed.append(dict(iters))

        def alive(self):
            return [0, 1, 2, 3]
    ctl, pol = Forms(), CrewQueue(group=2)
    js = JobState(1, "crew", 100, Job(10, 10, (0, 1, 2, 3)), None, 0, progress=pol)  # type: ignore[arg-type]
    for n in (0, 1):
        pol.ready(ctl, js, n, 0, set())
    assert ctl.formed == [{0: 0, 1: 0}]
    pol.ready(ctl, js, 0, 0, set())  # repeated after an abort: ignored
    pol.ready(ctl, js, 2, 0, set())
    assert ctl.formed == [{0: 0, 1: 0}] and pol.queue == [(2, 0)]

    def record(task: int, iters: dict[int, int], aborted: bool) -> TaskRecord:
        return TaskRecord(1, "crew", task, 0, 1, 0.0, 0.0, not aborted, True, True, 0.0, 0.0, False, [],
                          iters=iters, members=sorted(iters), aborted=aborted)
    pol.consumed[0] = frozenset({1})  # node 1 had the whole result when the task was abandoned
    pol.task_done(ctl, js, record(0, {0: 0, 1: 0}, aborted=True))
    assert ctl.formed[-1] == {2: 0, 0: 0} and (1, 0) in pol.placed  # 0 queues again, 1 goes on
    pol.ready(ctl, js, 1, 0, set())
    assert pol.queue == []
