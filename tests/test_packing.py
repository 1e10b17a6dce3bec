"""Tree packing (seed 001): the LP against bounds computed by hand and by brute force, the pricing
oracles against networkx and exhaustive search, the compiled plan (its chunks in proportion to the LP),
re-solving and the baselines' trees. Live runs over real TCP are in test_packing_live.py."""

from __future__ import annotations

import dataclasses
import itertools
import random

import networkx as nx
import numpy as np
import pytest
from helpers.topologies import line
from scipy.optimize import linprog

from core.plan import Job, PlanError
from emulation.gpumesh import gpumesh, gpunic
from emulation.link import LinkSpec
from emulation.topology import Topology, TopologyError, build, internet2, uniform
from scheduler.planners import resolve
from scheduler.planners.arborescence import INF, cost, depth, edmonds, shallow, steiner
from scheduler.planners.dbtree import btree, dtree
from scheduler.planners.machines import machines_of
from scheduler.planners.packing import achieved, pair_trees
from scheduler.planners.packing_lp import Tree, min_cut, pack
from scheduler.service import replan_due
from scheduler.view import NetworkView
from wansync.planinfo import info_line
from wansync.predict import oracle_view

PARAMS, CHUNK = 96_000, 8_000


def capacity(topo: Topology) -> dict[tuple[int, int], float]:
    return {k: v.rate_mbps for k, v in topo.links.items()}


def cut_bound(cap: dict[tuple[int, int], float], nodes: list[int]) -> float:
    """λ by brute force over every subset: the smallest capacity into a set that misses some node."""
    best = float("inf")
    for k in range(1, len(nodes)):
        for side in itertools.combinations(nodes, k):
            s = set(side)
            best = min(best, sum(b for (u, v), b in cap.items() if u not in s and v in s))
    return best


# --- the LP against bounds known by hand ------------------------------------------------------------------
@pytest.mark.unit
def test_a_uniform_full_mesh_packs_one_star_per_root_at_half_the_rate_each():
    """K_N at rate b: each unit of χ needs a reduce and a broadcast spanning tree (2(N-1) link-units) and
    there are N(N-1)b of them, so Σχ = N b / 2, reached by in- and out-stars (each link carries the
    reduce star of its head and the broadcast star of its tail)."""
    pk = pack(capacity(uniform(5, 40.0)), range(5))
    assert pk.sum_chi == pytest.approx(5 * 40.0 / 2, rel=1e-6)
    # of the many optimal packings, the shallowest: stars (every tree one level deep)
    assert all(p == t.root or p is None for side in (pk.reduce, pk.broadcast) for ts in side.values() for t in ts
               for p in t.parent.values())
    assert pk.lam == pytest.approx(4 * 40.0)  # one node's in-links
    assert pk.gap_pct <= 0.01 and pk.round_time_s(100.0) == pytest.approx(100.0 / pk.sum_chi)


@pytest.mark.unit
def test_a_line_packs_its_slowest_link():
    """A path has one spanning tree per root, and every directed link carries every root's χ once."""
    topo = line(4, rate=50.0)
    links = dict(topo.links)
    links[(2, 1)] = LinkSpec(17.0)
    pk = pack(capacity(dataclasses.replace(topo, links=links)), range(4))
    assert pk.sum_chi == pytest.approx(17.0, rel=1e-6) == pk.lam


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(5))
def test_internet2_packs_up_to_its_smallest_directed_cut(seed):
    """The issue's finding on all five seeds: Σχ = λ, λ found here by brute force over subsets."""
    cap = capacity(internet2(seed=seed))
    pk = pack(cap, range(9))
    assert pk.lam == pytest.approx(cut_bound(cap, list(range(9))))
    assert pk.sum_chi == pytest.approx(pk.lam, rel=1e-6) and pk.sum_chi_lp == pytest.approx(pk.lam, rel=1e-6)


@pytest.mark.unit
@pytest.mark.parametrize("m, g, inter", [(2, 2, 10.0), (2, 3, 25.0), (4, 4, 10.0)])
def test_a_gpu_mesh_packs_to_the_digests_closed_form(m, g, inter):
    """M machines x G GPUs, B_in inside, B_out between: a spanning tree has N-1 edges of which at least
    M-1 cross machines, so (χ counting one tree per stage, overlapped) Σχ <= min((I+X)/(2(N-1)),
    X/(2(M-1))) with I = M G (G-1) B_in, X = N (N-G) B_out; the packing reaches it."""
    n, b_in, b_out = m * g, 100_000.0, inter * 1000.0
    i, x = m * g * (g - 1) * b_in, n * (n - g) * b_out
    pk = pack(capacity(gpumesh(m, g, inter)), range(n))
    assert pk.sum_chi_lp == pytest.approx(min((i + x) / (2 * (n - 1)), x / (2 * (m - 1))), rel=1e-3)


@pytest.mark.unit
def test_no_overlap_gives_each_stage_the_whole_link():
    """Digest LP (4): reduce and broadcast trees each within capacity, T = 2 S / Σχ; on K_N Σχ = N b."""
    pk = pack(capacity(uniform(4, 30.0)), range(4), overlap=False)
    assert pk.sum_chi == pytest.approx(4 * 30.0, rel=1e-6) and not pk.overlap
    assert pk.round_time_s(60.0) == pytest.approx(2 * 60.0 / pk.sum_chi)


def _all_arborescences(n: int, edges: list[tuple[int, int]], root: int, into: bool) -> list[frozenset]:
    """Every spanning arborescence of a tiny graph (out of `root`, or into it), as edge sets."""
    out = []
    for combo in itertools.combinations(edges, n - 1):
        g = nx.DiGraph(combo)
        g.add_nodes_from(range(n))
        h = g.reverse() if into else g
        if all(h.in_degree(x) == (0 if x == root else 1) for x in range(n)) and nx.is_arborescence(h):
            out.append(frozenset(combo))
    return out


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(3))
def test_column_generation_reaches_the_lp_over_every_tree(seed):
    """On 4 nodes every arborescence can be listed: the full LP (linprog over all of them) and column
    generation agree on Σχ."""
    rng = random.Random(seed)
    n = 4
    cap = {(a, b): float(rng.randint(5, 50)) for a in range(n) for b in range(n) if a != b and rng.random() < 0.8}
    for a in range(n):  # keep it strongly connected: a ring both ways
        cap.setdefault((a, (a + 1) % n), 7.0)
        cap.setdefault(((a + 1) % n, a), 7.0)
    edges = sorted(cap)
    cols = [(v, role, t) for v in range(n) for role, into in ((0, True), (1, False))
            for t in _all_arborescences(n, edges, v, into)]
    k = len(cols)
    # variables: one weight per tree, then χ per root; maximize Σχ
    c = np.concatenate([np.zeros(k), -np.ones(n)])
    a_ub = np.zeros((len(edges), k + n))
    for j, (_, _, t) in enumerate(cols):
        for e in t:
            a_ub[edges.index(e), j] = 1.0
    a_eq = np.zeros((2 * n, k + n))
    for j, (v, role, _) in enumerate(cols):
        a_eq[2 * v + role, j] = 1.0
    for v in range(n):
        a_eq[2 * v, k + v] = a_eq[2 * v + 1, k + v] = -1.0
    res = linprog(c, A_ub=a_ub, b_ub=[cap[e] for e in edges], A_eq=a_eq, b_eq=np.zeros(2 * n), method="highs")
    assert res.status == 0
    assert pack(cap, range(n), max_trees_per_root=None).sum_chi_lp == pytest.approx(-res.fun, rel=1e-5)


@pytest.mark.unit
def test_a_packing_never_overloads_a_link_and_balances_each_roots_stages():
    pk = pack(capacity(build("hetero", nodes=7, seed=3)), range(7), max_trees_per_root=3)
    cap = capacity(build("hetero", nodes=7, seed=3))
    load = dict.fromkeys(cap, 0.0)
    for role, side in (("reduce", pk.reduce), ("broadcast", pk.broadcast)):
        for trees in side.values():
            for t in trees:
                for e in t.edges(role):
                    load[e] += t.weight
    assert all(load[e] <= cap[e] * (1 + 1e-9) for e in cap)
    for v in pk.chi:
        assert sum(t.weight for t in pk.reduce[v]) == pytest.approx(pk.chi[v])
        assert sum(t.weight for t in pk.broadcast[v]) == pytest.approx(pk.chi[v])
    assert pk.sum_chi <= pk.sum_chi_lp * (1 + 1e-9) and all(len(ts) <= 3 for ts in pk.reduce.values())


@pytest.mark.unit
def test_relays_let_inactive_nodes_carry_more_than_the_active_ones_links():
    """Two active nodes joined by a 10 Mbit/s link and a two-hop path through an inactive node at
    40: each direction carries one root's broadcast and the other's reduce, χ0 + χ1 <= 10 + 40 with
    the relay, <= 10 without."""
    cap = {(0, 1): 10.0, (1, 0): 10.0, (0, 2): 40.0, (2, 0): 40.0, (2, 1): 40.0, (1, 2): 40.0}
    assert pack(cap, [0, 1]).sum_chi == pytest.approx(50.0, rel=1e-6)
    assert pack({k: v for k, v in cap.items() if 2 not in k}, [0, 1]).sum_chi == pytest.approx(10.0, rel=1e-6)


@pytest.mark.unit
def test_roots_narrow_who_owns_parameters():
    pk = pack(capacity(uniform(4, 30.0)), range(4), overlap=False, roots=[2])
    # one root's spanning arborescences on K4: as many as its smallest cut, 3 links of 30 (Edmonds)
    assert set(v for v, x in pk.chi.items() if x > 0) == {2} and pk.sum_chi == pytest.approx(90.0, rel=1e-6)


@pytest.mark.unit
@pytest.mark.parametrize("cap, active, kw, message", [
    ({(0, 1): 5.0, (1, 0): 5.0}, [0], {}, "at least two active nodes"),
    ({(0, 1): 5.0, (1, 0): 5.0, (2, 3): 5.0, (3, 2): 5.0}, [0, 2], {}, "not strongly connected"),
    ({(0, 1): 5.0, (1, 0): 0.0}, [0, 1], {}, "capacity 0.0"),
    ({(0, 1): 5.0, (1, 0): float("nan")}, [0, 1], {}, "capacity nan"),
    ({(0, 1): 5.0, (1, 0): 5.0}, [0, 1], {"roots": [7]}, "subset of the active nodes"),
])
def test_impossible_inputs_are_refused_naming_the_reason(cap, active, kw, message):
    with pytest.raises(ValueError, match=message):
        pack(cap, active, **kw)


# --- the oracles ----------------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("seed", range(20))
def test_edmonds_finds_networkx_minimum_arborescence(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 12))
    w = np.where(rng.random((n, n)) < 0.6, rng.random((n, n)), INF)
    np.fill_diagonal(w, INF)
    for a in range(n):  # a Hamiltonian cycle keeps every node reachable from the root
        w[a, (a + 1) % n] = min(w[a, (a + 1) % n], rng.random())
    root = int(rng.integers(n))
    parent = edmonds(w, root)
    assert parent is not None and parent[root] == -1 and (parent >= 0).sum() == n - 1
    g = nx.DiGraph()
    for u in range(n):
        for x in range(n):
            if np.isfinite(w[u, x]) and x != root:
                g.add_edge(u, x, weight=float(w[u, x]))
    best = nx.minimum_spanning_arborescence(g, attr="weight")
    assert cost(w, parent) == pytest.approx(best.size(weight="weight"))


@pytest.mark.unit
def test_depth_limited_trees_keep_their_levels_and_say_when_they_cannot_reach():
    rng = np.random.default_rng(7)
    w = rng.random((7, 7))
    np.fill_diagonal(w, INF)
    for h in (1, 2, 3):
        parent = shallow(w, 2, h)
        assert parent is not None and parent[2] == -1 and (parent >= 0).sum() == 6 and depth(parent) <= h
    assert depth(shallow(w, 0, 1)) == 1 and shallow(w, 0, 1)[1:].tolist() == [0] * 6
    line3 = np.full((3, 3), INF)
    line3[0, 1] = line3[1, 2] = 1.0
    assert shallow(line3, 0, 1) is None and depth(shallow(line3, 0, 2)) == 2
    assert depth(np.array([-1, 0, 1, 2])) == 3 and depth(np.array([-1])) == 0


@pytest.mark.unit
def test_edmonds_says_when_no_arborescence_exists():
    w = np.full((3, 3), INF)
    w[0, 1] = 1.0
    assert edmonds(w, 0) is None


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(10))
def test_the_steiner_heuristic_spans_the_terminals_and_is_near_the_exhaustive_optimum(seed):
    """On 6 nodes, 3 terminals: a valid arborescence (rooted, spanning the terminals, no useless leaf),
    at most 1.5 x the cheapest one found by trying every node subset with exact Edmonds."""
    rng = np.random.default_rng(100 + seed)
    n = 6
    w = np.where(rng.random((n, n)) < 0.7, 1 + 9 * rng.random((n, n)), INF)
    np.fill_diagonal(w, INF)
    for a in range(n):
        w[a, (a + 1) % n] = min(w[a, (a + 1) % n], 5.0)
    terminals = np.array([0, 2, 4])
    parent = steiner(w, 0, terminals)
    assert parent is not None and parent[0] == -1
    inside = {0} | set(np.flatnonzero(parent >= 0).tolist())
    assert {2, 4} <= inside
    for x in inside - {0}:  # every tree node reaches the root
        y, hops = x, 0
        while y != 0 and hops <= n:
            y, hops = int(parent[y]), hops + 1
        assert y == 0
    leaves = inside - set(parent[parent >= 0].tolist())
    assert leaves <= {2, 4}
    best = INF
    for extra in itertools.chain.from_iterable(itertools.combinations([1, 3, 5], k) for k in range(4)):
        nodes = np.array(sorted({0, 2, 4, *extra}))
        sub = edmonds(w[np.ix_(nodes, nodes)], 0)
        if sub is not None:
            best = min(best, cost(w[np.ix_(nodes, nodes)], sub))
    assert cost(w, parent) <= 1.5 * best


# --- the plan ---------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_pairing_cuts_each_roots_range_into_pieces_of_both_sides():
    r = [Tree(0, {0: None}, 3.0), Tree(0, {0: None}, 1.0)]
    b = [Tree(0, {0: None}, 2.0), Tree(0, {0: None}, 2.0)]
    pairs = pair_trees(r, b)
    assert [a for *_, a in pairs] == pytest.approx([2.0, 1.0, 1.0])
    assert pairs[0][0] is r[0] and pairs[1][0] is r[0] and pairs[2][0] is r[1]


@pytest.mark.unit
def test_the_plan_validates_gives_chunks_in_proportion_and_reports_the_lp():
    topo = internet2(seed=1)
    # one LP solve: which of several equal optima the simulator picks is the variants tests' business
    plan = resolve("packing").plan(oracle_view(topo), Job(PARAMS, CHUNK, tuple(range(9)), {"variants": 1}))
    plan.with_version(1).validate(topo.links)
    info = plan.info
    assert info["sum_chi"] == pytest.approx(86.0) and info["lambda"] == pytest.approx(86.0)
    assert info["t_lp_s"] == pytest.approx(PARAMS * 32 / 86e6)
    per_group = [sum(plan.layout[c][1] for c in g.chunks) for g in plan.groups]
    total_w = sum(g.weight for g in plan.groups)
    assert sum(per_group) == PARAMS
    for n, g in zip(per_group, plan.groups, strict=True):
        assert n == pytest.approx(PARAMS * g.weight / total_w, abs=1)  # largest-remainder rounding
        assert g.own_class and len(g.chunks) >= min(10, n // 1024)  # pipelined (fill 0.1), or chunks at their floor
    line_ = info_line("packing", info)
    assert line_ is not None and "T_LP" in line_ and "lambda 86.0" in line_
    assert info_line("mst", {}) is None


@pytest.mark.unit
def test_links_not_measured_yet_count_at_the_median_of_those_measured():
    """A WAN much slower than the nominal guess: once some links are known, the others are taken at
    their median, not at the nominal 100 Mbit/s (Σχ on the view says which was used)."""
    view = NetworkView(uniform(4).links)
    for a, b in [(0, 1), (1, 0), (1, 2), (2, 1), (2, 3)]:
        for _ in range(3):
            view.observe(a, b, 125_000, 0.1)  # 10 Mbit/s
    assert view.known(0, 1) and not view.known(0, 3)
    plan = resolve("packing").plan(view, Job(PARAMS, CHUNK, (0, 1, 2, 3)))
    assert plan.info["sum_chi"] == pytest.approx(4 * 10.0 / 2, rel=1e-6)  # every link at 10: K4 packs N b / 2
    fresh = resolve("packing").plan(NetworkView(uniform(4).links), Job(PARAMS, CHUNK, (0, 1, 2, 3)))
    assert fresh.info["sum_chi"] == pytest.approx(4 * NetworkView(()).nominal / 2, rel=1e-6)


@pytest.mark.unit
def test_what_a_packing_still_gets_when_the_rates_move():
    """Its trees' weights scale with the tightest link they load: all rates doubled, twice the Σχ; one
    loaded link halved, at most half; a link gone, nothing."""
    cap = capacity(uniform(4, 40.0))
    pk = pack(cap, range(4))
    assert achieved(pk, cap) == pytest.approx(pk.sum_chi, rel=1e-6)
    assert achieved(pk, {e: 2 * r for e, r in cap.items()}) == pytest.approx(2 * pk.sum_chi, rel=1e-6)
    assert achieved(pk, {**cap, (0, 1): 20.0}) <= pk.sum_chi / 2 + 1e-6
    assert achieved(pk, {e: r for e, r in cap.items() if e != (0, 1)}) == 0.0


@pytest.mark.unit
def test_a_re_solve_keeps_the_current_packing_unless_it_gains_min_gain():
    """Measurement noise (every rate moved by up to 4 %) re-solves to a different packing, but not one
    worth a new version: the job's memory hands back the current plan. A link the trees need halved
    is worth one, as is the noise with min_gain 0."""
    topo = build("hetero", nodes=6, seed=3)
    job = Job(PARAMS, CHUNK, tuple(range(6)))
    rng = random.Random(7)
    noisy = topo.with_rates({k: v.rate_mbps * rng.uniform(0.96, 1.04) for k, v in topo.links.items()})
    memory: dict = {}
    first = resolve("packing").plan(oracle_view(topo), job, memory)
    assert not resolve("packing").plan(oracle_view(noisy), job, {}).same_policy(first)
    assert resolve("packing").plan(oracle_view(noisy), job, memory).same_policy(first)
    eager = {"packing": memory["packing"]}
    assert not resolve("packing").plan(oracle_view(noisy), dataclasses.replace(job, options={"min_gain": 0.0}),
                                       eager).same_policy(first)
    busiest = max(topo.links, key=lambda e: sum(t.weight for r in ("reduce", "broadcast")
                                                for ts in getattr(memory["packing"][0], r).values()
                                                for t in ts if e in t.edges(r)))
    slow = topo.with_rates({k: v.rate_mbps / (2 if k == busiest else 1) for k, v in topo.links.items()})
    moved = resolve("packing").plan(oracle_view(slow), job, memory)
    assert not moved.same_policy(first) and memory["packing"][1] is moved


@pytest.mark.unit
def test_a_slow_solver_re_plans_less_often():
    """Not before UPDATE_TIME, nor before ten times the last solve (REPLAN_CPU_SHARE)."""
    assert replan_due(0.3, 0.25, 0.0) and not replan_due(0.2, 0.25, 0.0)
    assert not replan_due(0.3, 0.25, 0.5) and replan_due(5.0, 0.25, 0.5)
    assert not replan_due(0.9, 0.25, 0.5, share=0.5) and replan_due(1.0, 0.25, 0.5, share=0.5)  # niced solves


@pytest.mark.unit
@pytest.mark.parametrize("opts, message", [
    ({"fill": 0.0}, "fill"), ({"fill": 1.5}, "fill"), ({"min_chunk_params": 0}, "min_chunk_params"),
    ({"relays": [99]}, "not nodes the view knows"), ({"relays": 5}, "relays must be"),
    ({"min_gain": -0.1}, "min_gain"), ({"variants": 0}, "variants"), ({"variants": 2.5}, "variants"),
    ({"variants": True}, "variants"),
])
def test_bad_options_are_refused_naming_them(opts, message):
    with pytest.raises((ValueError, PlanError), match=message):
        resolve("packing").plan(oracle_view(uniform(4)), Job(PARAMS, CHUNK, (0, 1, 2, 3), opts))


# --- baselines --------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_nccl_double_binary_trees():
    """NCCL's btree on 8 ranks; both trees span every rank from one root; with an even count the
    shifted twin's inner ranks are the first tree's leaves."""
    assert [btree(r, 8) for r in range(8)] == [None, 2, 4, 2, 0, 6, 4, 6]
    for n in (2, 4, 5, 8, 9, 16):
        p1 = [btree(r, n) for r in range(n)]
        p2 = [dtree(r, n) for r in range(n)]
        for p in (p1, p2):
            g = nx.DiGraph((r, x) for r, x in enumerate(p) if x is not None)
            g.add_nodes_from(range(n))
            assert sum(x is None for x in p) == 1 and nx.is_arborescence(g.reverse())
        inner1 = {x for x in p1 if x is not None}
        inner2 = {x for x in p2 if x is not None}
        assert n % 2 or not inner1 & inner2


@pytest.mark.unit
def test_machines_come_from_the_option_or_the_fastest_cliques():
    view = oracle_view(gpumesh(2, 3, 10.0))
    assert machines_of(view, Job(PARAMS, CHUNK, tuple(range(6)))) == [[0, 1, 2], [3, 4, 5]]
    assert machines_of(oracle_view(internet2()), Job(PARAMS, CHUNK, tuple(range(9)))) == [[n] for n in range(9)]
    assert machines_of(view, Job(PARAMS, CHUNK, (0, 1, 3), {"machines": [[0, 1, 2], [3, 4, 5]]})) == [[0, 1], [3]]
    with pytest.raises(ValueError, match="more than one machine"):
        machines_of(view, Job(PARAMS, CHUNK, (0, 1), {"machines": [[0, 1], [1]]}))
    with pytest.raises(ValueError, match="in no machine"):
        machines_of(view, Job(PARAMS, CHUNK, (0, 4), {"machines": [[0, 1]]}))



@pytest.mark.unit
def test_gpu_topologies():
    mesh = build("gpumesh:2x4:inter=25")
    assert mesh.nodes == 8 and mesh.links[(0, 1)].rate_mbps == 100_000 and mesh.links[(0, 4)].rate_mbps == 25_000
    nic = gpunic(2, 4, 40.0)
    assert nic.nodes == 10 and (0, 4) not in nic.links and nic.links[(8, 9)].rate_mbps == 40_000
    pk = pack(capacity(nic), range(8))  # NICs relay: 8 GPUs' trees must cross one 40 Gbit/s NIC pair
    assert pk.sum_chi <= min_cut(capacity(nic), range(8)) * (1 + 1e-9)
    for bad in ("gpumesh:4", "gpumesh:2x2:inter=0", "gpunic:1x1", "gpumesh:2x2:speed=1"):
        with pytest.raises(TopologyError):
            build(bad)


@pytest.mark.unit
@pytest.mark.parametrize("spec,nodes,seed", [("internet2", None, 1), ("hetero:20-155:x=0.3", 8, 3),
                                             ("hetero", 6, 5), ("crew:8", None, 1)])
def test_blinks_root_search_ends_at_the_first_root_as_wide_as_every_roots_best(spec, nodes, seed, monkeypatch):
    """Every root's packing is at most λ (Edmonds), here computed by brute force over cuts; trying every
    root finds nothing wider than the first that reaches it, the best-connected member."""
    from scheduler.planners import blink
    from scheduler.planners.common import best_hub
    topo = build(spec, nodes, seed=seed)
    view = oracle_view(topo)
    members = list(range(topo.nodes))
    cap = {k: view.rate(*k) for k in view.links()}
    every = [blink._packed(view, members, r) for r in members]
    widest_of_all = max(pk.sum_chi for pk in every)
    assert widest_of_all <= cut_bound(cap, members) * (1 + 1e-9)
    calls = []
    real = blink._packed
    monkeypatch.setattr(blink, "_packed", lambda v, m, r: calls.append(r) or real(v, m, r))
    plan = blink.plan(view, Job(PARAMS, CHUNK, tuple(members), {}))
    assert plan.scheme == "blink" and calls == [best_hub(view, members)]
    assert blink.widest(view, members, members).sum_chi >= widest_of_all * (1 - 1e-6)


@pytest.mark.unit
def test_blinks_root_search_takes_the_widest_and_the_first_of_equals(monkeypatch):
    from scheduler.planners import blink

    def search(widths: list[float], lam: float = 100.0) -> tuple[int, list[int]]:
        calls: list[int] = []

        def packed(view, members, r):
            calls.append(r)
            return dataclasses.make_dataclass("P", ["sum_chi", "lam", "root"])(widths[r], lam, r)
        monkeypatch.setattr(blink, "_packed", packed)
        return blink.widest(None, [], list(range(len(widths)))).root, calls

    assert search([90.0, 100.0, 95.0]) == (1, [0, 1])  # on until one reaches λ
    assert search([90.0, 95.0, 93.0]) == (1, [0, 1, 2])  # none does: every root, the widest
    assert search([95.0, 95.0, 93.0]) == (0, [0, 1, 2])  # the first of equals
    assert search([100.0, 100.0]) == (0, [0])


# --- variants: of the LP's near-equal optima, the one the simulator predicts fastest ------------------------
def _noisy_internet2(seed: int) -> tuple[Topology, NetworkView]:
    """internet2 at resnet50 x 0.05's scale, its rates as a view measures them (3 % noise), its agents
    on one 2-CPU machine (cpufit cuts the chunks)."""
    topo = internet2(seed=1).scaled(0.05)
    rng = random.Random(seed)
    view = oracle_view(topo.with_rates({k: v.rate_mbps * rng.gauss(1.0, 0.03) for k, v in topo.links.items()}))
    view.share_machine(range(topo.nodes), 2)
    return topo, view


VARIANT_JOB = Job(1_280_000, 50_000, tuple(range(9)))


@pytest.fixture
def unhurried(monkeypatch):
    """The variant search's time budget out of the way: a loaded core must not cut a test's search short."""
    from scheduler.planners import packing as packing_mod

    monkeypatch.setattr(packing_mod, "VARIANT_BUDGET_S", 600.0)


@pytest.mark.unit
def test_the_variant_that_runs_is_faster_than_the_first_solve_by_our_own_simulation(unhurried):
    """On a noisy view where the first LP vertex pipelines badly, the plan run is another variant,
    and simulated here on the WAN itself (not the view) it is faster than the first solve's plan."""
    from emulation.simnet import sim_network
    from sim import MEASURED, simulate

    topo, view = _noisy_internet2(5)
    net = sim_network(topo, None)
    first = resolve("packing").plan(view, dataclasses.replace(VARIANT_JOB, options={"variants": 1}))
    chosen = resolve("packing").plan(view, VARIANT_JOB)
    assert "variant" not in first.info and chosen.info["variant"] != 0
    predicted = chosen.info["variants_round_s"]
    assert len(predicted) == 3 and predicted[chosen.info["variant"]] == min(p for p in predicted if p is not None)
    assert simulate(chosen, net, costs=MEASURED).round_s < 0.97 * simulate(first, net, costs=MEASURED).round_s


@pytest.mark.unit
def test_a_variant_solved_on_jittered_rates_is_scaled_to_fit_the_real_ones(unhurried):
    """Its trees never load a link past the view's rate, its T_LP is its own rate's, and the LP optimum
    it reports is the real rates' (never the jittered ones')."""
    _, view = _noisy_internet2(5)
    plan = resolve("packing").plan(view, VARIANT_JOB)
    load: dict[tuple[int, int], float] = {}
    for g in plan.groups:
        edges = [(c, p) for c, p in g.parent.items() if p is not None]
        edges += [(p, k) for p, kids in g.children.items() for k in kids]
        for e in edges:
            load[e] = load.get(e, 0.0) + g.weight
    assert all(w <= view.rate(*e) * (1 + 1e-6) for e, w in load.items())
    first = pack({ln: view.rate(*ln) for ln in view.links()}, range(9))
    assert plan.info["sum_chi_lp"] == pytest.approx(first.sum_chi_lp, rel=1e-6)
    assert plan.info["sum_chi"] <= first.sum_chi_lp * (1 + 1e-6)
    assert plan.info["t_lp_s"] == pytest.approx(VARIANT_JOB.params * 32 / (plan.info["sum_chi"] * 1e6))


@pytest.mark.unit
def test_the_variant_search_stops_at_its_budget(monkeypatch):
    """Past VARIANT_BUDGET_S no further variant is solved: the first alone is compared, and runs."""
    from scheduler.planners import packing as packing_mod

    _, view = _noisy_internet2(5)
    monkeypatch.setattr(packing_mod, "VARIANT_BUDGET_S", 0.0)
    plan = resolve("packing").plan(view, VARIANT_JOB)
    assert plan.info["variant"] == 0 and len(plan.info["variants_round_s"]) == 1


@pytest.mark.unit
def test_a_job_searches_once_and_only_on_measured_rates(unhurried):
    """On nominal guesses no variant is compared; the first packing on measured rates is searched, and
    a re-solve on rates that moved later is published as solved (its switch is worth most early)."""
    topo, view = _noisy_internet2(5)
    memory: dict = {}
    guess = NetworkView(topo.links)
    guess.share_machine(range(topo.nodes), 2)
    assert "variants_round_s" not in resolve("packing").plan(guess, VARIANT_JOB, memory).info
    first = resolve("packing").plan(view, VARIANT_JOB, memory)
    assert len(first.info["variants_round_s"]) == 3
    halved = oracle_view(topo.with_rates({k: v.rate_mbps / (2 if k[0] in (0, 1) else 1)
                                          for k, v in topo.links.items()}))
    halved.share_machine(range(topo.nodes), 2)
    moved = resolve("packing").plan(halved, VARIANT_JOB, memory)
    assert not moved.same_policy(first) and "variants_round_s" not in moved.info
