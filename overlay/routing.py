"""Static min-hop routes over the overlay's links, the same rule for relays, simulator and tc.

Between two nodes that are not neighbours, traffic follows the path with the fewest hops; among
equal-length paths, the lexicographically smallest sequence of node ids wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class NoRoute(ValueError):
    """The overlay has no path between two nodes."""


def adjacency(links: Iterable[tuple[int, int]]) -> dict[int, set[int]]:
    """Undirected neighbour sets from (a, b) link pairs."""
    adj: dict[int, set[int]] = {}
    for a, b in links:
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
    return adj


def min_hop_tree(adj: Mapping[int, Iterable[int]], src: int) -> dict[int, int | None]:
    """Predecessor of every reachable node on its lexicographically smallest min-hop path from src.

    BFS by layers: all paths to one layer have equal length, so ranking a layer by
    (rank of the best predecessor, node id) orders its paths lexicographically.
    """
    pred: dict[int, int | None] = {src: None}
    rank = {src: 0}
    layer = [src]
    while layer:
        best: dict[int, int] = {}
        for u in layer:
            for v in adj.get(u, ()):
                if v in pred:
                    continue
                if v not in best or rank[u] < rank[best[v]]:
                    best[v] = u
        nxt = sorted(best, key=lambda v: (rank[best[v]], v))
        for i, v in enumerate(nxt):
            pred[v] = best[v]
            rank[v] = i
        layer = nxt
    return pred


class Routes:
    """All min-hop routes of one overlay, computed lazily per source."""

    def __init__(self, adj: Mapping[int, Iterable[int]]) -> None:
        self.adj = {n: frozenset(v) for n, v in adj.items()}
        self._trees: dict[int, dict[int, int | None]] = {}

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        if src == dst:
            return (src,)
        tree = self._trees.get(src)
        if tree is None:
            tree = self._trees[src] = min_hop_tree(self.adj, src)
        if dst not in tree:
            raise NoRoute(f"no overlay path from node {src} to node {dst}")
        path = [dst]
        while path[-1] != src:
            p = tree[path[-1]]
            assert p is not None
            path.append(p)
        return tuple(reversed(path))

    def is_link(self, a: int, b: int) -> bool:
        return b in self.adj.get(a, ())
