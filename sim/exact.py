"""The exact engine: event driven, rates re-solved at every event that changes the set of backlogged
keys or a capacity (trace).

Its cost grows with transfers times the number of keys that share links with each other; at
1,000 nodes that is millions of events, each re-solving a max-min over thousands of flows, far
beyond seconds: `exact_cost_s` estimates it so `simulate(mode="auto")` can pick the fluid engine.

Where classed flows of different senders meet at a node cap, the live scheduler assigns them per-flow
rates at every classed task's start and end (core.capshare); this engine runs that same code at
the same moments (a task's start_s, its last receiver's done time) and applies the rates as per-key
caps, 0 holding a key until a later update (`cap_rates=False`: only the plans' own `rates`).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Hashable

import numpy as np
from scipy.sparse import coo_array
from scipy.sparse.csgraph import connected_components

from core.dispatch import DISPATCH, Dispatch
from core.maxmin import max_min_rates

from .caprates import CapRates
from .model import MBIT, Model, SimulationOverBudget, SimulationStalled, TaskPrediction, TaskRun, TasksPrediction
from .sharing import class_rates, without_loose_caps

_INF = float("inf")
BUDGET_EVERY = 16  # instants between two looks at the CPU clock (a budget is overrun by at most that)
# event kinds, in the order they are handled when times tie
_RATE, _DONE, _ACK, _SEND, _WAKE, _CAPS = 0, 1, 2, 3, 4, 5
_STARTS, _ENDS = 0, 1  # _CAPS: a task starts or ends (the scheduler's cap rates are split again)
# transfer kinds (also the FIFO tie-break after chunk index)
_AGG, _BCAST = 0, 1


class Exact:
    """Arrivals are resolved as soon as the transfer that causes them finishes (they only take a max
    of times), so there is one event per transfer plus one per FIFO that wakes up; rates are only
    re-solved for keys sharing a resource, transitively, with a change, and a key alone on its
    resources needs no water-filling.

    NetStorm's auxiliary dispatch is decided when the chunk is ready, from the sender's counts at
    that moment, by the rule the agents' chunk engine sends by (core.dispatch.Dispatch.pick): a
    send on a tree edge with auxiliary routes takes the first route whose in-transit count is below
    `aux_queue_length` once the primary path's count reaches `primary_busy_bound`, else the
    primary. A transfer is in transit from the moment it is handed to its FIFO (queued ones count)
    until its hop ack is back: its last byte left, crossed the first link, and the ack crossed the
    link back (overlay.peers.Overlay.in_transit). Sends whose key such a decision reads become _SEND
    events at their ready time, so they are decided (and counted) in time order; ties go in chunk
    order, as a node's ready chunks leave live."""

    def __init__(self, m: Model, dispatch: Dispatch = DISPATCH, *, cap_rates: bool = True,
                 cpu_budget_s: float | None = None) -> None:
        """cpu_budget_s: the CPU seconds (this thread's) the run may take; past them it raises
        SimulationOverBudget (checked every BUDGET_EVERY instants)."""
        self.m = m
        self._deadline = None if cpu_budget_s is None else time.thread_time() + cpu_budget_s
        self._budget = cpu_budget_s
        self._instants = 0  # event instants handled, over every advance() (the budget is looked at by them)
        self.dispatch = dispatch
        self.cap = list(m.cap)
        self.key_cap: list[float] = []  # m.key_cap (the plans' rates), overridden by the scheduler's cap rates
        # the scheduler's per-flow rates at node caps (live: agents REGISTER their caps), or None: no caps
        self.caps = CapRates.of(m, self._set_key_cap, cap_rates, lambda: self.cap)
        self.busy: list[bool] = []
        self.rate: list[float] = []
        self.left: list[float] = []  # bytes of the head transfer still to send, as of since[k]
        self.since: list[float] = []
        self.head: list[tuple[float, int, int, int]] = []
        self.version: list[int] = []
        # per FIFO (class, origin, destination, first hop): (ready, chunk, kind, key); one key active at a time
        self.queue: list[list[tuple[float, int, int, int]]] = []
        self.fifo_busy: list[bool] = []
        self.wake_at: list[float] = []
        self.key_bytes: list[int] = []
        # per key: its head transfer arrived while its class had nothing on its first link (sharing.py: served first)
        self.fresh: list[bool] = []
        self.in_transit: list[int] = []  # of counted keys only
        self.sends: dict[int, tuple[int, int, int]] = {}  # pending _SEND: seq -> (primary key, kind, group)
        self.seq = 0
        self.aux_bytes = 0
        self.res_active: list[set[int]] = [set() for _ in self.cap]
        self.res_since = [0.0] * m.nlinks
        self.res_busy = [0.0] * m.nlinks
        self.events: list[tuple[float, int, int, int]] = []
        self.changed: set[int] = set()
        self.changed_res: set[int] = set()
        self.now = m.t0
        # per task: when each node index got its last chunk's final value, how many it got, and how many
        # (receiver, chunk) finals are still to come
        self.done: list[list[float]] = []
        self.finals: list[list[int]] = []
        self.missing: list[int] = []
        self.is_receiver: list[list[bool]] = []
        self.task_bytes: list[dict[int, int]] = []  # per task: key -> bytes
        # (task, receiver's node index or -1 for the task's end, time) found since advance() last returned
        self.ended: list[tuple[int, int, float]] = []
        self.pending: list[list[int]] = []
        self.arrived: list[list[float]] = []
        for i, ev in enumerate(m.later_events):
            heapq.heappush(self.events, (ev[0], _RATE, i, 0))
        for t_idx in range(len(m.tasks)):
            self._start(t_idx)

    def add(self, task: TaskRun) -> int:
        """A task joining the run (job mode); it must start no earlier than the engine's clock."""
        if task.start_s < self.now:
            raise ValueError(f"task {task.key!r} starts at {task.start_s}, before the clock ({self.now})")
        t_idx = self.m.add_task(task)
        self._start(t_idx)
        return t_idx

    def _start(self, t_idx: int) -> None:
        m = self.m
        n = len(m.nodes)
        grow = len(m.key_path) - len(self.busy)
        self.busy += [False] * grow
        self.rate += [0.0] * grow
        self.left += [0.0] * grow
        self.since += [0.0] * grow
        self.head += [(0.0, 0, 0, 0)] * grow
        self.version += [0] * grow
        self.key_bytes += [0] * grow
        self.fresh += [False] * grow
        self.in_transit += [0] * grow
        self.key_cap += m.key_cap[len(self.key_cap):]
        grow = len(m.fifo_of) - len(self.queue)
        self.queue += [[] for _ in range(grow)]
        self.fifo_busy += [False] * grow
        self.wake_at += [_INF] * grow
        task = m.tasks[t_idx]
        if self.caps is not None and any(g.classed for g in task.plan.groups):
            heapq.heappush(self.events, (task.start_s, _CAPS, t_idx, _STARTS))
        start_at = m.begin[t_idx]  # every node's own contribution is there once it began
        self.done.append([task.start_s] * n)
        self.finals.append([0] * n)
        recv = [False] * n
        for r in task.plan.receiver_set:
            recv[m.ix[r]] = True
        self.is_receiver.append(recv)
        self.missing.append(sum(recv) * len(task.plan.layout))
        self.task_bytes.append({})
        base = m.chunk_base[t_idx]
        nchunks = len(task.plan.layout)
        for c in range(base, base + nchunks):
            self.pending.append(list(m.nkids[m.group_of[c]]))
            self.arrived.append(list(start_at))
        for c in range(base, base + nchunks):  # leaves hand out their chunks in chunk order
            g_idx = m.group_of[c]
            kids = m.nkids[g_idx]
            agg = m.agg_key[g_idx]
            if m.direct[g_idx]:  # all-to-all: members send their own chunk to every other receiver
                for v, keys in enumerate(m.direct_keys[g_idx]):
                    for k in keys:
                        self._send(k, start_at[v], c, _AGG, g_idx)
                for v in range(n):
                    if kids[v] == 0 and self.is_receiver[t_idx][v]:
                        self._final(v, c, g_idx, start_at[v])
                continue
            for v in range(n):  # nodes only on the broadcast side (multicast receivers) hand out nothing
                if kids[v] == 0 and (agg[v] >= 0 or v == m.root[g_idx]):
                    self._ready(v, c, g_idx, start_at[v])

    def run(self) -> TasksPrediction:
        """Every task to the end."""
        self.advance(_INF, stop_at_end=False)
        return self.result()

    def result(self) -> TasksPrediction:
        return _prediction(self)

    def advance(self, until: float, stop_at_end: bool = True) -> list[tuple[Hashable, int | None, float]]:
        """Handle every event up to `until` (inclusive); with stop_at_end, stop after the first instant
        at which a receiver's or a task's end became known. Returns what became known: (task key,
        receiver, time it holds the full result) and (task key, None, the task's end). A time may lie
        ahead of the clock (arrivals are resolved when their transfer ends), never behind it."""
        events, version, wake_at = self.events, self.version, self.wake_at
        while events and events[0][0] <= until and not (stop_at_end and self.ended):
            t = events[0][0]
            self.now = t
            self._instants += 1
            if (self._deadline is not None and self._instants % BUDGET_EVERY == 0
                    and time.thread_time() > self._deadline):
                raise SimulationOverBudget(f"over its budget of {self._budget:g} CPU-s at {t:.3f} s simulated")
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
                elif kind == _CAPS:
                    assert self.caps is not None
                    if ver == _STARTS:
                        self.caps.starts(k)
                    else:
                        self.caps.ends(k)
                else:
                    _, a, b, mbps = self.m.later_events[k]
                    r = self.m.res_of_event(a, b)
                    self.cap[r] = mbps * MBIT
                    self.changed_res.add(r)
            if self.changed or self.changed_res:
                self._reallocate(t)
        if until < _INF and not (stop_at_end and self.ended):
            self.now = max(self.now, until)
        ended, self.ended = self.ended, []
        m = self.m
        return [(m.tasks[i].key, None if v < 0 else m.nodes[v], e) for i, v, e in ended]

    def _set_key_cap(self, k: int, bps: float) -> None:
        if self.key_cap[k] != bps:
            self.key_cap[k] = bps
            if self.busy[k]:
                self.changed.add(k)

    # chunk logic
    def _ready(self, v: int, c: int, g: int, t: float) -> None:
        """Node v holds every aggregation child's copy of chunk c at time t."""
        if v == self.m.root[g] or self.m.direct[g]:
            self._final(v, c, g, t)
        else:
            self._send(self.m.agg_key[g][v], t, c, _AGG, g)

    def _final(self, v: int, c: int, g: int, t: float) -> None:
        t_idx = self.m.group_task[g]
        done = self.done[t_idx]
        if t > done[v]:
            done[v] = t
        finals = self.finals[t_idx]
        finals[v] += 1
        if self.is_receiver[t_idx][v]:
            self.missing[t_idx] -= 1
            if finals[v] == len(self.m.tasks[t_idx].plan.layout):
                self.ended.append((t_idx, v, done[v]))
            if not self.missing[t_idx]:
                recv = self.is_receiver[t_idx]
                end = max(d for d, r in zip(done, recv, strict=True) if r)
                self.ended.append((t_idx, -1, end))
                if self.caps is not None and self.caps.holds(t_idx):  # live: recorded, its share to the others
                    heapq.heappush(self.events, (end, _CAPS, t_idx, _ENDS))
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
        if self.m.groups[g].fcfs:  # flow-level FCFS: the class's deadline is its first chunk's ready time
            self.m.arrived(self.m.group_class[g][kind], t)
        if self.m.counted[k]:  # decided, and counted, when the clock gets there
            self.seq += 1
            self.sends[self.seq] = (k, kind, g)
            heapq.heappush(self.events, (t, _SEND, c, self.seq))
        else:
            self._enqueue(k, t, c, kind)

    def _dispatch(self, c: int, seq: int, t: float) -> None:
        k, kind, g = self.sends.pop(seq)
        aux = self.dispatch.pick(k, self.m.aux_keys[g].get(k), self.in_transit.__getitem__)
        if aux is not None:
            k = aux
            self.aux_bytes += self.m.chunk_bytes[c]
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
        self.fresh[k] = self._arrives_fresh(k, self.left[k])
        self.since[k] = t
        self.busy[k] = True
        self.changed.add(k)
        for r in self.m.key_res[k]:
            act = self.res_active[r]
            if not act and r < self.m.nlinks:
                self.res_since[r] = t
            act.add(k)

    def _arrives_fresh(self, k: int, size: float) -> bool:
        """Start-time fair queuing (overlay.classes): a class that was idle on a link starts at the
        link's virtual time, so its first segment goes before the backlogged classes' next ones,
        whatever its weight. Modelled for transfers of one segment at most (their whole transfer)."""
        m = self.m
        if not m.classed or size > m.segment:
            return False
        cls = m.key_class[k]
        return not any(m.key_class[o] == cls for o in self.res_active[m.key_res[k][0]] if o != k)

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
        tb = self.task_bytes[m.chunk_task[c]]
        tb[k] = tb.get(k, 0) + size
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
            if self.fresh[k]:  # its class stays backlogged: the next transfer waits its weighted turn
                self.fresh[k] = False
                self.changed.add(k)
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
        key_cap = self.key_cap
        new = [min(key_cap[k], *[cap[r] for r in key_res[k]]) for k in single]
        if shared and self.m.classed:  # classes (weights, priorities, deadlines, rates): sim/sharing.py
            keys = keys + shared
            new.extend(class_rates(self.m, shared, cap, key_cap, self.fresh).tolist())
        elif shared:  # one water-filling for all shared components: max-min decomposes over them
            keys = keys + shared
            pair_flow, res_ids = without_loose_caps(*self.m.pairs(shared), np.asarray(cap), self.m.nlinks, len(shared))
            uniq, pair_res = np.unique(res_ids, return_inverse=True)
            new.extend(max_min_rates(pair_flow, pair_res, np.asarray(cap)[uniq], len(shared)).tolist())
        self._apply(t, keys, new)

    def _apply(self, t: float, keys: list[int], new: list[float]) -> None:
        """New rates from time t: what each key had left is charged at its old rate, its end re-timed."""
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


def exact_cost_s(m: Model) -> float:
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


def _prediction(ex: Exact) -> TasksPrediction:
    """Every task's prediction from the engine's books once it ran to the end (SimulationStalled where
    a receiver never got every chunk)."""
    m = ex.m
    for t_idx, task in enumerate(m.tasks):
        if ex.missing[t_idx]:
            stuck = [m.nodes[v] for v, r in enumerate(ex.is_receiver[t_idx])
                     if r and ex.finals[t_idx][v] < len(task.plan.layout)]
            held = any(b and ex.key_cap[k] == 0 for k, b in enumerate(ex.busy))
            why = "the scheduler's cap rates held a flow for good" if held else "a rate stayed at 0"
            raise SimulationStalled(f"task {task.key!r}: receivers {stuck[:8]} never received every chunk "
                                    f"({why})")
    link_of_res = {r: link for link, r in m.res_of_link.items()}
    busy = {link_of_res[r]: s for r, s in enumerate(ex.res_busy) if s > 0}
    out = {}
    for t_idx, task in enumerate(m.tasks):
        full = len(task.plan.layout)
        done = {m.nodes[v]: d for v, d in enumerate(ex.done[t_idx]) if ex.finals[t_idx][v] == full}
        recv = {r: done[r] for r in task.plan.receiver_set}
        kb = [0] * len(m.key_path)
        for k, b in ex.task_bytes[t_idx].items():
            kb[k] = b
        out[task.key] = TaskPrediction(task.start_s, max(recv.values()), recv, done, m.link_bytes(kb))
    return TasksPrediction(out, m.link_bytes(ex.key_bytes), busy, "exact", ex.aux_bytes)
