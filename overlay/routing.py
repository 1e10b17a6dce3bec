"""Static min-hop routes over the overlay's links, the one rule for relays, simulator and tc.

Between two nodes that are not neighbours, traffic follows the path with the fewest hops; among
equal-length paths, the lexicographically smallest sequence of node ids wins.

Routes come from a breadth-first search that visits a node's neighbours in increasing id order and
dequeues FIFO: each layer is dequeued ranked by (rank of the best predecessor, node id), and the first
predecessor to discover a node is the best-ranked one of the previous layer, i.e. the one on the
lexicographically smallest path (tests check this against an independent reference). Overlays of up
to BFS_PY_MAX nodes search in plain Python; larger ones use scipy's BFS (CSR order with sorted indices
gives the same rule), which is what makes 1,000-node topologies cheap. scipy is imported only then:
an agent, which routes over a few dozen nodes, does not pay its 0.1-0.2 s import at start.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

import numpy as np

BFS_PY_MAX = 128  # nodes up to which a source's search runs in Python (~1 ms at 128 nodes, full mesh)


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
        # the tie rule depends on visiting neighbours in increasing id order
        self._out = [sorted(self._ix[v] for v in self.adj.get(u, ())) for u in self._ids]
        self._graph = None  # scipy's CSR form, built when a large overlay first needs it
        self._pred: dict[int, list[int] | np.ndarray] = {}

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
            pred = self._pred[s] = self._bfs(s) if len(self._ids) <= BFS_PY_MAX else self._bfs_scipy(s)
        path = [d]
        while path[-1] != s:
            p = int(pred[path[-1]])
            if p < 0:
                raise NoRoute(f"no overlay path from node {src} to node {dst}")
            path.append(p)
        return tuple(self._ids[i] for i in reversed(path))

    def _bfs(self, s: int) -> list[int]:
        """Predecessor of every index on its route from index s (-9999: unreachable, as scipy says)."""
        pred = [-9999] * len(self._ids)
        pred[s] = s
        queue, out = deque((s,)), self._out
        while queue:
            u = queue.popleft()
            for v in out[u]:
                if pred[v] == -9999:
                    pred[v] = u
                    queue.append(v)
        pred[s] = -9999
        return pred

    def _bfs_scipy(self, s: int) -> np.ndarray:
        from scipy.sparse import csr_array
        from scipy.sparse.csgraph import breadth_first_order

        if self._graph is None:
            src = np.fromiter((u for u, vs in enumerate(self._out) for _ in vs), dtype=np.int32)
            dst = np.fromiter((v for vs in self._out for v in vs), dtype=np.int32)
            n = len(self._ids)
            self._graph = csr_array((np.ones(len(src), dtype=np.int8), (src, dst)), shape=(n, n))
            self._graph.sort_indices()
        # directed=True walks adj as given; directed=False would mix in the transpose and lose the
        # sorted neighbour order the tie rule depends on
        _, pred = breadth_first_order(self._graph, s, directed=True, return_predecessors=True)
        return pred

    def is_link(self, a: int, b: int) -> bool:
        return b in self.adj.get(a, ())
