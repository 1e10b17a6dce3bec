"""NetStorm's metric and planner on hand-checked cases."""

import random

import pytest

from core.plan import Job
from emulation.topology import internet2
from scheduler.metric import blockage, tree_delay
from scheduler.planners import netstorm
from scheduler.view import NetworkView

pytestmark = pytest.mark.unit


def test_fig_1c_balanced_tree_is_57_units():
    """The paper's toy: sub-trees of v2..v5 take 24, 20, 23, 7; their uplinks 24, 15, 18, 50."""
    parent = {1: None, 2: 1, 3: 1, 4: 1, 5: 1}
    w = {(2, 1): 24, (3, 1): 15, (4, 1): 18, (5, 1): 50}
    sub = {2: 24, 3: 20, 4: 23, 5: 7}  # one leaf below each, carrying the sub-tree's delay
    for v, d in sub.items():
        parent[10 + v] = v
        w[(10 + v, v)] = d
    delay, ready = tree_delay(parent, lambda c, p: w[(c, p)])
    assert delay == 57
    assert ready[2] == 24 and ready[5] == 7
    blk = blockage(parent, lambda c, p: w[(c, p)])
    assert blk[5] == 0  # the last child to arrive is never blocked (Theorem 1's proof)
    assert blk[3] == 57 - 35 and blk[2] == 57 - 48


def test_theorem_1_tree_delay_is_the_longest_leaf_path():
    rng = random.Random(3)
    for _ in range(50):
        n = rng.randint(2, 30)
        parent = {0: None} | {v: rng.randrange(v) for v in range(1, n)}
        w = {(v, p): rng.uniform(0.1, 5) for v, p in parent.items() if p is not None}
        delay, _ = tree_delay(parent, lambda c, p, w=w: w[(c, p)])
        longest = 0.0
        for leaf in parent:
            d, v = 0.0, leaf
            while parent[v] is not None:
                d, v = d + w[(v, parent[v])], parent[v]
            longest = max(longest, d)
        assert delay == pytest.approx(longest)


def measured_view(topo):
    view = NetworkView(topo.links)
    for (a, b), s in topo.links.items():
        view.observe(a, b, int(s.rate_mbps * 1e6 / 8), 1.0)
    return view


def test_fapt_is_the_shortest_path_tree_and_beats_every_other_root_choice():
    topo = internet2()
    view = measured_view(topo)
    trees = netstorm.fastest_trees(view, range(9))
    for r, (parent, w) in trees.items():
        assert parent[r] is None
        for n, p in parent.items():  # every tree edge is an overlay link, in the push direction
            assert p is None or (n, p) in topo.links
        delay, _ = tree_delay(parent, lambda c, p: 1.0 / view.rate(c, p))
        assert delay == pytest.approx(w)


def test_plan_allocates_parameters_by_quality_and_freezes_roots_once_measured():
    topo = internet2()
    view = measured_view(topo)
    state: dict = {}
    job = Job(1_000_000, 20_000, tuple(range(9)), {"roots": 3})
    plan = netstorm.plan(view, job, state).validate(topo.links)
    q = state["frozen"]["q"]
    roots = state["frozen"]["roots"]
    assert len(plan.groups) == 3 and {g.root for g in plan.groups} == set(roots)
    assert roots == sorted(q, key=lambda r: (-q[r], r))[:3]
    share = {g.root: sum(plan.layout[c][1] for c in g.chunks) / plan.params for g in plan.groups}
    for r in roots:  # shares follow q within one chunk
        assert share[r] == pytest.approx(q[r] / sum(q[x] for x in roots), abs=0.02 + 20_000 / 1_000_000)
    # the network changes: trees follow it, the frozen roots and shares stay
    for (a, b) in topo.links:
        view.observe(a, b, 10**6, 1.0 if (a + b) % 2 else 0.05)
    again = netstorm.plan(view, job, state)
    assert [g.root for g in again.groups] == [g.root for g in plan.groups]
    assert [g.chunks for g in again.groups] == [g.chunks for g in plan.groups]
    assert any(g1.parent != g2.parent for g1, g2 in zip(plan.groups, again.groups, strict=True))


def test_unmeasured_first_plan_is_not_frozen():
    state: dict = {}
    netstorm.plan(NetworkView(internet2().links), Job(10_000, 1000, tuple(range(9))), state)
    assert "frozen" not in state


def test_exploration_routes_cover_unmeasured_links_and_vanish_once_measured():
    topo = internet2()
    view = NetworkView(topo.links)
    for (a, b), s in topo.links.items():  # everything measured except the links around node 4
        if 4 not in (a, b):
            view.observe(a, b, int(s.rate_mbps * 1e6 / 8), 1.0)
    table = netstorm.with_exploration(view, range(9), {})
    used = {(u, v) for routes in table.values() for r in routes for u, v in zip(r, r[1:], strict=False)}
    unmeasured = {(a, b) for (a, b) in topo.links if 4 in (a, b)}
    assert unmeasured <= used
    for (a, b), routes in table.items():
        for r in routes:  # simple relay paths over links, from a to its neighbour b
            assert r[0] == a and r[-1] == b and len(set(r)) == len(r) >= 3 and (a, b) in topo.links
            assert all((u, v) in topo.links for u, v in zip(r, r[1:], strict=False))
    for a, b in unmeasured:
        view.observe(a, b, 10**6, 0.1)
    assert netstorm.with_exploration(view, range(9), {}) == {}
    plan = netstorm.plan(view, Job(100_000, 5_000, tuple(range(9)), {"aux": True}))
    plan.validate(topo.links)
