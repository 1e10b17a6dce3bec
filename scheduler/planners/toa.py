"""ToA (TopoAdopt, a CREW baseline): spanning trees over the group and the share of the model each carries,
found by simulated annealing (Luo et al., ENAT 2023, extended to all-reduce as the CREW paper does).

State: `trees` spanning trees over the members with weights summing to 1. A tree reduces to its
centre and broadcasts back on the same edges, so every tree edge {u, v} carries its tree's share of
the model once in each direction. Objective: the completion estimate max over directed links of
(sum of the shares of the trees using it) / bandwidth, in model units. Moves: swap an edge of a tree
(cut one, reconnect the two sides by another member pair), or shift weight from one tree to another;
geometric cooling; seeded by the group, so a group always gets the same plan. The paper gives no
parameters: ours are `trees` (default 3), `iterations` (default 2000), `cooling` (default 0.997).
The plan's `info` has the objective (seconds on the view's rates) and the annealing's iterations.
"""

from __future__ import annotations

import math
import random
from typing import Any

import networkx as nx

from core.plan import Job, Plan, make_layout, tree_group

from ..view import NetworkView
from .crew_split import assign

TREES, ITERATIONS, COOLING = 3, 2000, 0.997
MBIT_BYTES = 1e6 / 8

Edge = tuple[int, int]


def plan(view: NetworkView, job: Job) -> Plan:
    members = sorted(job.participants)
    view.require_connected(members)
    layout = make_layout(job.params, job.chunk_params)
    if len(members) == 1:
        return Plan(0, "toa", (members[0],), {members[0]: 1.0}, layout,
                    (tree_group(range(len(layout)), members[0], {members[0]: None}),))
    opts = job.options

    def bw(a: int, b: int) -> float:
        return view.rate(a, b) * MBIT_BYTES if view.g.has_edge(a, b) else 0.0
    trees, weights, cost, iters = anneal(members, bw, int(opts.get("trees", TREES)),
                                         int(opts.get("iterations", ITERATIONS)), float(opts.get("cooling", COOLING)),
                                         random.Random(",".join(map(str, members))))
    chunks = assign(weights, len(layout))
    groups = []
    for edges, mine in zip(trees, chunks, strict=True):
        if mine:
            root, parent = _rooted(members, edges)
            groups.append(tree_group(mine, root, parent))
    info: dict[str, Any] = {"objective_s": cost * job.params * 4, "trees": len(groups), "iterations": iters,
                            "weights": [round(w, 4) for w in weights]}
    return Plan(0, "toa", tuple(members), {m: 1.0 for m in members}, layout, tuple(groups), info=info)


def objective(trees: list[frozenset[Edge]], weights: list[float], bw: Any) -> float:
    """max over directed links of the shares crossing it / its bandwidth (inf over a dead link)."""
    load: dict[Edge, float] = {}
    for edges, w in zip(trees, weights, strict=True):
        for u, v in edges:
            load[(u, v)] = load.get((u, v), 0.0) + w
            load[(v, u)] = load.get((v, u), 0.0) + w
    worst = 0.0
    for (u, v), w in load.items():
        if w > 0:
            b = bw(u, v)
            worst = max(worst, math.inf if b <= 0 else w / b)
    return worst


def anneal(members: list[int], bw: Any, ntrees: int, iterations: int, cooling: float, rng: random.Random
           ) -> tuple[list[frozenset[Edge]], list[float], float, int]:
    """Simulated annealing over (trees, weights); returns the best state seen, its cost, iterations."""
    g = nx.Graph()
    for a in members:
        for b in members:
            if a < b:
                g.add_edge(a, b, w=min(bw(a, b), bw(b, a)))
    first = frozenset(tuple(sorted(e)) for e in nx.maximum_spanning_tree(g, weight="w").edges())
    trees = [first] + [_random_tree(members, rng) for _ in range(max(1, ntrees) - 1)]
    weights = [1.0 / len(trees)] * len(trees)
    cost = objective(trees, weights, bw)
    best = (list(trees), list(weights), cost)
    temp = cost * 0.1 if math.isfinite(cost) else 1.0
    for _ in range(iterations):
        nt, nw = list(trees), list(weights)
        if len(trees) > 1 and rng.random() < 0.4:  # shift weight
            i, j = rng.sample(range(len(trees)), 2)
            d = rng.uniform(0, nw[i])
            nw[i] -= d
            nw[j] += d
        else:
            i = rng.randrange(len(trees))
            nt[i] = _swap_edge(members, nt[i], rng)
        new = objective(nt, nw, bw)
        if new <= cost or (math.isfinite(new) and rng.random() < math.exp(-(new - cost) / max(temp, 1e-15))):
            trees, weights, cost = nt, nw, new
            if cost < best[2]:
                best = (list(trees), list(weights), cost)
        temp *= cooling
    return best[0], best[1], best[2], iterations


def _random_tree(members: list[int], rng: random.Random) -> frozenset[Edge]:
    order = list(members)
    rng.shuffle(order)
    return frozenset(tuple(sorted((order[i], rng.choice(order[:i])))) for i in range(1, len(order)))


def _swap_edge(members: list[int], tree: frozenset[Edge], rng: random.Random) -> frozenset[Edge]:
    """Cut a random edge and reconnect the two sides by a random other pair across the cut."""
    cut = rng.choice(sorted(tree))
    rest = set(tree) - {cut}
    g = nx.Graph(list(rest))
    g.add_nodes_from(members)
    side = nx.node_connected_component(g, cut[0])
    pairs = [tuple(sorted((a, b))) for a in side for b in members if b not in side]
    return frozenset(rest | {rng.choice(sorted(pairs))})


def _rooted(members: list[int], edges: frozenset[Edge]) -> tuple[int, dict[int, int | None]]:
    """The tree's centre as its root (shallowest pipeline) and every member's parent toward it."""
    g = nx.Graph(list(edges))
    g.add_nodes_from(members)
    root = min(nx.center(g))
    parent: dict[int, int | None] = {root: None}
    for u, v in nx.bfs_edges(g, root):
        parent[v] = u
    return root, parent
