"""NetStorm's shares by quality: each root gets the chunks its quality earns, not equal shares.

Each test here fails if the check it names is removed or weakened (issue 12 found that such a
breakage passed the whole suite): it drives the real code path with inputs only that check can refuse,
and computes the right answer by itself, never through the product (own shortest paths on exact
fractions, own allocation).
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from core.plan import Job, make_layout
from scheduler.planners import netstorm
from scheduler.view import NetworkView

pytestmark = pytest.mark.unit

# --- NetStorm: shares proportional to quality ---------------------------------------------------------
# A hub (0) with fast links to every leaf, and one slow leaf-leaf link. By hand: T_0 has delay 1/100
# (q = 100); a leaf's tree waits for the other leaves' two hops through the hub, 2/100 (q = 50; the
# slow 1-2 link is never on a shortest path). Shares by quality are 0.4 / 0.2 / 0.2 / 0.2 (or 2/3 and
# 1/3 for two roots), far from equal shares.
HUB_RATES = {(0, 1): 100, (0, 2): 100, (0, 3): 100, (1, 2): 25}  # Mbit/s, both directions
NS_PARAMS, NS_CHUNK = 40_702, 1_000  # 41 chunks, the last one of 702: shares are counted in parameters


def hub_view() -> tuple[NetworkView, dict[tuple[int, int], int]]:
    rates = {**HUB_RATES, **{(b, a): r for (a, b), r in HUB_RATES.items()}}
    view = NetworkView(rates)
    for (a, b), mbps in rates.items():
        view.observe(a, b, mbps * 125_000, 1.0)  # one sample: exactly `mbps`
    return view, rates


def exact_quality(rates: dict[tuple[int, int], int], nodes: list[int]) -> dict[int, Fraction]:
    """q_r = 1 / w(T_r), w(T_r) the largest shortest-path delay toward r under w(e) = 1/rate(e)
    (Floyd-Warshall on exact fractions: independent of the planner's networkx Dijkstra)."""
    d = {(a, b): Fraction(0) if a == b else (Fraction(1, rates[(a, b)]) if (a, b) in rates else None)
         for a in nodes for b in nodes}
    for k in nodes:
        for i in nodes:
            for j in nodes:
                via = None if d[(i, k)] is None or d[(k, j)] is None else d[(i, k)] + d[(k, j)]
                if via is not None and (d[(i, j)] is None or via < d[(i, j)]):
                    d[(i, j)] = via
    return {r: 1 / max(d[(n, r)] for n in nodes) for r in nodes}  # type: ignore[type-var]  # all reachable


def paper_allocation(layout: tuple[tuple[int, int], ...], roots: list[int],
                     q: dict[int, Fraction]) -> dict[int, list[int]]:
    """Digest 002 §2.5, written out again: quota[r] = ceil(q_r / sum q * P) parameters, chunks handed
    out round-robin over the roots, skipping roots whose quota is filled."""
    total = sum(n for _, n in layout)
    qsum = sum(q[r] for r in roots)
    quota = {r: math.ceil(q[r] / qsum * total) for r in roots}
    filled = dict.fromkeys(roots, 0)
    owner: dict[int, list[int]] = {r: [] for r in roots}
    k = 0
    for c, (_, n) in enumerate(layout):
        while filled[roots[k % len(roots)]] >= quota[roots[k % len(roots)]]:
            k += 1
        r = roots[k % len(roots)]
        owner[r].append(c)
        filled[r] += n
        k += 1
    return owner


@pytest.mark.parametrize("n_roots", [4, 2])
def test_netstorm_gives_each_root_the_chunks_its_quality_earns(n_roots):
    view, rates = hub_view()
    q = exact_quality(rates, [0, 1, 2, 3])
    assert q == {0: 100, 1: 50, 2: 50, 3: 50}  # the hand computation above
    roots = sorted(q, key=lambda r: (-q[r], r))[:n_roots]
    layout = make_layout(NS_PARAMS, NS_CHUNK)
    # exact quotas are not integers, so the planner's float arithmetic cannot round them differently
    assert all((q[r] / sum(q[x] for x in roots) * NS_PARAMS).denominator != 1 for r in roots)
    want = paper_allocation(layout, roots, q)
    equal = paper_allocation(layout, roots, dict.fromkeys(roots, Fraction(1)))
    counts = {r: len(want[r]) for r in roots}
    # by hand for 4 roots: quotas 16281 / 8141 / 8141 / 8141; nine rounds of the round-robin fill the
    # leaves (9000 >= 8141), the five chunks left go to the hub: 14 / 9 / 9 / 9 (equal shares: 11 / 10 ...)
    assert counts == ({0: 14, 1: 9, 2: 9, 3: 9} if n_roots == 4 else {0: 27, 1: 14})
    assert counts != {r: len(equal[r]) for r in roots}  # the test can tell the two rules apart

    state: dict = {}
    plan = netstorm.plan(view, Job(NS_PARAMS, NS_CHUNK, (0, 1, 2, 3), {"roots": n_roots}), state)
    plan.validate(view.links())
    got = {g.root: list(g.chunks) for g in plan.groups}
    assert {r: len(c) for r, c in got.items()} == counts, "chunks per root do not follow q_r = 1/w(T_r)"
    assert got == want  # and which chunks: round-robin in model order
