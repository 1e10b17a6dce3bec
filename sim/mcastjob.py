"""Multicast jobs on the big-switch model (sim/switch.py): one BSP round, or an SSP job over a time budget.

The receiver choice is the caller's (a `Chooser`: SelMcast's Algorithm 2, Orpheus, ...), so the
simulator stays pure; it hands the chooser what a centralised manager knows on each READY — the
tasks in flight, their receivers, what each still has to deliver (exact here), the port capacities
now, and each sender's slack tau — and applies the answer: the new task's receivers, receivers
dropped from running tasks, and every task's priority level.

SSP worker lifecycle (digest 000 §2.4, as scheduler/progress/ssp.py runs it live): a worker computes
iteration k (seeded draws of a core.compute.ComputeModel), says READY and multicasts; iteration k is
*done* once that multicast is over; it may compute k + 1 once its own multicast is over and
k + 1 <= min_u d_u + 1 + s. Utilisation = share of the observed window a worker computes, averaged
over workers; scale = receivers that got the whole delivery per multicast, over n.

tau_i (how long worker i would be blocked by the bound if its multicast finished now) uses the true
remaining compute of the stragglers (the simulator knows it; digest §7.2 item 9) plus, per further
iteration they need, the workers' mean compute and an uplink-time estimate of a multicast.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from core.compute import ComputeModel
from core.sspview import Chooser, SspView, blocked_for

from .switch import Switch


@dataclass
class SspResult:
    utilisation: float  # mean over workers of compute time / observed window
    scale: float  # mean over ended multicasts of delivered receivers / n
    tasks: int  # multicasts that ended within the budget
    iterations: dict[int, int]  # per worker: iterations done (its multicast over)
    drops: int  # receivers dropped from running multicasts
    max_ahead: int  # the most iterations any worker computed beyond the slowest's done count + 1
    per_worker: dict[int, float]  # utilisation per worker


def bsp_round(x: np.ndarray, b_in: Sequence[float], b_out: Sequence[float], volume: Sequence[float],
              mode: str = "l3", sharing: str = "maxmin") -> float:
    """One BSP round: every sender i multicasts v_i to its row of x at once; the time until every
    selected delivery is complete (a coflow's completion)."""
    sw = Switch(b_in, b_out, sharing=sharing)
    for i in range(len(volume)):
        r = np.flatnonzero(x[i])
        if len(r):
            sw.start(i, i, r, float(volume[i]), mode)
    end = 0.0
    while sw.active():
        for _, j, t in sw.advance(np.inf):
            if j is None:
                end = max(end, t)
        if not sw.active() or sw.next_time() == np.inf:
            break
    if sw.active():
        raise RuntimeError("a port at capacity 0 for good: the round never completes")
    return end


_COMPUTED = 0


def simulate_ssp(chooser: Chooser, compute: ComputeModel, b_in: Sequence[float], b_out: Sequence[float],
                 volume: Sequence[float], *, mode: str = "l3", staleness: int = 4, budget_s: float = 600.0,
                 warmup_s: float = 0.0, events: Iterable[tuple[float, int, str, float]] = ()) -> SspResult:
    """An SSP job of len(volume) workers from time 0 to budget_s; utilisation is observed over
    [warmup_s, budget_s]. events: port capacity changes (t, worker, "up" | "down", capacity)."""
    if staleness < 0:
        raise ValueError(f"staleness: must be >= 0, got {staleness}")
    if not 0 <= warmup_s < budget_s:
        raise ValueError(f"warmup_s: must be in [0, budget_s), got {warmup_s}")
    return _Ssp(chooser, compute, b_in, b_out, volume, mode, staleness, budget_s, warmup_s, events).run()


class _Ssp:
    def __init__(self, chooser: Chooser, compute: ComputeModel, b_in: Sequence[float], b_out: Sequence[float],
                 volume: Sequence[float], mode: str, s: int, budget: float, warmup: float,
                 events: Iterable[tuple[float, int, str, float]]) -> None:
        self.chooser, self.compute, self.mode, self.s = chooser, compute, mode, s
        self.budget, self.warmup = budget, warmup
        self.v = np.asarray(volume, dtype=float)
        self.n = n = len(self.v)
        self.sw = Switch(b_in, b_out, sharing=chooser.sharing, events=events)
        self.mean = np.array([compute.mean_of(w) for w in range(n)])
        self.done = np.full(n, -1)  # last iteration whose multicast is over
        self.busy: dict[int, tuple[int, float, float]] = {}  # worker -> (iteration, start, end) computing
        self.task: dict[int, int] = {}  # worker -> the iteration its multicast in flight carries
        self.waiting: dict[int, int] = {}  # worker -> the iteration it may not compute yet (the bound)
        self.computed = np.zeros(n)  # compute seconds inside the window
        self.q: list[tuple[float, int, int, tuple[int, int]]] = []
        self.seq = 0
        self.scales: list[float] = []
        self.drops = 0
        self.max_ahead = 0

    def run(self) -> SspResult:
        for w in range(self.n):
            self._compute(w, 0, 0.0)
        while True:
            t_next = min(self.q[0][0] if self.q else np.inf, self.budget)
            found = self.sw.advance(t_next)
            if found:
                for key, j, t in found:
                    if j is None:
                        self._ended(key, t)
                continue
            if not self.q or self.q[0][0] > self.budget:
                break
            t, _, _, (w, k) = heapq.heappop(self.q)
            self._ready(w, k, t)
        for w, (_, start, end) in self.busy.items():  # computing when the budget ran out
            self.computed[w] += max(0.0, min(end, self.budget) - max(start, self.warmup))
        util = self.computed / (self.budget - self.warmup)
        return SspResult(float(util.mean()), float(np.mean(self.scales)) if self.scales else 0.0, len(self.scales),
                         {w: int(self.done[w] + 1) for w in range(self.n)}, self.drops, self.max_ahead,
                         {w: float(u) for w, u in enumerate(util)})

    def _compute(self, w: int, k: int, t: float) -> None:
        floor = int(self.done.min())
        self.max_ahead = max(self.max_ahead, k - (floor + 1))
        end = t + self.compute.draw(w, k)
        self.busy[w] = (k, t, end)
        self.seq += 1
        heapq.heappush(self.q, (end, _COMPUTED, self.seq, (w, k)))

    def _ready(self, w: int, k: int, t: float) -> None:
        _, start, end = self.busy.pop(w)
        self.computed[w] += max(0.0, min(end, self.budget) - max(start, self.warmup))
        view = self._view(w, k, t)
        dec = self.chooser.ready(view)
        for i, j in dec.drops:
            if i in self.task and i != w:
                self.sw.drop(i, j)
                self.drops += 1
        for i, level in dec.levels.items():
            if i in self.task and i != w:
                self.sw.set_level(i, level)
        self.task[w] = k
        recv = [int(j) for j in dec.receivers]
        if recv:
            self.sw.start(w, w, recv, float(self.v[w]), self.mode, dec.levels.get(w, (0.0,)))
            for i in list(self.task):  # a task a drop left with nobody to serve ended now
                if i != w and self.sw.tasks[i].end is not None:
                    self._ended(i, t)
        else:
            self._ended(w, t, started=False)

    def _ended(self, w: int, t: float, started: bool = True) -> None:
        k = self.task.pop(w)
        got: list[int] = []
        if started:
            got = sorted(self.sw.tasks[w].done)
            self.sw.forget(w)
        self.chooser.delivered(w, got)
        self.scales.append(len(got) / self.n)
        self.done[w] = max(self.done[w], k)
        self.waiting[w] = k + 1
        floor = int(self.done.min())
        for u, want in list(self.waiting.items()):
            if want <= min(self.done[u] + 1, floor + 1 + self.s):
                del self.waiting[u]
                self._compute(u, want, t)

    def _view(self, kappa: int, k_kappa: int, now: float) -> SspView:
        n = self.n
        active = np.zeros(n, dtype=bool)
        x = np.zeros((n, n), dtype=bool)
        V = np.zeros((n, n))
        for i in self.task:
            active[i] = True
            for j, left in self.sw.left(i).items():
                x[i, j] = True
                V[i, j] = left
        cap = self.sw.cap
        b_in, b_out = cap[:n].copy(), cap[n:].copy()
        tau = np.zeros(n)
        for i, k in [*self.task.items(), (kappa, k_kappa)]:
            tau[i] = self._blocked_for(k, now, b_in)
        return SspView(now, kappa, active, x, V, self.v, b_in, b_out, tau)

    def _blocked_for(self, k: int, now: float, b_in: np.ndarray) -> float:
        """blocked_for with what the simulator knows: the stragglers' true remaining compute, what
        their multicasts in flight still have to send, and an uplink-time estimate of a multicast."""
        if not np.any(self.done < k - self.s):
            return 0.0
        # an uplink's time for one multicast: one copy (L3), or as many as receivers so far (L7)
        copies = 1.0 if self.mode == "l3" or not self.scales else max(1.0, float(np.mean(self.scales)) * self.n)
        mc = self.v * copies / np.maximum(b_in, 1e-300)
        finish = self.mean + mc  # waiting for the bound: at least one compute and multicast away
        for u, (_, _, end) in self.busy.items():
            finish[u] = max(0.0, end - now) + mc[u]
        for u in self.task:
            left = self.sw.left(u).values() if u in self.sw.tasks else [0.0]
            finish[u] = (max(left, default=0.0) if self.mode == "l3" else sum(left)) / max(b_in[u], 1e-300)
        return blocked_for(k, self.s, self.done, finish, self.mean + mc)
