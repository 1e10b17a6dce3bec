"""Adapter from the emulated WAN (Topology + Trace) to the simulator's plain input.

The simulator lives in scheduler/ and must not import emulation/, so this side does the
translation. Routes follow overlay.routing's rule (fewest hops, then the lexicographically
smallest node sequence) but are computed with scipy's BFS, which is what makes 1,000-node
topologies cheap: scipy visits a node's neighbours in CSR order and dequeues FIFO, so with sorted
CSR indices the first predecessor to discover a node is the best-ranked one of the previous layer,
which is exactly overlay.routing.min_hop_tree's rule (tests check the two agree).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import breadth_first_order

from overlay.routing import NoRoute
from scheduler.simulator import SimNetwork

from .topology import Topology
from .trace import Trace


class MinHopRoutes:
    """Lexicographic min-hop routes, one scipy BFS per source, computed lazily and cached."""

    def __init__(self, nodes: int, links: list[tuple[int, int]]) -> None:
        self.nodes = nodes
        self.links = frozenset(links)
        a, b = (np.array(x, dtype=np.int32) for x in zip(*links, strict=True)) if links else (
            np.zeros(0, np.int32), np.zeros(0, np.int32))
        src, dst = np.concatenate([a, b]), np.concatenate([b, a])  # routes use links as undirected
        graph = csr_array((np.ones(len(src), dtype=np.int8), (src, dst)), shape=(nodes, nodes))
        graph.sum_duplicates()
        graph.sort_indices()
        self.graph = graph
        self._pred: dict[int, np.ndarray] = {}

    def __call__(self, src: int, dst: int) -> tuple[int, ...]:
        if src == dst:
            return (src,)
        if (src, dst) in self.links:
            return (src, dst)
        pred = self._pred.get(src)
        if pred is None:
            # directed=True walks the symmetric CSR as stored; directed=False would mix in its
            # transpose and lose the sorted neighbour order the tie rule depends on
            _, pred = breadth_first_order(self.graph, src, directed=True, return_predecessors=True)
            self._pred[src] = pred
        path = [dst]
        while path[-1] != src:
            p = int(pred[path[-1]])
            if p < 0:
                raise NoRoute(f"no overlay path from node {src} to node {dst}")
            path.append(p)
        return tuple(reversed(path))


def sim_network(topo: Topology, trace: Trace | None = None) -> SimNetwork:
    """The simulator's view of a configured WAN: link rates and delays, routes, caps, trace events."""
    links = sorted(topo.links)
    events = () if trace is None else tuple(sorted((e.t, e.src, e.dst, e.rate_mbps) for e in trace.events))
    return SimNetwork(
        rates_mbps={k: topo.links[k].rate_mbps for k in links},
        # the shaper adds uniform(0, jitter) to every delay: its mean is the blind expectation
        delays_s={k: topo.links[k].delay_s + topo.links[k].jitter_s / 2 for k in links},
        route=MinHopRoutes(topo.nodes, links),
        uplink_mbps=dict(topo.uplink_mbps),
        downlink_mbps=dict(topo.downlink_mbps),
        events=events,
    )
