"""`auto` (scheduler/planners/auto.py): on hand-made WANs whose winner the test works out itself it
picks that winner; it switches once per flip of the winner and not for a gain within its margin; a
planner that raises or overruns is skipped; its lower bound never exceeds a simulated round; and live,
over real TCP, every round stays exact across its switches."""

from __future__ import annotations

import asyncio
import re
import statistics
import time

import pytest
from helpers.cluster import start_cluster, stop_cluster
from helpers.exact import assert_job_exact

from core.plan import Job, Plan
from emulation.link import LinkSpec
from emulation.topology import Topology, internet2, uniform
from overlay.routing import Routes, adjacency
from scheduler import planners
from scheduler.planners import auto
from scheduler.planners.auto import Candidate, decide, lower_bound_s
from scheduler.planners.onview import link_loads, view_network
from scheduler.records import measured
from scheduler.view import NetworkView
from sim import MEASURED, simulate
from wansync.predict import oracle_view

PARAMS, CHUNK = 200_000, 20_000


def mesh(n: int, rate) -> Topology:
    """A full mesh whose directed link (a, b) runs at rate(a, b) Mbit/s, no delay."""
    return Topology("mesh", n, {(a, b): LinkSpec(rate(a, b), 0.0) for a in range(n) for b in range(n) if a != b})


def hub(n: int = 5) -> Topology:
    """Node 0 reaches everyone at 1000 Mbit/s; everything else crawls at 20: the star at 0 wins."""
    return mesh(n, lambda a, b: 1000.0 if 0 in (a, b) else 20.0)


def ringish(n: int = 5) -> Topology:
    """Neighbours on a ring at 200 Mbit/s, the chords at 10: several trees over the ring win."""
    return mesh(n, lambda a, b: 200.0 if (b - a) % n in (1, n - 1) else 10.0)


def capped(topo: Topology, mbps: float) -> Topology:
    """topo with every node's ports at mbps (a big switch's)."""
    from emulation.topology import from_dict
    rates = [[topo.links[a, b].rate_mbps if (a, b) in topo.links else 0 for b in range(topo.nodes)]
             for a in range(topo.nodes)]
    return from_dict({"nodes": topo.nodes, "matrix": rates, "defaults": {"delay_ms": 0},
                      "caps": [{"node": k, "uplink_mbps": mbps, "downlink_mbps": mbps} for k in range(topo.nodes)]})


def job(n: int, **options) -> Job:
    return Job(PARAMS, CHUNK, tuple(range(n)), options)


def decision(memory: dict) -> dict:
    [event] = memory.pop("events")
    return event


def own_predictions(topo: Topology) -> dict[str, float]:
    """Every candidate planned and simulated here, on the same rates, without auto."""
    view = oracle_view(topo)
    out = {}
    for spec in planners.candidates(False):
        try:
            plan = spec.plan(view, Job(PARAMS, CHUNK, tuple(range(topo.nodes)), dict(spec.options)))
        except ValueError:  # a scheme that cannot plan this WAN (crew needs an aggregator everyone reaches)
            continue
        out[spec.name] = simulate(plan, view_network(view), costs=MEASURED).round_s
    return out


@pytest.mark.unit
def test_on_a_hub_wan_auto_runs_a_star_at_the_hub():
    topo = hub()
    plan = planners.resolve("auto").plan(oracle_view(topo), job(topo.nodes), memory := {})
    for g in plan.groups:  # whichever scheme planned it, the plan is the star at node 0
        assert g.root == 0 and set(g.children[0]) == {1, 2, 3, 4}
    own = own_predictions(topo)
    assert decision(memory)["chosen"] in {s for s, t in own.items() if t == pytest.approx(min(own.values()))}
    assert own["star"] == pytest.approx(min(own.values()))
    # a candidate that cannot win says which link's estimate kept it out: one of the slow ones, here
    pruned = [c for c in decision_after(topo)["candidates"] if (c["skipped"] or "").startswith("cannot win")]
    assert pruned
    for c in pruned:
        m = re.search(r"set by (\d+)->(\d+) at ([\d.]+) Mbit/s \(passive, 0 samples\)", c["skipped"])
        assert m and 0 not in (int(m[1]), int(m[2])) and float(m[3]) == pytest.approx(20.0), c["skipped"]


def decision_after(topo: Topology) -> dict:
    """auto's first decision on the WAN's true rates."""
    planners.resolve("auto").plan(oracle_view(topo), job(topo.nodes), memory := {})
    return decision(memory)


@pytest.mark.unit
def test_where_packing_is_fastest_auto_runs_packing():
    topo = ringish()
    own = own_predictions(topo)
    best = min(own, key=own.get)
    assert best == "packing" and own["packing"] < 0.9 * sorted(own.values())[1]  # the WAN is what we think
    plan = planners.resolve("auto").plan(oracle_view(topo), job(topo.nodes), memory := {})
    assert plan.scheme == "packing"
    d = decision(memory)
    assert d["chosen"] == "packing" and d["previous"] is None
    [mine] = [c for c in d["candidates"] if c["scheme"] == "packing"]
    assert mine["round_s"] == pytest.approx(own["packing"])
    assert plan.info["auto"]["chosen"] == "packing"


@pytest.mark.unit
def test_the_scheme_in_force_out_of_time_stays_unless_another_beats_its_lower_bound():
    """The scheme in force whose simulation ran out of time still runs: it stays unless another is
    expected faster than its lower bound by the margin. One whose planner failed, or with no bound (an
    auxiliary-route plan), gives way to the fastest predicted, as before."""
    late = Candidate("packing", skipped="no prediction in time", bound_s=0.5, runnable=True)
    assert decide([late, Candidate("mst", 0.77)], "packing")[0] == "packing"
    assert "lower bound 0.500 s" in decide([late, Candidate("mst", 0.77)], "packing")[1]
    assert decide([late, Candidate("mst", 0.46)], "packing")[0] == "packing"  # within the margin of it
    assert decide([late, Candidate("mst", 0.40)], "packing")[0] == "mst"
    failed = Candidate("packing", skipped="planner failed", bound_s=0.5)
    assert decide([failed, Candidate("mst", 0.77)], "packing")[0] == "mst"
    unbounded = Candidate("netstorm", skipped="no prediction in time", runnable=True)
    assert decide([unbounded, Candidate("mst", 0.77)], "netstorm")[0] == "mst"
    # evaluate marks it so: tree packing in force on internet2, with no budget for its simulation
    view = oracle_view(internet2(seed=1))
    cands, plans = auto.evaluate(view, job(9), [planners.resolve("packing"), planners.resolve("ring")], {},
                                 budget_s=0.0, in_force="packing")
    [packing] = [c for c in cands if c.scheme == "packing"]
    assert packing.round_s is None and packing.runnable and "packing" in plans
    assert packing.bound_s == pytest.approx(lower_bound_s(plans["packing"], view, auto.router(view)))


@pytest.mark.unit
def test_predictions_that_tie_go_to_the_plan_over_the_fewest_links():
    """Predictions within TIE are one: the plan over the fewest links runs (ring over 6 against shardps
    over 30, 1.36724 against 1.36721 s under binding ports), unless the one in force is among them; a
    gain beyond TIE still goes to the faster plan, on however many links."""
    ring, shardps = Candidate("ring", 1.36724, links=6), Candidate("shardps", 1.36721, links=30)
    mst = Candidate("mst", 1.817, links=10)
    assert decide([shardps, ring], None)[0] == "ring"
    assert decide([shardps, ring, mst], "mst")[0] == "ring"
    assert "ties shardps" in decide([shardps, ring, mst], "mst")[1]
    assert decide([shardps, ring, mst], "shardps")[0] == "shardps"
    faster = Candidate("shardps", 1.36724 * (1 - 2 * auto.TIE), links=30)
    assert decide([faster, ring], None)[0] == "shardps"
    # evaluate counts each candidate's links: the chosen one's, worked out here on the plan auto returned
    view = oracle_view(ringish())
    memory: dict = {}
    plan = planners.resolve("auto").plan(view, job(5), memory)
    d = decision(memory)
    [chosen] = [c for c in d["candidates"] if c["scheme"] == d["chosen"]]
    assert chosen["links"] == len(link_loads(plan, Routes(adjacency(view.links())).route, aux=False)) > 0


@pytest.mark.unit
def test_a_gain_within_the_margin_keeps_the_scheme_and_a_large_one_switches():
    def cands(cur_s: float, other_s: float) -> list[Candidate]:
        return [Candidate("ring", cur_s), Candidate("packing", other_s)]

    assert decide(cands(1.0, 0.99), "ring")[0] == "ring"  # 1 % faster: within 10 %
    assert decide(cands(1.0, 0.70), "ring")[0] == "packing"  # 30 % faster
    assert decide(cands(1.0, 0.95), "ring", margin=0.03)[0] == "packing"  # the margin is the caller's
    assert decide(cands(1.0, 0.95), "ring", margin=0.06)[0] == "ring"
    # a switch that would not pay back its cost within PAYBACK_ROUNDS rounds is not made
    assert decide(cands(1.0, 0.70), "ring", switch_cost_s=0.3 * auto.PAYBACK_ROUNDS + 0.01)[0] == "ring"
    assert decide(cands(1.0, 0.70), "ring", switch_cost_s=0.3 * auto.PAYBACK_ROUNDS - 0.01)[0] == "packing"
    # nothing in force: the fastest; the one in force unpredictable: the fastest too
    assert decide(cands(1.0, 0.99), None)[0] == "packing"
    assert decide([Candidate("ring", skipped="planner failed"), Candidate("packing", 2.0)], "ring")[0] == "packing"
    with pytest.raises(auto.NoCandidate, match="ring: planner failed"):
        decide([Candidate("ring", skipped="planner failed")], None)


@pytest.mark.unit
def test_auto_switches_once_per_flip_of_the_winner_and_never_between():
    """Among star and ring, the view alternates between the hub WAN (the star wins) and the ring WAN
    (the ring wins), each seen twice in a row: one switch per flip, none on the repeated view."""
    own = {name: {s: t for s, t in own_predictions(topo).items() if s in ("star", "ring")}
           for name, topo in (("hub", hub()), ("ring", ringish()))}
    assert own["hub"]["star"] < 0.5 * own["hub"]["ring"] and own["ring"]["ring"] < 0.5 * own["ring"]["star"]
    planner = auto.make(lambda: [planners.resolve("star"), planners.resolve("ring")])
    memory: dict = {}
    chosen, switches = [], 0
    for topo in [hub(), hub(), ringish(), ringish(), hub(), hub()]:
        planner(oracle_view(topo), job(5), memory)
        d = decision(memory)
        chosen.append(d["chosen"])
        switches += d["switched"]
    assert chosen == ["star", "star", "ring", "ring", "star", "star"] and switches == 2


@pytest.mark.unit
def test_a_planner_that_raises_or_overruns_is_skipped_and_the_others_decide():
    def broken(view, job, memory):
        raise RuntimeError("solver exploded")

    def slow(view, job, memory):
        end = time.thread_time() + 0.3
        while time.thread_time() < end:  # CPU, as a slow solver burns it
            pass
        return planners.resolve("ring").plan(view, job)

    specs = [planners.PlannerSpec("broken", broken), planners.resolve("star"), planners.PlannerSpec("slow", slow)]
    planner = auto.make(lambda: specs)

    def by_scheme(memory: dict) -> dict[str, dict]:
        return {c["scheme"]: c for c in decision(memory)["candidates"]}

    plan = planner(oracle_view(hub()), job(5, auto_budget_s=0.1), memory := {})
    by = by_scheme(memory)
    assert "solver exploded" in by["broken"]["skipped"]
    assert "over the budget" in by["slow"]["skipped"]
    assert by["star"]["round_s"] is not None and plan.scheme == "star"
    # with a budget the slow one fits, it takes part (the skip above is the budget's doing)
    planner(oracle_view(hub()), job(5, auto_budget_s=5.0), memory := {})
    slow_one = by_scheme(memory)["slow"]
    assert slow_one["plan_s"] >= 0.3 and "budget" not in (slow_one["skipped"] or "")
    # the budget never leaves a decision empty: a slow first candidate still gives the job a plan
    specs[:] = [specs[2], specs[1]]
    plan = planner(oracle_view(hub()), job(5, auto_budget_s=0.1), memory := {})
    assert by_scheme(memory)["slow"]["skipped"] is None and plan.scheme == "ring"


@pytest.mark.unit
def test_the_budget_counts_wall_time_too_and_a_simulation_gets_what_is_left_of_it(monkeypatch):
    """A decision waiting for a core (a niced solver on a busy machine) delays the switch as much as one
    computing: past the budget in wall time the remaining candidates are skipped. The in-force scheme's
    simulation gets half the budget, each other one the CPU budget left."""
    class WallClock:
        """auto's clocks, with wall time that a solve waiting for a core moves and CPU time that it does not."""

        def __init__(self) -> None:
            self.waited = 0.0

        def perf_counter(self) -> float:
            return time.perf_counter() + self.waited

        def thread_time(self) -> float:
            return time.thread_time()

    clock = WallClock()
    monkeypatch.setattr(auto, "time", clock)

    def waiting(view, job, memory):
        clock.waited += 0.3  # no CPU: a solve that waits 0.3 s for a core
        return planners.resolve("ring").plan(view, job)

    specs = [planners.resolve("star"), planners.PlannerSpec("waiting", waiting), planners.resolve("mst")]
    view = oracle_view(hub())
    cands, _ = auto.evaluate(view, job(5), specs, {}, budget_s=0.2, prune=False)
    by = {c.scheme: c for c in cands}
    assert by["star"].round_s is not None  # the first is never skipped
    for late in ("waiting", "mst"):  # planned past the budget's wall time, or not planned at all
        assert by[late].skipped is not None and "planning budget of 0.2 s spent" in by[late].skipped
    assert by["waiting"].plan_s < 0.2  # its 0.3 s were wall time, not CPU
    assert auto.evaluate(view, job(5), specs, {}, budget_s=5.0, prune=False)[0][2].round_s is not None
    monkeypatch.setattr(auto, "time", time)

    given: dict[str, float] = {}
    real = auto.simulate

    def recording(plan, net, *, costs, cpu_budget_s):
        given[plan.scheme] = cpu_budget_s
        return real(plan, net, costs=costs, cpu_budget_s=cpu_budget_s)

    monkeypatch.setattr(auto, "simulate", recording)
    specs[:] = [planners.resolve("star"), planners.resolve("ring"), planners.resolve("mst")]
    auto.evaluate(view, job(5), specs, {}, budget_s=1.0, in_force="ring", prune=False)
    assert 0.25 < given["ring"] <= 0.5  # the scheme in force: half, whatever the others take (x its CPU share)
    assert auto.MIN_SIM_S <= given["star"] < 1.0 and auto.MIN_SIM_S <= given["mst"] < 1.0
    # a decision that got 0.2 CPU-s in 0.8 s of wall time gives a simulation what a quarter of the wall time
    # left buys, not all the CPU left: the simulator stops on CPU time only
    assert auto.sim_budget_s(1.0, 0.2, 0.8, in_force=False) == pytest.approx(0.25 * 0.2)
    assert auto.sim_budget_s(1.0, 0.2, 0.2, in_force=False) == pytest.approx(0.8)  # a core of its own: the rest
    assert auto.sim_budget_s(1.0, 0.1, 0.4, in_force=True) == pytest.approx(0.25 * 0.5)
    assert auto.sim_budget_s(1.0, 0.0, 0.0, in_force=True) == 0.5
    assert auto.sim_budget_s(1.0, 0.9, 0.95, in_force=False) == auto.MIN_SIM_S


@pytest.mark.unit
@pytest.mark.parametrize("topo", [hub(), ringish(), uniform(5, rate_mbps=100.0, delay_s=0.0), internet2(seed=1),
                                  capped(ringish(6), 50.0)],
                         ids=["hub", "ringish", "uniform", "internet2", "ringish-ports-binding"])
def test_the_lower_bound_never_exceeds_a_simulated_round(topo):
    """auto skips a candidate whose bound is above the best prediction: the bound must be one. Its
    links' bytes at their rates and, where nodes declare ports, the bytes through each port at its rate."""
    view = oracle_view(topo)
    adj: dict[int, list[int]] = {}
    for a, b in view.links():
        adj.setdefault(a, []).append(b)
    route = Routes(adj).route
    n_bounded = 0
    for spec in planners.candidates(False):
        try:
            plan: Plan = spec.plan(view, job(topo.nodes, **spec.options))
        except ValueError:
            continue
        lb = lower_bound_s(plan, view, route)
        if lb is None:
            continue
        n_bounded += 1
        # the bound, worked out here: each group's bytes on each tree edge, at that edge's rate
        loads: dict = {}
        for g in plan.groups:
            nbytes = 4 * sum(plan.layout[c][1] for c in g.chunks)
            edges = [(c, p) for c, p in g.parent.items() if p is not None]
            edges += [(p, k) for p, ks in g.children.items() for k in ks]
            for a, b in edges:
                path = route(a, b)
                for hop in zip(path, path[1:], strict=False):
                    loads[hop] = loads.get(hop, 0) + nbytes
        mine = max(b * 8 / (view.rate(*ln) * 1e6) for ln, b in loads.items())
        for node, mbps in topo.uplink_mbps.items():
            mine = max(mine, sum(b for (a, _), b in loads.items() if a == node) * 8 / (mbps * 1e6))
        for node, mbps in topo.downlink_mbps.items():
            mine = max(mine, sum(b for (_, d), b in loads.items() if d == node) * 8 / (mbps * 1e6))
        assert lb == pytest.approx(mine)
        assert lb <= simulate(plan, view_network(view), costs=MEASURED).round_s * (1 + 1e-9)
    assert n_bounded >= 5


@pytest.mark.unit
def test_under_a_multicasting_progress_model_auto_chooses_among_one_source_schemes():
    spec = planners.resolve("auto").for_progress(True)
    assert spec.one_source and spec.name == "auto-mcast"
    assert {s.name for s in planners.candidates(True)} == {"mcast", "mcast-l3"}
    topo = hub()
    plan = spec.plan(oracle_view(topo), spec.opening(job(5)), memory := {})
    assert plan.participants == (0,) and plan.scheme.startswith("mcast")  # node 0's multicast to the rest
    assert decision(memory)["chosen"] in {"mcast", "mcast-l3"}
    assert planners.resolve("ring").for_progress(True).name == "ring"  # only auto has a variant


@pytest.mark.loopback
async def test_live_auto_switches_as_the_view_flips_and_every_round_is_exact():
    """Five real agents; the scheduler's view is told the hub WAN, then the ring WAN, then the hub
    again (the links themselves are loopback): auto re-plans off the loop, switches, and every
    receiver holds the exact sum (computed by the harness) in every round, whichever plan it ran."""
    views = [hub(), ringish()]
    shown = {"i": 0, "decided": 0, "flipped": 0}

    def show(topo: Topology) -> None:
        for (a, b), spec in topo.links.items():
            for _ in range(5):
                sched.view.observe(a, b, int(spec.rate_mbps * 1e6 / 8 * 0.1), 0.1)

    def on_event(kind, data):
        if kind == "timeline" and data["kind"] == "auto":
            shown["decided"] += 1
        # the next WAN once the last one was decided on (a solve takes a while, off the loop)
        elif kind == "task" and shown["decided"] > shown["flipped"]:
            shown["flipped"] = shown["decided"]
            shown["i"] += 1
            show(views[shown["i"] % 2])

    # no probes: their samples of the loopback links would overrule the WANs this test shows the view
    sched, agents, tasks = await start_cluster(uniform(5), cluster="auto", on_event=on_event, probe=False)
    show(views[0])
    try:
        js = await asyncio.wait_for(sched.run_job("auto", rounds=16, params=PARAMS, chunk_params=CHUNK,
                                                  compute_s=0.1), 120)
        assert all(r.ok and r.digests_agree for r in js.records)
        assert_job_exact(sched, js)
    finally:
        await stop_cluster(sched, tasks)
    assert not sched.errors
    decisions = [e for e in sched.timeline if e["kind"] == "auto"]
    assert decisions and decisions[0]["previous"] is None
    switched = [e for e in decisions if e["switched"]]
    assert switched, [(e["chosen"], e["why"]) for e in decisions]
    schemes = {sched.plans[r.version].scheme for r in js.records}
    assert len(schemes) >= 2 and "packing" in schemes
    assert all(e["job"] == js.job for e in decisions)


# --- wansync advise ------------------------------------------------------------------------------
def serve(body: bytes):
    """A real HTTP server on loopback answering every GET with `body`; returns (url, server)."""
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}", srv


@pytest.mark.unit
def test_advise_ranks_every_candidate_fastest_first_with_the_lp_bound():
    from wansync.advise import advise_topology

    topo = ringish()
    adv = advise_topology(topo, PARAMS, CHUNK)
    assert {c.scheme for c in adv.ranked} == {s.name for s in planners.candidates(False)}
    times = [c.round_s for c in adv.ranked if c.round_s is not None]
    assert times == sorted(times) and adv.best.scheme == "packing"
    assert adv.t_lp_s is not None and adv.t_lp_s <= min(times)
    # the topology's own simulation, worked out here: the same figures
    from emulation.simnet import sim_network
    plan = planners.resolve("ring").plan(oracle_view(topo), job(topo.nodes))
    [ring] = [c for c in adv.ranked if c.scheme == "ring"]
    assert ring.round_s == pytest.approx(simulate(plan, sim_network(topo, None), costs=MEASURED).round_s)


@pytest.mark.loopback
def test_advise_from_a_view_served_over_http_and_refuses_what_is_not_one(monkeypatch):
    import json as _json

    from wansync import advise as adv_mod

    topo = ringish()
    links = [{"src": a, "dst": b, "rate_mbps": s.rate_mbps} for (a, b), s in topo.links.items()]
    url, srv = serve(_json.dumps({"links": links, "coverage": 1.0}).encode())
    try:
        view, coverage = adv_mod.view_from_api(url)
        assert coverage == 1.0 and all(view.rate(a, b) == s.rate_mbps for (a, b), s in topo.links.items())
        got = adv_mod.advise(view, PARAMS, CHUNK)
        assert got.best.scheme == "packing"
        monkeypatch.setattr(adv_mod, "MAX_VIEW_BYTES", 100)  # a body past the limit is refused, not parsed
        with pytest.raises(adv_mod.AdviseError, match="more than 100 bytes"):
            adv_mod.view_from_api(url)
    finally:
        srv.shutdown()
    for bad, why in [(b"not json", "not a wansync view"), (b'{"links": []}', "no links"),
                     (_json.dumps({"links": [{"src": 0, "dst": 1, "rate_mbps": -5}]}).encode(), "positive rate"),
                     (_json.dumps({"links": [{"src": 0}]}).encode(), "not a wansync view")]:
        url, srv = serve(bad)
        try:
            with pytest.raises(adv_mod.AdviseError, match=why):
                adv_mod.view_from_api(url)
        finally:
            srv.shutdown()


@pytest.mark.loopback
def test_wansync_advise_prints_its_ranking_and_refuses_schemes_that_do_not_fit():
    import json as _json
    import subprocess
    import sys

    def wansync(*args):
        return subprocess.run([sys.executable, "-m", "wansync.cli", *args], capture_output=True, text=True,
                              timeout=150)

    res = wansync("advise", "--topology", "internet2", "--scale", "0.05", "--model", "resnet50", "--json")
    assert res.returncode == 0, res.stderr
    out = _json.loads(res.stdout.strip().splitlines()[-1])
    assert out["best"] == "packing" and out["t_lp_s"] <= out["ranked"][0]["round_s"]
    res = wansync("advise", "--schemes", "ring,mcast")
    assert res.returncode == 2 and "mcast do not fit --progress bsp" in res.stderr
    # on one 2-CPU machine packing cuts coarser chunks (scheduler/planners/cpufit.py): a slower round
    res = wansync("advise", "--topology", "internet2", "--scale", "0.05", "--model", "resnet50", "--schemes",
                  "packing", "--cpus", "2", "--json")
    assert res.returncode == 0, res.stderr
    [fitted] = _json.loads(res.stdout.strip().splitlines()[-1])["ranked"]
    assert fitted["round_s"] > out["ranked"][0]["round_s"]
    res = wansync("advise", "--cpus", "0")
    assert res.returncode == 2 and "--cpus must be at least 1" in res.stderr


@pytest.mark.unit
def test_live_rounds_slower_than_predicted_make_the_decision_stale_and_auto_learns_the_ratio():
    """The scheme in force runs far slower live than the simulator said (a machine short of CPU): after
    STALE_ROUNDS rounds the decision is stale, the next one scales that scheme's predictions by what
    was measured and runs the other; rounds as predicted never make it stale."""
    planner = auto.make(lambda: [planners.resolve("star"), planners.resolve("ring")])
    view = oracle_view(hub())
    memory: dict = {}
    plan = planner(view, job(5), memory)
    first = decision(memory)
    assert first["chosen"] == "star"
    star_s = next(c["round_s"] for c in first["candidates"] if c["scheme"] == "star")
    ring_s = own_predictions(hub())["ring"]
    slow = 3 * ring_s  # the star's live rounds: three times what the ring is predicted to take
    for _ in range(auto.STALE_ROUNDS - 1):
        measured(memory, plan.scheme, star_s)  # as predicted: nothing to learn
    assert not auto.stale(memory)
    for _ in range(auto.STALE_ROUNDS):
        measured(memory, plan.scheme, slow)
    assert auto.stale(memory)
    plan = planner(view, job(5), memory)
    d = decision(memory)
    assert d["chosen"] == "ring" and d["switched"] and plan.scheme == "ring"
    [star] = [c for c in d["candidates"] if c["scheme"] == "star"]
    assert star["ratio"] == pytest.approx(statistics.median([star_s] * 2 + [slow] * 3) / star_s)
    assert not auto.stale(memory)  # nothing measured of the ring yet
    measured(memory, plan.scheme, 10 * ring_s)  # its first round pays the switch: not the ring's pace
    measured(memory, plan.scheme, ring_s)
    planner(view, job(5), memory)
    [ring] = [c for c in decision(memory)["candidates"] if c["scheme"] == "ring"]
    assert ring["ratio"] == 1.0  # one round after the first: nothing learnt (the median of both: 5.5)
    for _ in range(auto.STALE_ROUNDS):
        measured(memory, plan.scheme, ring_s)
    assert not auto.stale(memory)  # the ring runs as expected


@pytest.mark.unit
def test_rounds_on_links_that_moved_since_the_decision_teach_auto_no_ratio():
    """The WAN under the scheme in force changed after the decision (its hub's links got 4x faster, the
    view saw it): its rounds ran 4x faster than predicted, which says nothing of the simulator. No ratio is
    learned from them; the same rounds on an unchanged view are learned, as before."""
    planner = auto.make(lambda: [planners.resolve("star"), planners.resolve("ring")])
    slow_hub = mesh(5, lambda a, b: 250.0 if 0 in (a, b) else 20.0)
    for view, learns in ((oracle_view(hub()), False), (oracle_view(slow_hub), True)):
        memory: dict = {}
        before = oracle_view(slow_hub)
        plan = planner(before, job(5), memory)
        first = decision(memory)
        assert first["chosen"] == "star"
        star_s = next(c["round_s"] for c in first["candidates"] if c["scheme"] == "star")
        for _ in range(auto.STALE_ROUNDS):
            measured(memory, plan.scheme, star_s / 4)
        planner(view, job(5), memory)
        [star] = [c for c in decision(memory)["candidates"] if c["scheme"] == "star"]
        assert star["ratio"] == (pytest.approx(0.25) if learns else 1.0), view


@pytest.mark.unit
def test_rounds_teach_a_ratio_when_a_decision_comes_every_round():
    """The view moves a little every round, so a decision may come every round; each keeps the scheme.
    Its rounds still add up since it was chosen: two rounds 1.5x slower than predicted teach 1.5."""
    planner = auto.make(lambda: [planners.resolve("star"), planners.resolve("ring")])
    view = oracle_view(hub())
    memory: dict = {}
    plan = planner(view, job(5), memory)
    first = decision(memory)
    star_s = next(c["round_s"] for c in first["candidates"] if c["scheme"] == "star")
    ratios = []
    for _ in range(3):
        measured(memory, plan.scheme, star_s * 1.5)
        planner(view, job(5), memory)
        [star] = [c for c in decision(memory)["candidates"] if c["scheme"] == "star"]
        ratios.append(star["ratio"])
    assert ratios[0] == 1.0 and ratios[-1] == pytest.approx(1.5)


@pytest.mark.unit
@pytest.mark.parametrize("change", ["share", "port"])
def test_a_share_that_moved_still_teaches_a_ratio_and_a_port_that_moved_does_not(change):
    """What a prediction rests on is each link's capacity and the declared ports, not what the links
    deliver: a link's share that moved (a probe, a round's other phase) leaves the WAN predicted on as
    it was, and the rounds teach their ratio; a port that moved makes them rounds of another WAN."""
    planner = auto.make(lambda: [planners.resolve("star"), planners.resolve("ring")])
    view = oracle_view(capped(hub(), 10_000.0))
    for ln in view.links():  # known from samples no port bound
        view.g.edges[ln]["capacity"] = view.rate(*ln)
    memory: dict = {}
    plan = planner(view, job(5), memory)
    first = decision(memory)
    assert first["chosen"] == "star"
    star_s = next(c["round_s"] for c in first["candidates"] if c["scheme"] == "star")
    for _ in range(auto.STALE_ROUNDS):
        measured(memory, plan.scheme, star_s * 1.5)
    if change == "share":
        view.g.edges[1, 0]["rate"] /= 4
    else:
        view.declare_cap(0, "down", 50.0)
    planner(view, job(5), memory)
    [star] = [c for c in decision(memory)["candidates"] if c["scheme"] == "star"]
    assert star["ratio"] == (pytest.approx(1.5) if change == "share" else 1.0)


@pytest.mark.loopback
async def test_the_scheduler_feeds_measured_rounds_to_the_planner_and_re_plans_when_it_says_stale():
    """A planner (registered here) that calls itself stale once it has seen three measured rounds: the
    scheduler re-plans on a view that never moves, and the rounds it measured are the ones recorded."""
    seen: list[list] = []

    def plan(view, job, memory):
        seen.append(list(memory.get("measured", [])))
        memory["plans"] = memory.get("plans", 0) + 1
        return planners.resolve("ring").plan(view, job)

    def stale(memory):
        return memory.get("plans", 0) == 1 and len(memory.get("measured", [])) >= 3

    spec = planners.register(planners.PlannerSpec("stale-test", plan, adaptive=True, stale=stale))
    try:
        sched, agents, tasks = await start_cluster(uniform(4), cluster="stale", probe=False)
        try:
            js = await asyncio.wait_for(sched.run_job("stale-test", rounds=8, params=40_000, chunk_params=4_000), 60)
            assert_job_exact(sched, js)
        finally:
            await stop_cluster(sched, tasks)
    finally:
        planners.SCHEMES.pop(spec.name)
    assert len(seen) == 2 and seen[0] == []  # the opening plan, then one re-plan the staleness asked for
    recorded = sorted(js.records, key=lambda r: r.round)
    assert [round(s, 9) for _, _, s in seen[1]] == [round(r.round_s, 9) for r in recorded[:len(seen[1])]]
    assert len(seen[1]) >= 3 and all(scheme == "ring" for _, scheme, _ in seen[1])


@pytest.mark.unit
def test_rounds_run_on_a_plan_made_from_nominal_guesses_teach_auto_nothing():
    """A decision on a view that knows none of the plan's links predicted from guesses: the rounds
    after it say nothing of the simulator, so no ratio is learned from them."""
    planner = auto.make(lambda: [planners.resolve("star"), planners.resolve("ring")])
    topo = hub()
    unknown = NetworkView(topo.links)  # every link at the nominal rate, none measured
    memory: dict = {}
    plan = planner(unknown, job(5), memory)
    decision(memory)
    for _ in range(auto.STALE_ROUNDS):
        measured(memory, plan.scheme, 10.0)
    planner(oracle_view(topo), job(5), memory)
    assert all(c["ratio"] == 1.0 for c in decision(memory)["candidates"])


@pytest.mark.unit
def test_auto_sees_node_caps_and_a_cap_that_moves_is_a_change_of_the_view():
    """Caps bind (every node's port at 100 Mbit/s on a mesh whose ring links run at 400): a tree
    packing that ignores ports loses, and auto, whose simulation takes the declared caps, does not run
    it; a declared cap that moves by more than the update rate is a change of the view, as a link's is."""
    from emulation.simnet import sim_network
    from emulation.topology import from_dict

    n = 6
    rates = [[0 if a == b else (400.0 if (b - a) % n in (1, n - 1) else 20.0) for b in range(n)] for a in range(n)]
    capped = from_dict({"nodes": n, "matrix": rates, "defaults": {"delay_ms": 0},
                        "caps": [{"node": k, "uplink_mbps": 100.0, "downlink_mbps": 100.0} for k in range(n)]})
    view = oracle_view(capped)
    plan = planners.resolve("auto").plan(view, job(n), memory := {})
    own = {}
    for s in ("packing", "ring"):  # worked out here: each on the capped network
        p = planners.resolve(s).plan(view, job(n, **planners.resolve(s).options))
        own[s] = simulate(p, sim_network(capped, None), costs=MEASURED).round_s
    assert own["ring"] < 0.5 * own["packing"]
    d = decision(memory)
    assert d["chosen"] != "packing" and plan.scheme != "packing"
    [chosen] = [c for c in d["candidates"] if c["scheme"] == d["chosen"]]
    assert chosen["round_s"] <= own["ring"] * (1 + 1e-9)
    before = view.snapshot()
    view.declare_cap(2, "up", 105.0)
    assert not view.changed_since(before, 0.1)
    view.declare_cap(2, "up", 200.0)
    assert view.changed_since(before, 0.1)


def replanning_job(*, planned_ago_s: float, replan_s: float, obs: object = None) -> tuple:
    """A BSP job past its first round whose adaptive planner solves off the loop, on a 5-node ring-ish
    view with loose declared uplinks, and its Versions; solves it starts are recorded, not run:
    (view, job state, versions, started)."""
    from scheduler.tasks import JobState
    from scheduler.versions import Versions

    view = oracle_view(ringish())
    for n in range(5):
        view.set_cap(n, "up", 10_000.0)
    ring_plan = planners.resolve("ring").plan(view, job(5))
    spec = planners.PlannerSpec("slow", lambda v, j, m: ring_plan, adaptive=True, offload=True)
    js = JobState(1, "slow", 10, job(5), ring_plan, 0, planner=spec, view_at_plan=view.snapshot(),
                  last_plan_t=time.time() - planned_ago_s, replan_s=replan_s)
    js.bsp_task(0), js.bsp_task(1)
    versions = Versions(view, registry=None, obs=obs, update_rate=0.1, update_time=0.0)  # type: ignore[arg-type]
    started: list = []
    versions._replan_off_loop = started.append  # type: ignore[method-assign]
    return view, js, versions, started


@pytest.mark.unit
def test_a_declared_port_that_moved_starts_a_re_plan_at_once_without_waiting_for_a_round():
    """A re-plan waits for twice the last off-loop solve (the solver's CPU share) and starts when a round
    asks for its version; a report that says a port moved starts it at once: the WAN changed (on the
    flipping trace a switch waited 3 s for the share and a 2-s round for its solve to begin)."""
    from scheduler.versions import PORT_SETTLE_S

    view, js, versions, started = replanning_job(planned_ago_s=1.0, replan_s=1.5)
    view.g.edges[0, 1]["rate"] *= 2  # an estimate moved: due only after 2 x 1.5 s
    versions.replan_early(js)
    assert started == []
    view.declare_cap(3, "up", 50.0)  # a port moved: at once, once the other ports' moves are in
    versions.replan_early(js)
    assert started == []  # ... which take up to a report period to arrive
    view.ports_moved.note(3, "up", time.time() - PORT_SETTLE_S)
    versions.replan_early(js)
    assert started == [js] and js.replans == 1
    versions.replan_early(js)  # ... once: the view is as the re-plan took it
    assert started == [js]
    js.mode = "tasks"  # formed tasks plan their own: nothing to start early
    view.declare_cap(3, "up", 10_000.0, now=time.time() - PORT_SETTLE_S)
    versions.replan_early(js)
    assert started == [js]


@pytest.mark.unit
def test_a_solve_that_a_port_move_overtook_is_dropped_and_the_next_starts_at_once():
    """A solve begun before a port moved planned on a WAN that is gone: when it ends it is not adopted
    (nothing left pending for the next round) and a new one starts, on the view with the move; a solve
    that no move overtook stays, to be adopted by the next round."""
    from scheduler.versions import PORT_SETTLE_S

    class Timeline:
        def __init__(self) -> None:
            self.events: list[str] = []

        def note_event(self, kind: str, **data: object) -> None:
            self.events.append(kind)

    timeline = Timeline()
    view, js, versions, started = replanning_job(planned_ago_s=5.0, replan_s=0.0, obs=timeline)
    ring_plan = js.plan
    loop = asyncio.new_event_loop()
    try:
        kept = js.replanning = loop.create_future()
        kept.set_result((ring_plan, {}, 0.1))
        versions._overtaken(js, kept)  # no port moved since it began
        assert js.replanning is kept and started == [] and timeline.events == []
        view.declare_cap(2, "up", 50.0, now=time.time() - PORT_SETTLE_S)  # moved after it began
        versions._overtaken(js, kept)
        assert started == [js] and js.replanning is None and timeline.events == ["replan_dropped"]
        assert js.last_plan_t > view.ports_moved.latest()  # the new solve began after the move
    finally:
        loop.close()
