"""What a round is made of, as both engines see it: plain network data, flows on resources, max-min sharing.

The simulator models what the live data plane does, and nothing fitted to live runs (it is a blind oracle):
- per chunk, store-and-forward at tree nodes: a node sends its partial sum of a chunk to its
  aggregation parent once all its aggregation children's copies arrived; the root then sends the
  final value down the broadcast tree, each node forwarding a chunk once it fully arrived;
- a logical transfer u->v follows the static route net.route(u, v), cut-through at the relays:
  one flow that occupies every link of the route at once, plus each link's one-way delay and one
  segment's transmission per extra relay hop;
- each sender keeps one FIFO per flow key (route origin, route destination) and first hop, as the
  live LinkSender does per link: transfers with the same key run one after the other, different
  keys share links round-robin, which at flow level is max-min fairness over links and node
  uplink/downlink caps;
- what live rounds pay outside link transfer (sim/costs.py): the barrier's replies reaching the
  participants one by one and their round setup (each starts at its own time), a chunk's handling
  at every node it crosses (added to its route's delay), an ack's handling;
- NetStorm's auxiliary routes (ChunkGroup.aux) are dispatched as agents.engine.ChunkEngine._send
  does, when the chunk is ready: once `primary_busy_bound` transfers on the primary path are in
  transit (queued, sending, or waiting for the first hop's ack), the first auxiliary route with
  fewer than `aux_queue_length` in transit takes the chunk, relayed like any other route.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduler.plan import Plan

from .costs import NONE, WanCosts

MBIT = 1e6 / 8  # bytes per second in one Mbit/s
FLOAT32 = 4


@dataclass(frozen=True)
class SimNetwork:
    """Plain data only, so the scheduler can feed its own view and the CLI an emulation topology;
    sim.make_network builds one with the overlay's routes."""

    rates_mbps: Mapping[tuple[int, int], float]  # directed overlay links
    delays_s: Mapping[tuple[int, int], float]
    route: Callable[[int, int], tuple[int, ...]]  # static min-hop route, src..dst
    uplink_mbps: Mapping[int, float] = field(default_factory=dict)
    downlink_mbps: Mapping[int, float] = field(default_factory=dict)
    events: Sequence[tuple[float, int, int, float]] = ()  # (t, src, dst, rate_mbps), sorted by t


@dataclass
class RoundPrediction:
    round_s: float  # from start_s until the last participant holds its full result
    node_done_s: dict[int, float]  # absolute time (same clock as start_s and the events)
    link_bytes: dict[tuple[int, int], int]  # bytes carried by each directed link, relayed ones included
    link_busy_s: dict[tuple[int, int], float]  # time each link had at least one backlogged flow
    mode: str = "exact"  # the engine that produced it
    aux_bytes: int = 0  # bytes senders put on auxiliary routes (each transfer once, not per link)


class SimulationStalled(RuntimeError):
    """Work remained but nothing could make progress (a link or cap at rate 0 for good)."""


def max_min_rates(pair_flow: np.ndarray, pair_res: np.ndarray, capacity: np.ndarray, nflows: int) -> np.ndarray:
    """Max-min fair rates by progressive filling: every unfrozen flow grows by the same step until a
    resource saturates, whose flows then freeze. (pair_flow[i], pair_res[i]) says flow uses resource.
    Frozen pairs are dropped as it goes, so big instances get cheaper with every level."""
    rate = np.zeros(nflows)
    left = np.asarray(capacity, dtype=float).copy()
    nres = len(left)
    level = 0.0
    pf, pr = np.asarray(pair_flow), np.asarray(pair_res)
    while len(pf):
        count = np.bincount(pr, minlength=nres)
        used = np.flatnonzero(count)
        share = np.maximum(left[used], 0.0) / count[used]
        step = float(share.min())
        level += step
        left[used] -= step * count[used]
        full = np.zeros(nres, dtype=bool)
        full[used[share <= step * (1 + 1e-12) + 1e-15]] = True
        done = np.zeros(nflows, dtype=bool)
        done[pf[full[pr]]] = True
        rate[done] = level
        live = ~done[pf]
        pf, pr = pf[live], pr[live]
    return rate


class Model:
    """What both engines share: resources (links, then node caps) and flow keys, as dense ints."""

    def __init__(self, plan: Plan, net: SimNetwork, start: float, segment: int, costs: WanCosts = NONE) -> None:
        if plan.multicast is not None:
            raise NotImplementedError("multicast (SelMcast) plans are not simulated yet")
        self.plan, self.net, self.start, self.segment, self.costs = plan, net, start, segment, costs
        self.nodes = list(plan.nodes)  # relays, outside aggregators and receivers move bytes too
        self.ix = {n: i for i, n in enumerate(self.nodes)}
        # when each participant begins (the barrier's replies reach them one by one, then its setup)
        self.start_at = [start + off for off in costs.start_offsets(len(self.nodes))]
        self.chunk_bytes = [n * FLOAT32 for _, n in plan.layout]
        self._build_resources()
        self._build_keys()

    def _build_resources(self) -> None:
        net = self.net
        self.res_of_link: dict[tuple[int, int], int] = {}
        cap: list[float] = []
        for link, mbps in net.rates_mbps.items():
            self.res_of_link[link] = len(cap)
            cap.append(mbps * MBIT)
        self.nlinks = len(cap)
        for t, a, b, mbps in net.events:  # the trace's state at start_s is the starting capacity
            if (a, b) not in self.res_of_link:
                raise ValueError(f"trace event at {t} s for {a}->{b}, which is not a link")
            if t <= self.start:
                cap[self.res_of_link[(a, b)]] = mbps * MBIT
        self.up_res = {n: self._add(cap, m) for n, m in net.uplink_mbps.items()}
        self.down_res = {n: self._add(cap, m) for n, m in net.downlink_mbps.items()}
        self.cap = cap
        self.later_events = sorted((e for e in net.events if e[0] > self.start), key=lambda e: e[0])

    @staticmethod
    def _add(cap: list[float], mbps: float) -> int:
        cap.append(mbps * MBIT)
        return len(cap) - 1

    def _key(self, u: int, v: int) -> int:
        """The key of a logical transfer u->v on its static route."""
        k = self.key_of.get((u, v))
        if k is not None:
            return k
        path = tuple(self.net.route(u, v))
        if len(path) < 2 or path[0] != u or path[-1] != v:
            raise ValueError(f"route({u}, {v}) returned {path}, not a path from {u} to {v}")
        k = self.key_of[(u, v)] = self._path_key(path)
        return k

    def _path_key(self, path: tuple[int, ...]) -> int:
        """One key per path (the static route of a pair, or an auxiliary route). Keys whose paths
        share origin, destination and first hop share one FIFO, as in the live LinkSender."""
        k = self.key_of_path.get(path)
        if k is not None:
            return k
        res: list[int] = []
        delay = 0.0
        for a, b in zip(path, path[1:], strict=False):
            r = self.res_of_link.get((a, b))
            if r is None:
                raise ValueError(f"route {path} uses {a}->{b}, which is not a link")
            res.append(r)
            delay += self.net.delays_s.get((a, b), 0.0) + self.costs.hop_s  # each node on the way handles it
            if a in self.up_res:
                res.append(self.up_res[a])
            if b in self.down_res:
                res.append(self.down_res[b])
        k = len(self.key_path)
        self.key_of_path[path] = k
        self.key_path.append(path)
        self.key_res.append(tuple(dict.fromkeys(res)))
        self.key_delay.append(delay)
        self.key_dst.append(self.ix[path[-1]])
        # the hop ack: the first hop has the whole chunk one link delay after its last byte left,
        # and its ACK needs the reverse link's delay to come back
        self.key_ack.append(self.net.delays_s.get((path[0], path[1]), 0.0)
                            + self.net.delays_s.get((path[1], path[0]), 0.0) + self.costs.ack_s)
        self.key_fifo.append(self.fifo_of.setdefault((path[0], path[-1], path[1]), len(self.fifo_of)))
        return k

    def _build_keys(self) -> None:
        """Flow keys of every tree edge, and per group and node which keys its chunks leave on."""
        self.key_of: dict[tuple[int, int], int] = {}
        self.key_of_path: dict[tuple[int, ...], int] = {}
        self.fifo_of: dict[tuple[int, int, int], int] = {}
        self.key_path: list[tuple[int, ...]] = []
        self.key_res: list[tuple[int, ...]] = []
        self.key_delay: list[float] = []
        self.key_dst: list[int] = []
        self.key_ack: list[float] = []  # from a transfer's last byte leaving to its hop ack arriving back
        self.key_fifo: list[int] = []
        n = len(self.nodes)
        self.group_of = [0] * len(self.chunk_bytes)
        self.agg_key: list[list[int]] = []  # per group, per node index: key to the agg parent (-1 at root)
        self.bcast_keys: list[list[tuple[int, ...]]] = []  # per group, per node index
        self.nkids: list[list[int]] = []  # per group, per node index: aggregation children to wait for
        self.root: list[int] = []
        # NetStorm auxiliary routes: per group, primary key of a tree edge -> its auxiliary keys
        self.aux_keys: list[dict[int, tuple[int, ...]]] = []
        for g_idx, g in enumerate(self.plan.groups):
            for c in g.chunks:
                self.group_of[c] = g_idx
            agg = [-1] * n
            kids = [0] * n
            for node, parent in g.parent.items():
                if parent is not None:
                    agg[self.ix[node]] = self._key(node, parent)
                    kids[self.ix[parent]] += 1
            bc: list[tuple[int, ...]] = [()] * n
            for node, children in g.children.items():
                bc[self.ix[node]] = tuple(self._key(node, ch) for ch in children)
            self.agg_key.append(agg)
            self.bcast_keys.append(bc)
            self.nkids.append(kids)
            self.root.append(self.ix[g.root])
            aux: dict[int, tuple[int, ...]] = {}
            for (a, b), routes in g.aux.items():
                if routes:
                    aux[self._key(a, b)] = tuple(self._path_key(tuple(r)) for r in routes)
            self.aux_keys.append(aux)
        # keys whose in-transit count some dispatch decision reads: sends on them are counted
        self.counted = [False] * len(self.key_path)
        for aux in self.aux_keys:
            for k, routes in aux.items():
                for x in (k, *routes):
                    self.counted[x] = True

    @property
    def has_aux(self) -> bool:
        return any(self.aux_keys)

    def pairs(self, keys: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(flow index, resource id) of every resource each key uses, for max_min_rates."""
        flow = np.fromiter((i for i, k in enumerate(keys) for _ in self.key_res[k]), dtype=np.int64)
        res = np.fromiter((r for k in keys for r in self.key_res[k]), dtype=np.int64)
        return flow, res

    def transfers_per_key(self) -> np.ndarray:
        count = np.zeros(len(self.key_path), dtype=np.int64)
        for g_idx, g in enumerate(self.plan.groups):
            for k in self.agg_key[g_idx]:
                if k >= 0:
                    count[k] += len(g.chunks)
            for ks in self.bcast_keys[g_idx]:
                for k in ks:
                    count[k] += len(g.chunks)
        return count

    def link_bytes(self, key_bytes: Sequence[int]) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {}
        for k, path in enumerate(self.key_path):
            if key_bytes[k]:
                for link in zip(path, path[1:], strict=False):
                    out[link] = out.get(link, 0) + int(key_bytes[k])
        return out
