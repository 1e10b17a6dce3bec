"""Minimum-cost arborescences on a dense cost matrix: the pricing oracle of the tree-packing LP.

Column generation asks, every round, for the cheapest out-arborescence from each root under the
LP's edge prices. networkx's Edmonds works on dict graphs and costs ~tens of ms per call on a
30-node mesh (×60 calls a round); this Chu–Liu/Edmonds contracts all cycles of one level at once
with numpy, so a call is ~1 ms. With inactive (Steiner) nodes no exact polynomial oracle exists:
`steiner` is the shortest-path heuristic (Takahashi–Matsuyama), polished by an exact arborescence
on the nodes it picked, then stripped of leaves that are not terminals.

Everything works on indices 0..n-1 and a cost matrix `w[u, x]` (cost of edge u->x, `inf` = no edge).
An arborescence is a parent array: `parent[x]` is the node x's edge comes from, -1 for the root and
for nodes outside the tree. A reduce (in-)tree is an out-tree of the transposed matrix: the same
parent array then names each node's next hop toward the root.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

INF = np.inf


def edmonds(w: np.ndarray, root: int) -> np.ndarray | None:
    """Exact minimum-cost spanning out-arborescence from `root` (None if some node is unreachable)."""
    n = w.shape[0]
    if n == 1:
        return np.array([-1])
    m = w.copy()
    np.fill_diagonal(m, INF)
    m[:, root] = INF  # forcing the root: nothing may enter it
    parent = m.argmin(axis=0)
    cost = m[parent, np.arange(n)]
    cost[root] = 0.0
    parent[root] = -1
    if np.isinf(cost).any():
        return None
    cycles = _cycles(parent, root)
    if not cycles:
        return parent
    comp = np.full(n, -1)
    for i, cyc in enumerate(cycles):
        comp[cyc] = i
    free = np.flatnonzero(comp < 0)
    comp[free] = len(cycles) + np.arange(len(free))
    k = len(cycles) + len(free)
    adj = m - cost[None, :]  # entering x replaces x's chosen edge: pay only the difference
    order = np.argsort(comp, kind="stable")
    starts = np.searchsorted(comp[order], np.arange(k))
    rows = np.minimum.reduceat(adj[order], starts, axis=0)
    small = np.minimum.reduceat(rows[:, order], starts, axis=1)
    np.fill_diagonal(small, INF)
    sub = edmonds(small, int(comp[root]))
    if sub is None:
        return None
    # Expand: each node group takes its cheapest edge from the group its contracted parent names;
    # inside a cycle that edge's head is where the cycle is broken.
    up = sub[comp]
    cand = np.where(comp[:, None] == up[None, :], adj, INF)
    src = cand.argmin(axis=0)
    val = cand[src, np.arange(n)]
    heads = np.flatnonzero((up >= 0) & (val == np.minimum.reduceat(val[order], starts)[comp]))
    _, first = np.unique(comp[heads], return_index=True)
    heads = heads[first]
    parent[heads] = src[heads]
    return parent


def _cycles(parent: np.ndarray, root: int) -> list[np.ndarray]:
    """The cycles of the functional graph x -> parent[x] (every node but the root has one parent)."""
    n = len(parent)
    state = np.zeros(n, dtype=np.int8)  # 0 new, 1 on the current walk, 2 done
    state[root] = 2
    cycles = []
    for start in range(n):
        walk = []
        x = start
        while state[x] == 0:
            state[x] = 1
            walk.append(x)
            x = int(parent[x])
        if state[x] == 1:
            cycles.append(np.array(walk[walk.index(x):]))
        for y in walk:
            state[y] = 2
    return cycles


def cost(w: np.ndarray, parent: np.ndarray) -> float:
    kids = np.flatnonzero(parent >= 0)
    return float(w[parent[kids], kids].sum())


def prune(parent: np.ndarray, terminals: np.ndarray) -> np.ndarray:
    """Drop leaves that are not terminals until none is left: a relay nothing flows through has no part."""
    parent = parent.copy()
    is_term = np.zeros(len(parent), dtype=bool)
    is_term[terminals] = True
    while True:
        inside = (parent >= 0) | is_term
        has_child = np.zeros(len(parent), dtype=bool)
        has_child[parent[parent >= 0]] = True
        drop = inside & ~has_child & ~is_term
        if not drop.any():
            return parent
        parent[drop] = -1


def steiner(w: np.ndarray, root: int, terminals: np.ndarray, graph: csr_matrix | None = None) -> np.ndarray | None:
    """Cheap out-arborescence from `root` spanning `terminals` (may pass other nodes); None if impossible.

    Shortest-path heuristic: grow from {root}, attach the terminal nearest to the tree by its
    path, repeat; then Edmonds on the nodes used (often finds a cheaper wiring of the same nodes)
    and prune non-terminal leaves. `graph` is `w` as a sparse matrix (pass it to save the rebuild)."""
    n = w.shape[0]
    if graph is None:
        graph = sparse_graph(w)
    parent = np.full(n, -1)
    in_tree = np.zeros(n, dtype=bool)
    in_tree[root] = True
    todo = set(int(t) for t in terminals) - {root}
    while todo:
        dist, pred, _ = dijkstra(graph, directed=True, indices=np.flatnonzero(in_tree), min_only=True,
                                 return_predecessors=True)
        best = min(todo, key=lambda t: dist[t])
        if not np.isfinite(dist[best]):
            return None
        x = best
        while not in_tree[x]:
            parent[x] = pred[x]
            in_tree[x] = True
            x = int(pred[x])
        todo -= set(np.flatnonzero(in_tree).tolist())
    nodes = np.flatnonzero(in_tree)
    local = np.flatnonzero(nodes == root)[0]
    polished = edmonds(w[np.ix_(nodes, nodes)], int(local))
    if polished is not None:
        mapped = np.full(n, -1)
        kids = np.flatnonzero(polished >= 0)
        mapped[nodes[kids]] = nodes[polished[kids]]
        if cost(w, mapped) < cost(w, parent):
            parent = mapped
    return prune(parent, terminals)


def sparse_graph(w: np.ndarray) -> csr_matrix:
    """`w` as a csgraph input; a tiny floor keeps zero-cost edges (csgraph drops stored zeros)."""
    u, x = np.nonzero(np.isfinite(w))
    keep = u != x
    u, x = u[keep], x[keep]
    return csr_matrix((np.maximum(w[u, x], 1e-300), (u, x)), shape=w.shape)


def shallow(w: np.ndarray, root: int, depth: int, terminals: np.ndarray | None = None) -> np.ndarray | None:
    """A cheap out-arborescence from `root` of at most `depth` levels (Prim's greedy, each step the
    cheapest edge from a node above the last level), spanning `terminals` (default: every node),
    pruned of non-terminal leaves; None if the levels cannot reach them all."""
    n = w.shape[0]
    want = np.ones(n, dtype=bool) if terminals is None else np.isin(np.arange(n), terminals)
    parent = np.full(n, -1)
    level = np.full(n, -1)
    level[root] = 0
    best = w[root].copy()
    frm = np.full(n, root)
    best[root] = INF
    while not (level[want] >= 0).all():
        x = int(best.argmin())
        if not np.isfinite(best[x]):
            return None
        parent[x], level[x] = frm[x], level[frm[x]] + 1
        best[x] = INF
        if level[x] < depth:
            better = (level < 0) & (w[x] < best)
            best[better], frm[better] = w[x][better], x
    return parent if terminals is None else prune(parent, terminals)


def depth(parent: np.ndarray) -> int:
    """Levels below the root of an arborescence given as a parent array."""
    level = np.where(parent >= 0, 1, 0)
    up = parent.copy()
    while (up >= 0).any():
        nxt = np.where(up >= 0, parent[np.maximum(up, 0)], -1)
        level += nxt >= 0
        up = nxt
    return int(level.max(initial=0))
