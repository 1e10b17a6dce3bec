"""Static min-hop routes over the overlay's links, the one rule for relays, simulator and tc.

Between two nodes that are not neighbours, traffic follows the path with the fewest hops; among
equal-length paths, the lexicographically smallest sequence of node ids wins.

Routes come from scipy's BFS, which is what makes 1,000-node topologies cheap. It yields exactly
this rule: it visits a node's neighbours in CSR order and dequeues FIFO, so with sorted CSR indices
(node ids mapped to indices in increasing order) each layer is dequeued ranked by (rank of the best
predecessor, node id), and the first predecessor to discover a node is the best-ranked one of the
previous layer, i.e. the one on the lexicographically smallest path (tests check this against an
independent reference).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import breadth_first_order


class NoRoute(ValueError):
    """The overlay has no path between two nodes."""


def adjacency(links: Iterable[tuple[int, int]]) -> dict[int, set[int]]:
    """Undirected neighbour sets from (a, b) link pairs."""
    adj: dict[int, set[int]] = {}
    for a, b in links:
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
    return adj


class Routes:
    """All min-hop routes of one overlay (adj[u]: the nodes u may send to), one BFS per source,
    computed lazily and cached."""

    def __init__(self, adj: Mapping[int, Iterable[int]]) -> None:
        self.adj = {n: frozenset(v) for n, v in adj.items()}
        self._ids = sorted(set(self.adj).union(*self.adj.values()))
        self._ix = {n: i for i, n in enumerate(self._ids)}
        src = np.fromiter((self._ix[u] for u, vs in self.adj.items() for _ in vs), dtype=np.int32)
        dst = np.fromiter((self._ix[v] for vs in self.adj.values() for v in vs), dtype=np.int32)
        n = len(self._ids)
        graph = csr_array((np.ones(len(src), dtype=np.int8), (src, dst)), shape=(n, n))
        graph.sort_indices()  # the tie rule depends on visiting neighbours in increasing id order
        self._graph = graph
        self._pred: dict[int, np.ndarray] = {}

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        if src == dst:
            return (src,)
        if dst in self.adj.get(src, ()):
            return (src, dst)
        s, d = self._ix.get(src), self._ix.get(dst)
        if s is None or d is None:
            raise NoRoute(f"no overlay path from node {src} to node {dst}")
        pred = self._pred.get(s)
        if pred is None:
            # directed=True walks adj as given; directed=False would mix in the transpose and lose
            # the sorted neighbour order the tie rule depends on
            _, pred = breadth_first_order(self._graph, s, directed=True, return_predecessors=True)
            self._pred[s] = pred
        path = [d]
        while path[-1] != s:
            p = int(pred[path[-1]])
            if p < 0:
                raise NoRoute(f"no overlay path from node {src} to node {dst}")
            path.append(p)
        return tuple(self._ids[i] for i in reversed(path))

    def is_link(self, a: int, b: int) -> bool:
        return b in self.adj.get(a, ())
