"""The paper's flow-level model of a non-blocking big switch (SelMcast, digest 000 §1, §3.2), event driven.

Every worker i has an ingress port (its uplink, capacity b^I_i) and an egress port (its downlink,
b^E_i); congestion happens only there. A multicast task of volume v from src is
  L7  one flow per receiver j, on {up src, down j}: each pair at its own rate;
  L3  one flow on {up src} and every receiver's downlink, at one rate (each byte injected once and
      replicated by the network: the slowest receiver sets the pace), all receivers done together.
Flows share ports by
  maxmin    per-flow max-min fairness (progressive filling), the paper's default and Orpheus';
  priority  strict priority, work-conserving (SelMcast SSP): flows in order of their level (EDF on the
            task deadline), each taking the least residual capacity of its ports.
Rates are re-solved whenever a flow starts, ends or is cut (a dropped receiver) or a port's capacity
changes (the fluctuation trace), so the model is exact for piecewise-constant rates. This is the
paper's own simulator, at the scale of its figures (n = 50..200, 10 simulated minutes of SSP, tens
of thousands of tasks), which the chunk-level exact engine (exact.py) cannot reach; the exact engine
replays the same tasks on a big-switch topology where the live runs are checked against it.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

import numpy as np

from core.maxmin import max_min_rates

SHARING = ("maxmin", "priority")
_EPS = 1e-9  # a flow with this share of its volume left is done (float residue of rate x time)


@dataclass
class _Task:
    src: int
    mode: str
    volume: float
    start: float
    level: tuple[float, ...]
    receivers: set[int]  # still to be served (not done, not dropped)
    flows: set[int] = field(default_factory=set)
    done: dict[int, float] = field(default_factory=dict)  # receiver -> when it held everything
    dropped: set[int] = field(default_factory=set)
    end: float | None = None


@dataclass
class _Flow:
    key: Hashable
    src: int
    receivers: list[int]  # L7: one; L3: every receiver still in the task
    left: float
    volume: float
    seq: int


class Switch:
    """A big switch with n workers; capacities in bytes/s (any unit, consistent with the volumes)."""

    def __init__(self, b_in: Iterable[float], b_out: Iterable[float], *, sharing: str = "maxmin",
                 events: Iterable[tuple[float, int, str, float]] = (), t0: float = 0.0) -> None:
        """events: (t, worker, "up" | "down", capacity) changes of one port, in any order."""
        if sharing not in SHARING:
            raise ValueError(f"sharing: must be maxmin or priority, got {sharing!r}")
        up, down = np.asarray(list(b_in), dtype=float), np.asarray(list(b_out), dtype=float)
        if up.shape != down.shape or up.ndim != 1:
            raise ValueError("b_in, b_out: one capacity per worker each")
        if np.any(up < 0) or np.any(down < 0):
            raise ValueError("b_in, b_out: capacities must be >= 0")
        self.n = len(up)
        self.cap = np.concatenate([up, down])
        self.sharing = sharing
        self.now = t0
        self._events: list[tuple[float, int, float]] = []
        for t, node, kind, rate in events:
            if kind not in ("up", "down") or not 0 <= node < self.n or rate < 0:
                raise ValueError(f"events: ({t}, {node}, {kind!r}, {rate}) is no port change")
            self._events.append((float(t), node + (self.n if kind == "down" else 0), float(rate)))
        self._events.sort()
        while self._events and self._events[0][0] <= t0:
            _, port, rate = self._events.pop(0)
            self.cap[port] = rate
        heapq.heapify(self._events)
        self.tasks: dict[Hashable, _Task] = {}
        self._flows: dict[int, _Flow] = {}
        self._seq = 0
        self._dirty = True
        self._ids: list[int] = []  # the flows the arrays below describe, in their order
        self._rate = np.zeros(0)
        self._left = np.zeros(0)  # bytes left per flow (authoritative while _synced is False)
        self._vol = np.zeros(0)
        self._pf = self._pr = np.zeros(0, dtype=np.int64)  # (flow, port) pairs
        self._synced = True
        self._reshaped = True  # flows started, or changed receivers, since the arrays were built
        self._gone: list[int] = []  # rows of flows that ended since
        self.port_bytes = np.zeros(2 * self.n)  # bytes each port carried (an L3 flow counts once per port)

    # --- tasks --------------------------------------------------------------------------------------
    def start(self, key: Hashable, src: int, receivers: Iterable[int], volume: float, mode: str = "l3",
              level: tuple[float, ...] = (0.0,)) -> None:
        """A multicast from src to `receivers` starts now; level orders it under priority sharing
        (lower first; e.g. its absolute deadline)."""
        if key in self.tasks:
            raise ValueError(f"task {key!r} exists")
        if mode not in ("l3", "l7"):
            raise ValueError(f"mode: must be l3 or l7, got {mode!r}")
        recv = sorted(set(int(j) for j in receivers))
        if not recv or src in recv or not all(0 <= j < self.n for j in recv) or not 0 <= src < self.n:
            raise ValueError(f"task {key!r}: src {src}, receivers {recv}: need other workers of 0..{self.n - 1}")
        if not volume > 0:
            raise ValueError(f"task {key!r}: volume must be > 0, got {volume}")
        task = self.tasks[key] = _Task(src, mode, float(volume), self.now, level, set(recv))
        for group in ([recv] if mode == "l3" else [[j] for j in recv]):
            self._seq += 1
            self._flows[self._seq] = _Flow(key, src, list(group), float(volume), float(volume), self._seq)
            task.flows.add(self._seq)
        self._dirty = self._reshaped = True

    def drop(self, key: Hashable, receiver: int) -> None:
        """Receiver leaves a running task: nothing more is sent to it (its partial data is wasted)."""
        task = self.tasks[key]
        if receiver not in task.receivers:
            raise ValueError(f"task {key!r}: {receiver} is not a receiver still being served")
        self._sync()
        task.receivers.discard(receiver)
        task.dropped.add(receiver)
        for fid in list(task.flows):
            f = self._flows[fid]
            if receiver in f.receivers:
                f.receivers.remove(receiver)
                if not f.receivers:
                    del self._flows[fid]
                    task.flows.discard(fid)
        self._dirty = self._reshaped = True
        if not task.flows and task.end is None:
            task.end = self.now

    def set_capacity(self, worker: int, kind: str, rate: float) -> None:
        """A port's capacity from now on (a caller following a measured view, not a trace)."""
        port = worker + (self.n if kind == "down" else 0)
        if kind not in ("up", "down") or not 0 <= worker < self.n or rate < 0:
            raise ValueError(f"set_capacity: ({worker}, {kind!r}, {rate}) is no port capacity")
        if self.cap[port] != rate:
            self.cap[port] = rate
            self._dirty = True

    def set_level(self, key: Hashable, level: tuple[float, ...]) -> None:
        task = self.tasks[key]
        if task.level != level:
            task.level = level
            self._dirty = True

    def left(self, key: Hashable) -> dict[int, float]:
        """Bytes each receiver of the task (still served, or done: 0) has yet to get."""
        task = self.tasks[key]
        self._sync()
        out = dict.fromkeys(task.done, 0.0)
        for fid in task.flows:
            f = self._flows[fid]
            for j in f.receivers:
                out[j] = f.left
        return out

    def active(self) -> list[Hashable]:
        return [k for k, t in self.tasks.items() if t.end is None]

    def forget(self, key: Hashable) -> None:
        """An ended task's record is no longer needed."""
        if self.tasks[key].end is not None:
            del self.tasks[key]

    # --- time -----------------------------------------------------------------------------------------
    def next_time(self) -> float:
        """When the next flow ends or port changes, at the current rates (inf: never)."""
        self._solve()
        t = self._events[0][0] if self._events else np.inf
        if len(self._rate):
            with np.errstate(divide="ignore", over="ignore"):
                dt = np.where(self._rate > 0, self._left / np.maximum(self._rate, 1e-300), np.inf)
            t = min(t, self.now + float(dt.min()))
        return t

    def advance(self, until: float) -> list[tuple[Hashable, int | None, float]]:
        """Run until `until` or the first instant something completes; returns (task, receiver, time)
        for every receiver that got everything and (task, None, time) for every task that ended."""
        out: list[tuple[Hashable, int | None, float]] = []
        while not out:
            t_next = min(self.next_time(), until)
            if t_next == np.inf:
                break
            self._run_to(t_next)
            out = self._complete()
            while self._events and self._events[0][0] <= self.now:
                _, port, rate = heapq.heappop(self._events)
                self.cap[port] = rate
                self._dirty = True
            if self.now >= until:
                break
        return out

    def _run_to(self, t: float) -> None:
        dt = max(0.0, t - self.now)
        # a flow due within the clock's float grain is done (at clock values like the epoch's, a tiny
        # remainder's finish time rounds to now and would never be reached)
        grain = 1e-12 * max(1.0, abs(t)) + 1e-12
        if len(self._ids):
            r = self._rate
            moved = np.where(self._left <= r * (dt + grain), self._left, r * dt)
            moved[r <= 0] = 0.0
            self._left -= moved
            np.add.at(self.port_bytes, self._pr, moved[self._pf])
            self._synced = False
        self.now = max(self.now, t)

    def _sync(self) -> None:
        """The flows' remaining bytes from the arrays the engine runs on."""
        if not self._synced:
            for fid, left in zip(self._ids, self._left.tolist(), strict=True):
                f = self._flows.get(fid)
                if f is not None:
                    f.left = left
            self._synced = True

    def _complete(self) -> list[tuple[Hashable, int | None, float]]:
        out: list[tuple[Hashable, int | None, float]] = []
        if not len(self._ids):
            return out
        self._sync()
        for k in np.flatnonzero(self._left <= _EPS * self._vol).tolist():
            fid = self._ids[k]
            f = self._flows.get(fid)
            if f is None:
                continue
            self._gone.append(k)
            task = self.tasks[f.key]
            for j in f.receivers:
                task.done[j] = self.now
                task.receivers.discard(j)
                out.append((f.key, j, self.now))
            del self._flows[fid]
            task.flows.discard(fid)
            self._dirty = True
            if not task.flows:
                task.end = self.now
                out.append((f.key, None, self.now))
        return out

    def _solve(self) -> None:
        if not self._dirty:
            return
        self._sync()
        self._dirty = False
        if self._reshaped:  # flows started or lost receivers: the arrays anew
            self._reshaped = False
            self._ids = list(self._flows)
            flows = [self._flows[f] for f in self._ids]
            self._left = np.array([f.left for f in flows], dtype=float)
            self._vol = np.array([f.volume for f in flows], dtype=float)
            self._pf = np.fromiter((i for i, f in enumerate(flows) for _ in range(1 + len(f.receivers))),
                                   dtype=np.int64)
            self._pr = np.fromiter((p for f in flows for p in (f.src, *(self.n + j for j in f.receivers))),
                                   dtype=np.int64)
        elif self._gone:  # only ended flows left: drop their rows (the common case, and the cheap one)
            keep = np.ones(len(self._ids), dtype=bool)
            keep[self._gone] = False
            index = np.cumsum(keep) - 1
            pairs = keep[self._pf]
            self._pf, self._pr = index[self._pf[pairs]], self._pr[pairs]
            self._left, self._vol = self._left[keep], self._vol[keep]
            self._ids = [f for f, k in zip(self._ids, keep.tolist(), strict=True) if k]
        self._gone = []
        nf = len(self._ids)
        flows = [self._flows[f] for f in self._ids]
        if not nf:
            self._rate = np.zeros(0)
            return
        if self.sharing == "maxmin":
            self._rate = max_min_rates(self._pf, self._pr, self.cap, nf)
            return
        left = self.cap.copy()
        rate = np.zeros(nf)
        order = sorted(range(nf), key=lambda i: (self.tasks[flows[i].key].level, flows[i].seq))
        for i in order:
            f = flows[i]
            ports = [f.src, *(self.n + j for j in f.receivers)]
            r = max(0.0, min(left[p] for p in ports))
            rate[i] = r
            if r > 0:
                for p in ports:
                    left[p] -= r
        self._rate = rate
