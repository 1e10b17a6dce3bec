"""CREW (seed 004), its plans: LP (2) in closed form against HiGHS, Algorithms 1 and 2, Eq. (3), the
planner and its flow scheduling on the data plane's traffic classes (the classes a block's chunks carry,
on one engine over an in-memory wire), all-to-all groups, and every check refusing bad input, naming
what is wrong."""

import dataclasses
import re

import numpy as np
import pytest
from helpers.wire import RecordingWire as _Wire
from scipy.optimize import linprog

from agents.engine import ChunkEngine
from agents.workload import contribution
from core.classes import TrafficClass
from core.plan import Job, Plan, PlanError, direct_group, make_layout
from emulation.topology import build, uniform
from overlay.routing import Routes
from scheduler.planners import crew
from scheduler.planners.crew_split import assign, bounds, rearrange, replacement, solve_ed, solve_na, split
from scheduler.progress.crew import CrewQueue
from scheduler.view import NetworkView
from sim import TaskRun, make_network
from sim.stepped import NotOneHop, Stepped
from wansync.predict import oracle_view

pytestmark = pytest.mark.unit


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
