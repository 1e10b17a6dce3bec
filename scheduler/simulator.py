"""Flow-level simulator: replays a Plan on plain network data and predicts its round time.

It models what the live data plane does, and nothing fitted to live runs (it is a blind oracle):
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
- NetStorm's auxiliary routes (ChunkGroup.aux) are dispatched as agents.engine.ChunkEngine._send
  does, when the chunk is ready: once `primary_busy_bound` transfers on the primary path are in
  transit (queued, sending, or waiting for the first hop's ack), the first auxiliary route with
  fewer than `aux_queue_length` in transit takes the chunk, relayed like any other route.

Two engines implement this. `exact` is event driven: rates are re-solved at every event that
changes the set of backlogged keys or a capacity (trace). Its cost grows with transfers times the
number of keys that share links with each other; at 1,000 nodes that is millions of events, each
re-solving a max-min over thousands of flows, far beyond seconds. `fluid` makes those sizes cheap:
rates are piecewise constant over a few dozen time slices, solved from which keys a previous
pass found active there, and chunk times follow from a vectorized FIFO recursion per tree edge.
It equals `exact` when no two keys share a resource, and stays within a few percent for one-tree
plans whose routes cross; for plans of many groups it is slower than `exact` (a key's streams
share it evenly instead of taking turns at full rate: +20..30 % measured with 25..70 chunks per
group, far more with only a couple). `auto` runs `exact` whenever its estimated cost is small,
and always for plans with auxiliary routes: their dispatch depends on every earlier send's hop ack
across all groups at that node, in time order, which fluid's per-group vectorized FIFO recursion
cannot reproduce, so fluid refuses such plans. RoundPrediction.mode says which engine ran.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy.sparse import coo_array
from scipy.sparse.csgraph import connected_components

from .plan import Plan

MBIT = 1e6 / 8  # bytes per second in one Mbit/s
FLOAT32 = 4
EXACT_BUDGET_S = 2.0  # auto mode: the exact engine's estimated run time it may spend
FLUID_PASSES = 3  # fluid: 1 static pass, then re-solves from the previous pass's activity
FLUID_SLICES = 24  # fluid: at most this many time slices (plus trace events) per re-solve
_INF = float("inf")

# event kinds, in the order they are handled when times tie
_RATE, _DONE, _ACK, _SEND, _WAKE = 0, 1, 2, 3, 4
# transfer kinds (also the FIFO tie-break after chunk index)
_AGG, _BCAST = 0, 1

Mode = Literal["auto", "exact", "fluid"]


@dataclass(frozen=True)
class SimNetwork:
    """Plain data only, so the scheduler can feed its own view and the CLI an emulation topology."""

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


class _Model:
    """What both engines share: resources (links, then node caps) and flow keys, as dense ints."""

    def __init__(self, plan: Plan, net: SimNetwork, start: float, segment: int) -> None:
        if plan.multicast is not None:
            raise NotImplementedError("multicast (SelMcast) plans are not simulated yet")
        self.plan, self.net, self.start, self.segment = plan, net, start, segment
        self.nodes = list(plan.participants)
        self.ix = {n: i for i, n in enumerate(self.nodes)}
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
            delay += self.net.delays_s.get((a, b), 0.0)
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
                            + self.net.delays_s.get((path[1], path[0]), 0.0))
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


# --- exact: event driven -------------------------------------------------------------------------
class _Exact:
    """Arrivals are resolved as soon as the transfer that causes them finishes (they only take a max
    of times), so there is one event per transfer plus one per FIFO that wakes up; rates are only
    re-solved for keys sharing a resource, transitively, with a change, and a key alone on its
    resources needs no water-filling.

    NetStorm's auxiliary dispatch is decided when the chunk is ready, from the sender's counts at
    that moment, as agents.engine.ChunkEngine._send does: a send on a tree edge with auxiliary
    routes takes the first route whose in-transit count is below `queue_length` once the primary
    path's count reaches `busy_bound`, else the primary. A transfer is in transit from the moment it
    is handed to its FIFO (queued ones count) until its hop ack is back: its last byte left, crossed
    the first link, and the ack crossed the link back (overlay.peers.Overlay.in_transit). Sends
    whose key such a decision reads become _SEND events at their ready time, so they are decided
    (and counted) in time order; ties go in chunk order, as a node's ready chunks leave live."""

    def __init__(self, m: _Model, busy_bound: int = 2, queue_length: int = 5) -> None:
        self.m = m
        self.busy_bound, self.queue_length = busy_bound, queue_length
        nk = len(m.key_path)
        nf = len(m.fifo_of)
        n = len(m.nodes)
        self.cap = list(m.cap)
        self.busy = [False] * nk
        self.rate = [0.0] * nk
        self.left = [0.0] * nk  # bytes of the head transfer still to send, as of since[k]
        self.since = [0.0] * nk
        self.head: list[tuple[float, int, int, int]] = [(0.0, 0, 0, 0)] * nk
        self.version = [0] * nk
        # per FIFO (origin, destination, first hop): (ready, chunk, kind, key); one key active at a time
        self.queue: list[list[tuple[float, int, int, int]]] = [[] for _ in range(nf)]
        self.fifo_busy = [False] * nf
        self.wake_at = [_INF] * nf
        self.key_bytes = [0] * nk
        self.in_transit = [0] * nk  # of counted keys only
        self.sends: dict[int, tuple[int, int, int]] = {}  # pending _SEND: seq -> (primary key, kind, group)
        self.seq = 0
        self.aux_bytes = 0
        self.res_active: list[set[int]] = [set() for _ in self.cap]
        self.res_since = [0.0] * m.nlinks
        self.res_busy = [0.0] * m.nlinks
        self.events: list[tuple[float, int, int, int]] = []
        self.changed: set[int] = set()
        self.changed_res: set[int] = set()
        self.done = [m.start] * n
        self.finals = [0] * n
        self.pending: list[list[int]] = [[] for _ in m.chunk_bytes]
        self.arrived: list[list[float]] = [[] for _ in m.chunk_bytes]

    def run(self) -> RoundPrediction:
        m = self.m
        n = len(m.nodes)
        t = m.start
        for g in m.plan.groups:
            for c in g.chunks:
                self.pending[c] = list(m.nkids[m.group_of[c]])
                self.arrived[c] = [t] * n
        for c in range(len(m.chunk_bytes)):  # leaves hand out their chunks in chunk order
            g_idx = m.group_of[c]
            kids = m.nkids[g_idx]
            for v in range(n):
                if kids[v] == 0:
                    self._ready(v, c, g_idx, t)
        for i, ev in enumerate(m.later_events):
            heapq.heappush(self.events, (ev[0], _RATE, i, 0))
        self._loop()
        stuck = [m.nodes[v] for v in range(n) if self.finals[v] < len(m.chunk_bytes)]
        if stuck:
            raise SimulationStalled(f"nodes {stuck[:8]} never received every chunk (a rate stayed at 0)")
        link_of_res = {r: link for link, r in m.res_of_link.items()}
        busy = {link_of_res[r]: s for r, s in enumerate(self.res_busy) if s > 0}
        done = {m.nodes[v]: d for v, d in enumerate(self.done)}
        return RoundPrediction(max(self.done) - m.start, done, m.link_bytes(self.key_bytes), busy, "exact",
                               self.aux_bytes)

    def _loop(self) -> None:
        events, version, wake_at = self.events, self.version, self.wake_at
        while events:
            t = events[0][0]
            while events and events[0][0] <= t:
                _, kind, k, ver = heapq.heappop(events)
                if kind == _DONE:
                    if ver == version[k]:
                        self._finish(k, t)
                elif kind == _WAKE:
                    if wake_at[k] == t:
                        self._wake(k, t)
                elif kind == _ACK:
                    self.in_transit[k] -= 1
                elif kind == _SEND:
                    self._dispatch(k, ver, t)
                else:
                    _, a, b, mbps = self.m.later_events[k]
                    r = self.m.res_of_link[(a, b)]
                    self.cap[r] = mbps * MBIT
                    self.changed_res.add(r)
            if self.changed or self.changed_res:
                self._reallocate(t)

    # chunk logic
    def _ready(self, v: int, c: int, g: int, t: float) -> None:
        """Node v holds every aggregation child's copy of chunk c at time t."""
        if v == self.m.root[g]:
            self._final(v, c, g, t)
        else:
            self._send(self.m.agg_key[g][v], t, c, _AGG, g)

    def _final(self, v: int, c: int, g: int, t: float) -> None:
        if t > self.done[v]:
            self.done[v] = t
        self.finals[v] += 1
        for k in self.m.bcast_keys[g][v]:
            self._send(k, t, c, _BCAST, g)

    def _arrive(self, v: int, c: int, kind: int, t: float) -> None:
        g = self.m.group_of[c]
        if kind == _BCAST:
            self._final(v, c, g, t)
            return
        pend = self.pending[c]
        arr = self.arrived[c]
        if t > arr[v]:
            arr[v] = t
        pend[v] -= 1
        if pend[v] == 0:
            self._ready(v, c, g, arr[v])

    def _send(self, k: int, t: float, c: int, kind: int, g: int) -> None:
        """Chunk c is ready at t for the tree edge whose static route is key k."""
        if self.m.counted[k]:  # decided, and counted, when the clock gets there
            self.seq += 1
            self.sends[self.seq] = (k, kind, g)
            heapq.heappush(self.events, (t, _SEND, c, self.seq))
        else:
            self._enqueue(k, t, c, kind)

    def _dispatch(self, c: int, seq: int, t: float) -> None:
        k, kind, g = self.sends.pop(seq)
        routes = self.m.aux_keys[g].get(k)
        if routes and self.in_transit[k] >= self.busy_bound:
            for a in routes:
                if self.in_transit[a] < self.queue_length:
                    k = a
                    self.aux_bytes += self.m.chunk_bytes[c]
                    break
        self.in_transit[k] += 1
        self._enqueue(k, t, c, kind)

    # FIFOs and flow keys
    def _enqueue(self, k: int, t: float, c: int, kind: int) -> None:
        f = self.m.key_fifo[k]
        heapq.heappush(self.queue[f], (t, c, kind, k))
        if not self.fifo_busy[f] and t < self.wake_at[f]:
            self.wake_at[f] = t
            heapq.heappush(self.events, (t, _WAKE, f, 0))

    def _wake(self, f: int, t: float) -> None:
        self.wake_at[f] = _INF
        self.fifo_busy[f] = True
        self._activate(heapq.heappop(self.queue[f]), t)

    def _activate(self, item: tuple[float, int, int, int], t: float) -> None:
        k = item[3]
        self.head[k] = item
        self.left[k] = self.m.chunk_bytes[item[1]]
        self.since[k] = t
        self.busy[k] = True
        self.changed.add(k)
        for r in self.m.key_res[k]:
            act = self.res_active[r]
            if not act and r < self.m.nlinks:
                self.res_since[r] = t
            act.add(k)

    def _deactivate(self, k: int, t: float) -> None:
        m = self.m
        self.busy[k] = False
        self.rate[k] = 0.0
        self.version[k] += 1
        self.changed.add(k)
        for r in m.key_res[k]:
            act = self.res_active[r]
            act.discard(k)
            if not act and r < m.nlinks:
                self.res_busy[r] += t - self.res_since[r]

    def _finish(self, k: int, t: float) -> None:
        m = self.m
        _, c, kind, _ = self.head[k]
        size = m.chunk_bytes[c]
        self.key_bytes[k] += size
        hops = len(m.key_path[k]) - 1
        arrive = t + m.key_delay[k]
        if hops > 1:  # cut-through: each relay waits for one segment before passing it on
            arrive += (hops - 1) * min(m.segment, size) / self.rate[k]
        if m.counted[k]:
            heapq.heappush(self.events, (t + m.key_ack[k], _ACK, k, 0))
        f = m.key_fifo[k]
        q = self.queue[f]
        if q and q[0][0] <= t and q[0][3] == k:  # same key goes on: resources and rate stay
            item = heapq.heappop(q)
            self.head[k] = item
            self.left[k] = m.chunk_bytes[item[1]]
            self.since[k] = t
            self.version[k] += 1
            heapq.heappush(self.events, (t + self.left[k] / self.rate[k], _DONE, k, self.version[k]))
        else:
            self._deactivate(k, t)
            if q and q[0][0] <= t:  # the FIFO goes on with a transfer on another route
                self._activate(heapq.heappop(q), t)
            else:
                self.fifo_busy[f] = False
                if q:
                    self.wake_at[f] = q[0][0]
                    heapq.heappush(self.events, (q[0][0], _WAKE, f, 0))
        self._arrive(m.key_dst[k], c, kind, arrive)

    def _reallocate(self, t: float) -> None:
        """Max-min rates for every busy key that shares a resource, transitively, with a change."""
        res_active, key_res, cap, busy = self.res_active, self.m.key_res, self.cap, self.busy
        seeds: list[int] = []
        for r in self.changed_res:
            seeds.extend(res_active[r])
        for k in self.changed:
            if busy[k]:
                seeds.append(k)
            else:
                for r in key_res[k]:
                    seeds.extend(res_active[r])
        self.changed.clear()
        self.changed_res.clear()
        seen: set[int] = set()
        single: list[int] = []
        shared: list[int] = []
        for s in seeds:
            if s in seen:
                continue
            seen.add(s)
            comp = [s]
            stack = [s]
            while stack:
                for r in key_res[stack.pop()]:
                    for k in res_active[r]:
                        if k not in seen:
                            seen.add(k)
                            comp.append(k)
                            stack.append(k)
            if len(comp) == 1:
                single.append(s)
            else:
                shared.extend(comp)
        keys = single
        new = [min([cap[r] for r in key_res[k]]) for k in single]
        if shared:  # one water-filling for all shared components: max-min decomposes over them
            keys = keys + shared
            pair_flow, res_ids = self.m.pairs(shared)
            uniq, pair_res = np.unique(res_ids, return_inverse=True)
            new.extend(max_min_rates(pair_flow, pair_res, np.asarray(cap)[uniq], len(shared)).tolist())
        rate, left, since, version, events = self.rate, self.left, self.since, self.version, self.events
        for k, r in zip(keys, new, strict=True):
            old = rate[k]
            if r == old:
                continue
            left[k] = max(0.0, left[k] - old * (t - since[k]))
            since[k] = t
            rate[k] = r
            version[k] += 1
            if r > 0:
                heapq.heappush(events, (t + left[k] / r, _DONE, k, version[k]))


# --- fluid: static rates, vectorized over chunks -------------------------------------------------
class _Fluid:
    """Static-share engine. Pass 1: every key gets its max-min share with all keys backlogged,
    piecewise constant between trace events; a key carrying s streams (group, direction) gives
    each 1/s of it. Later passes re-solve the shares per time slice among only the keys (and
    streams) that the previous pass found active in it, so capacity that finished subtrees leave
    behind goes to the rest, as it does live. Per stream, FIFO service
    finish_j = max(ready_j, finish_{j-1}) + b_j / rate is a cumulative max in cumulative-bytes
    space, so a tree edge costs a handful of numpy calls for all its chunks."""

    def __init__(self, m: _Model, prev: _Fluid | None = None) -> None:
        self.m = m
        nk = len(m.key_path)
        cap = np.asarray(m.cap, dtype=float)
        trace_t = [m.start]
        trace_cap = [cap.copy()]
        for t, a, b, mbps in m.later_events:
            if t != trace_t[-1]:
                trace_t.append(t)
                trace_cap.append(trace_cap[-1].copy())
            trace_cap[-1][m.res_of_link[(a, b)]] = mbps * MBIT
        pair_flow, pair_res = m.pairs(range(nk))
        if prev is None:
            streams = np.zeros(nk)
            for g_idx in range(len(m.plan.groups)):
                for k in m.agg_key[g_idx]:
                    if k >= 0:
                        streams[k] += 1
                for ks in m.bcast_keys[g_idx]:
                    for k in ks:
                        streams[k] += 1
            self.base_T = np.asarray(trace_t)
            self.base = np.stack([max_min_rates(pair_flow, pair_res, c, nk) for c in trace_cap])
            self.T = self.base_T
            self.R = self.base / np.maximum(streams, 1)  # (segments, keys): bytes/s of one stream
        else:
            self.base_T, self.base = prev.base_T, prev.base
            sk, s0, s1 = (np.asarray(x) for x in zip(*prev.spans, strict=True))
            kfirst = np.full(nk, _INF)
            klast = np.full(nk, -_INF)
            np.minimum.at(kfirst, sk, s0)
            np.maximum.at(klast, sk, s1)
            marks = np.unique(np.concatenate([s0, s1]))
            slices = max(8, FLUID_SLICES - len(self.base_T))  # a busy trace already slices time
            if len(marks) > slices:
                marks = np.unique(np.quantile(marks, np.linspace(0, 1, slices + 1)))
            T = np.unique(np.concatenate([self.base_T, marks[marks > m.start]]))
            ends = np.append(T[1:], _INF)
            R = np.empty((len(T), nk))
            for i, (t0, t1) in enumerate(zip(T, ends, strict=True)):
                seg = int(np.searchsorted(self.base_T, t0, side="right")) - 1
                active = (kfirst < t1) & (klast > t0)
                live = active[pair_flow]
                solved = max_min_rates(pair_flow[live], pair_res[live], trace_cap[seg], nk)
                # a key the last pass had idle here gets what the active ones leave, or at least
                # its all-backlogged share: a little optimistic, but never stuck at zero
                used = np.bincount(pair_res[live], weights=solved[pair_flow[live]], minlength=len(cap))
                spare = np.full(nk, _INF)
                np.minimum.at(spare, pair_flow, np.maximum(trace_cap[seg] - used, 0.0)[pair_res])
                idle = np.maximum(self.base[seg], spare)
                on = (s0 < t1) & (s1 > t0)
                streams = np.maximum(np.bincount(sk[on], minlength=nk), 1)
                R[i] = np.where(active, solved, idle) / streams
            self.T, self.R = T, R
        spans = np.diff(self.T)[:, None] * self.R[:-1]
        self.W = np.vstack([np.zeros((1, nk)), np.cumsum(spans, axis=0)])  # bytes servable by T[i]
        self.key_bytes = np.zeros(nk, dtype=np.int64)
        self.spans: list[tuple[int, float, float]] = []  # per stream: (key, first start, last finish)

    def _serve(self, k: int, ready: np.ndarray, size: np.ndarray, csum: np.ndarray) -> np.ndarray:
        """Finish times of FIFO stream k for items ready at `ready` (in order), plus arrival delays."""
        T, R, W = self.T, self.R[:, k], self.W[:, k]
        if len(T) == 1:
            r = R[0]
            if r <= 0:
                raise SimulationStalled(f"key {self.m.key_path[k]} has rate 0")
            fin = csum / r + np.maximum.accumulate(ready - (csum - size) / r)
            rate_end = np.full(len(fin), r)
        else:
            seg = np.searchsorted(T, ready, side="right") - 1
            w_ready = W[seg] + (ready - T[seg]) * R[seg]
            w_fin = csum + np.maximum.accumulate(w_ready - (csum - size))
            seg = np.clip(np.searchsorted(W, w_fin, side="left") - 1, 0, len(T) - 1)
            rate_end = R[seg]
            with np.errstate(divide="ignore", invalid="ignore"):
                fin = T[seg] + (w_fin - W[seg]) / rate_end
            if not np.isfinite(fin).all():
                raise SimulationStalled(f"key {self.m.key_path[k]} stays at rate 0")
        self.key_bytes[k] += int(size.sum())
        self.spans.append((k, float(ready[0]), float(fin[-1])))
        m = self.m
        hops = len(m.key_path[k]) - 1
        arrive = fin + m.key_delay[k]
        if hops > 1:  # cut-through: each relay waits for one segment before passing it on
            arrive = arrive + (hops - 1) * np.minimum(m.segment, size) / rate_end
        return arrive

    def run(self) -> RoundPrediction:
        m = self.m
        done = np.full(len(m.nodes), m.start)
        for g_idx, g in enumerate(m.plan.groups):
            chunks = sorted(g.chunks)
            size = np.asarray([m.chunk_bytes[c] for c in chunks], dtype=float)
            csum = np.cumsum(size)
            ready: dict[int, np.ndarray] = {}
            kids: dict[int, list[int]] = {}
            for v, k in enumerate(m.agg_key[g_idx]):
                if k >= 0:
                    kids.setdefault(m.key_dst[k], []).append(v)
            order = [m.root[g_idx]]  # top-down; aggregation runs it backwards
            for v in order:
                order.extend(kids.get(v, ()))
            start = np.full(len(chunks), m.start)
            for v in reversed(order):
                r = ready.get(v, start)
                k = m.agg_key[g_idx][v]
                if k >= 0:
                    arr = self._serve(k, r, size, csum)
                    p = m.key_dst[k]
                    ready[p] = np.maximum(ready[p], arr) if p in ready else arr
                else:
                    ready[v] = r
            final = {m.root[g_idx]: ready[m.root[g_idx]]}
            todo = [m.root[g_idx]]
            while todo:
                u = todo.pop()
                for k in m.bcast_keys[g_idx][u]:
                    final[m.key_dst[k]] = self._serve(k, final[u], size, csum)
                    todo.append(m.key_dst[k])
            for v, f in final.items():
                done[v] = max(done[v], float(f.max()))
        busy = self._busy()
        node_done = {m.nodes[v]: float(d) for v, d in enumerate(done)}
        return RoundPrediction(float(done.max()) - m.start, node_done, m.link_bytes(self.key_bytes.tolist()),
                               busy, "fluid")

    def _busy(self) -> dict[tuple[int, int], float]:
        """Union of the active spans of the streams on each link (gaps inside a span count as busy)."""
        per_link: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for k, a, b in self.spans:
            path = self.m.key_path[k]
            for link in zip(path, path[1:], strict=False):
                per_link.setdefault(link, []).append((a, b))
        out: dict[tuple[int, int], float] = {}
        for link, spans in per_link.items():
            total, end = 0.0, -_INF
            for a, b in sorted(spans):
                if b > end:
                    total += b - max(a, end)
                    end = b
            out[link] = total
        return out


def _exact_cost_s(m: _Model) -> float:
    """Rough run time of the exact engine: per transfer, a fixed part plus a part per key it may
    have to re-solve rates with (keys sharing resources with it, transitively)."""
    nk = len(m.key_path)
    if nk == 0:
        return 0.0
    flow, res = m.pairs(range(nk))
    graph = coo_array((np.ones(len(flow)), (flow, nk + res)), shape=(nk + len(m.cap),) * 2)
    _, label = connected_components(graph, directed=False)
    size = np.bincount(label[:nk], minlength=label.max() + 1)[label[:nk]]
    return float((m.transfers_per_key() * (7e-6 + 1.5e-6 * (size - 1))).sum())


def simulate(plan: Plan, net: SimNetwork, *, start_s: float = 0.0, segment_bytes: int = 65536,
             mode: Mode = "auto", primary_busy_bound: int = 2, aux_queue_length: int = 5) -> RoundPrediction:
    """Predict one synchronization round of `plan` on `net`, starting at `start_s` on the trace's clock.

    mode: `exact` (event driven), `fluid` (static shares, for 1,000-node scale), or `auto`, which
    runs `exact` unless its estimated cost exceeds EXACT_BUDGET_S, and always for plans with
    auxiliary routes (fluid cannot model their dispatch and refuses them).
    primary_busy_bound, aux_queue_length: NetStorm's PRIMARY_BUSY_BOUND and AUXILIARY_QUEUE_LENGTH,
    as the agents run them (agents.engine.ChunkEngine); they only matter for auxiliary routes.
    """
    m = _Model(plan, net, start_s, segment_bytes)
    if mode == "auto":
        mode = "exact" if m.has_aux or _exact_cost_s(m) <= EXACT_BUDGET_S else "fluid"
    if mode == "exact":
        return _Exact(m, primary_busy_bound, aux_queue_length).run()
    if mode == "fluid":
        if m.has_aux:
            raise NotImplementedError("the fluid engine does not model auxiliary-route dispatch: use exact")
        sim = _Fluid(m)
        pred = sim.run()
        for _ in range(FLUID_PASSES - 1 if m.key_path else 0):
            sim = _Fluid(m, sim)
            pred = sim.run()
        return pred
    raise ValueError(f"mode must be auto, exact or fluid, got {mode!r}")
