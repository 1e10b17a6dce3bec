"""Multicast progress models with receiver selection (SelMcast, seed 000): BSP and SSP over multicasts.

Every worker multicasts its parameters after every iteration (schemes `mcast`: L7, `mcast-l3`: L3);
a chooser (scheduler/selection/choosers.py) decides the receivers: `selmcast` (Algorithms 1 and 2),
`orpheus` (forced pairs, then random up to p) or `all`. Bandwidth comes from the view's node caps (a
big switch's ports; `caps`: as the nodes declare them, the default, or as passively measured, a lower
bound where a cap never binds: scheduler/view.py), remaining volumes from the scheduler's own
replay of the tasks in flight on those caps (sim/switch.py), re-anchored by every receiver's
TASK_DONE. Rule "bound": a worker waits for a GO before its next iteration.

    mcast-bsp   at the barrier (every worker READY for round r) Algorithm 1 / Orpheus picks every
                sender's receivers at once; one multicast task per sender; GO(r + 1) to all once every
                task of round r is over. Round completion = first task start to last task end.
    mcast-ssp   on every READY Algorithm 2 / Orpheus picks the ready worker's receivers (SelMcast may
                drop receivers of running tasks: shrink-only) and, for SelMcast, its deadline: its task
                is a traffic class with that deadline (EDF where flows meet at node caps); the SSP
                bound of ssp.py (staleness s) decides the GOs.
Per round (BSP) and per task (SSP), what was chosen and what became of it is in `rounds` / `tasks`
and on the timeline (`mcast_round`, `mcast_task`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.progress import Go
from core.sspview import SspView, blocked_for
from sim.switch import Switch

from ..selection import choosers
from ..tasks import JobState, TaskRecord
from .base import Control, Model, register
from .ssp import Ssp

MBIT = 1e6 / 8
EWMA = 0.3  # weight of a worker's newest compute time in its estimate


@dataclass
class RoundLog:
    """One BSP round: what was chosen, when it ran, what was delivered."""

    round: int
    receivers: dict[int, list[int]]  # sender -> receivers chosen
    forced: int  # forced pairs (D) at the selection
    selection_s: float  # the chooser's own time
    tasks: dict[int, int] = field(default_factory=dict)  # task id -> sender
    delivered: dict[int, list[int]] = field(default_factory=dict)  # sender -> receivers that got all of it
    forced_served: int = 0
    t_start: float | None = None
    t_end: float | None = None

    @property
    def completion_s(self) -> float | None:
        return None if self.t_start is None or self.t_end is None else self.t_end - self.t_start

    @property
    def scale(self) -> float:
        """Receivers per multicast task (the paper's scale, before dividing by n)."""
        return float(np.mean([len(r) for r in self.receivers.values()])) if self.receivers else 0.0


class _Choosing:
    """What both models share: the workers (indices for the chooser), its caps from the view, the chooser."""

    caps = "declared"  # where the ports' bandwidth comes from: the view's declared or measured caps

    def _setup(self, ctl: Control, js: JobState, select: str, p: int | None, options: Mapping[str, Any]) -> None:
        self.workers = list(ctl.alive())
        self.ix = {w: i for i, w in enumerate(self.workers)}
        n = len(self.workers)
        mode = js.spec.options.get("mode", "l7")
        self.p = round(0.3 * n) if p is None else int(p)
        self.chooser = choosers.make(select, n, self.p, mode=mode, **options)
        self.volume = np.full(n, float(js.spec.params * 4))

    def _bandwidth(self, ctl: Control) -> tuple[np.ndarray, np.ndarray]:
        """Every worker's uplink and downlink in bytes/s, as the view knows them; a worker without a
        cap in the view is not limited by the switch (its largest known port stands in)."""
        up = [ctl.view.cap(w, "up", self.caps) for w in self.workers]
        down = [ctl.view.cap(w, "down", self.caps) for w in self.workers]
        known = [c for c in up + down if c is not None] or [1e3]
        top = max(known)
        return (np.array([top if c is None else c for c in up]) * MBIT,
                np.array([top if c is None else c for c in down]) * MBIT)


def _check(select: str, caps: str) -> None:
    if select not in choosers.SCHEMES:
        raise ValueError(f"select: unknown {select!r}; known: {', '.join(choosers.SCHEMES)}")
    if caps not in ("declared", "measured"):
        raise ValueError(f"caps: declared or measured, got {caps!r}")


@register
class McastBsp(_Choosing, Model):
    name = "mcast-bsp"
    rule = "bound"
    multicasts = True  # forms one-source multicasts (schemes mcast, mcast-l3) ...
    reduces = False  # ... and nothing else
    groups = "multicast"

    def __init__(self, select: str = "selmcast", p: int | None = None, k: int | None = 4, seed: int = 1,
                 caps: str = "declared", **_: Any) -> None:
        _check(select, caps)
        self.select, self.p_opt, self.k, self.seed, self.caps = select, p, k, seed, caps
        self.barrier: dict[int, set[int]] = {}
        self.rounds: list[RoundLog] = []
        self._of_task: dict[int, RoundLog] = {}
        self.violations = 0

    def start(self, ctl: Control, js: JobState) -> None:
        self._setup(ctl, js, self.select, self.p_opt, {"k": self.k, "seed": self.seed})

    def staleness(self) -> int | None:
        return 0  # lockstep: a worker applies the models of the round it just finished

    def ready(self, ctl: Control, js: JobState, node: int, rnd: int, have: set[int]) -> None:
        if self.rounds and rnd > self.rounds[-1].round + 1 or not self.rounds and rnd > 0:
            self.violations += 1  # computed a round no GO allowed
        self.barrier.setdefault(rnd, set()).add(node)
        self._maybe_round(ctl, js, rnd)

    def _maybe_round(self, ctl: Control, js: JobState, rnd: int) -> None:
        alive = set(ctl.alive()) & set(self.workers)
        if rnd not in self.barrier or not alive <= self.barrier[rnd]:
            return
        del self.barrier[rnd]
        b_in, b_out = self._bandwidth(ctl)
        forced = self.chooser.rule.forced()
        t = time.perf_counter()
        x = self.chooser.bsp(b_in, b_out, self.volume)
        log = RoundLog(rnd, {}, int(forced.sum()), time.perf_counter() - t)
        self.rounds.append(log)
        self._forced = forced
        for i, w in enumerate(self.workers):
            if w not in alive:
                continue
            recv = [self.workers[j] for j in np.flatnonzero(x[i]) if self.workers[j] in alive]
            log.receivers[w] = recv
            if recv:
                task = ctl.form(js, (w,), recv, rnd, iters={w: rnd})
                log.tasks[task.id] = w
                self._of_task[task.id] = log
            else:
                log.delivered[w] = []
        self._maybe_over(ctl, js, log)

    def task_done(self, ctl: Control, js: JobState, rec: TaskRecord) -> None:
        log = self._of_task.pop(rec.task, None)
        if log is None:
            return
        w = log.tasks[rec.task]
        got = [] if rec.aborted else sorted(set(rec.receivers) - set(rec.dropped))
        log.delivered[w] = got
        log.forced_served += sum(1 for j in got if self._forced[self.ix[w], self.ix[j]])
        if not rec.aborted:
            log.t_start = rec.t_start if log.t_start is None else min(log.t_start, rec.t_start)
            log.t_end = rec.t_end if log.t_end is None else max(log.t_end, rec.t_end)
        self._maybe_over(ctl, js, log)

    def _maybe_over(self, ctl: Control, js: JobState, log: RoundLog) -> None:
        if len(log.delivered) < len(log.receivers):
            return
        for w, got in log.delivered.items():
            self.chooser.delivered(self.ix[w], [self.ix[j] for j in got])
        ctl.note_event("mcast_round", job=js.job, round=log.round, scheme=self.select, scale=log.scale,
                       completion_s=log.completion_s, forced=log.forced, forced_served=log.forced_served,
                       selection_s=log.selection_s, receivers={str(w): r for w, r in log.receivers.items()})
        if log.round + 1 < js.rounds:
            for w in ctl.alive():
                ctl.go(js, log.round + 1, w)

    def lost(self, ctl: Control, js: JobState, node: int) -> None:
        for rnd in list(self.barrier):
            self._maybe_round(ctl, js, rnd)


@dataclass
class _Live:
    """A multicast in flight, as the SSP model follows it."""

    task: int
    k: int
    receivers: set[int]  # chosen, not dropped (node ids)
    started: float


@register
class McastSsp(Ssp, _Choosing):
    name = "mcast-ssp"
    rule = "bound"
    multicasts = True
    reduces = False

    def __init__(self, staleness: int = 4, select: str = "selmcast", p: int | None = None, k: int | None = 4,
                 eta: float = 0.75, seed: int = 1, caps: str = "declared", **_: Any) -> None:
        super().__init__(staleness)
        _check(select, caps)
        self.select, self.p_opt, self.k, self.eta, self.seed, self.caps = select, p, k, eta, seed, caps
        self.live: dict[int, _Live] = {}  # sender -> its multicast in flight
        self.tasks: list[dict[str, Any]] = []  # per ended multicast: sender, k, chosen, delivered, dropped
        self.free_t: dict[int, float] = {}  # worker -> when it could start its current computation
        self.compute_est: dict[int, float] = {}  # worker -> EWMA of its compute time
        self.selection_s: list[float] = []

    def start(self, ctl: Control, js: JobState) -> None:
        options: dict[str, Any] = {"k": self.k, "seed": self.seed}
        if self.select == "selmcast":
            options["eta"] = self.eta
        self._setup(ctl, js, self.select, self.p_opt, options)
        b_in, b_out = self._bandwidth(ctl)
        # the scheduler's own replay of the multicasts in flight: what each receiver still has to get
        self.model = Switch(b_in, b_out, sharing=self.chooser.sharing, t0=time.time())
        now = time.time()
        self.free_t = dict.fromkeys(self.workers, now)
        super().start(ctl, js)

    def ready(self, ctl: Control, js: JobState, node: int, rnd: int, have: set[int]) -> None:
        if rnd > self.allowed.get(node, -1):
            self.violations += 1
        now = time.time()
        took = now - self.free_t.get(node, now)
        old = self.compute_est.get(node)
        self.compute_est[node] = took if old is None else (1 - EWMA) * old + EWMA * took
        view = self._view(ctl, js, node, rnd, now)
        t = time.perf_counter()
        dec = self.chooser.ready(view)
        self.selection_s.append(time.perf_counter() - t)
        recv = [self.workers[j] for j in dec.receivers if self.workers[j] in ctl.alive()]
        if not recv:
            self._done(ctl, js, node, rnd)
            return
        options = None
        if self.chooser.sharing == "priority" and self.ix[node] in dec.levels:
            deadline = max(1e-3, dec.levels[self.ix[node]][0] - now)  # EDF where flows meet at caps
            options = {"sharing": {"deadline_s": deadline}}
        task = ctl.form(js, (node,), recv, rnd, iters={node: rnd}, options=options)
        self.live[node] = _Live(task.id, rnd, set(recv), now)
        self.model.start(node, self.ix[node], [self.ix[j] for j in recv], float(self.volume[self.ix[node]]),
                         js.spec.options.get("mode", "l7"))
        for i, j in dec.drops:  # shrink-only: these receivers of running multicasts get nothing more
            src, dst = self.workers[i], self.workers[j]
            lv = self.live.get(src)
            if lv is None or src == node or dst not in lv.receivers:
                continue
            t_ = js.tasks.get(lv.task)
            if t_ is None or t_.recorded_t is not None or t_.version is None or dst in t_.done:
                continue
            lv.receivers.discard(dst)
            if src in self.model.tasks and j in self.model.tasks[src].receivers:
                self.model.drop(src, j)
            ctl.drop_receiver(js, lv.task, dst)  # may record the task at once (nobody left to wait for)

    def task_done(self, ctl: Control, js: JobState, rec: TaskRecord) -> None:
        for node, k in rec.iters.items():
            lv = self.live.get(node)
            if lv is not None and lv.task == rec.task:
                del self.live[node]
                got = [] if rec.aborted else sorted(set(rec.receivers) - set(rec.dropped))
                self.chooser.delivered(self.ix[node], [self.ix[j] for j in got])
                self.tasks.append({"sender": node, "k": k, "delivered": got, "dropped": list(rec.dropped),
                                   "round_s": rec.round_s})
                if node in self.model.tasks:
                    for j in list(self.model.tasks[node].receivers):
                        self.model.drop(node, j)
                    self.model.forget(node)
                ctl.note_event("mcast_task", job=js.job, task=rec.task, sender=node, round=k, scheme=self.select,
                               receivers=got, dropped=list(rec.dropped))
        super().task_done(ctl, js, rec)

    def _advance(self, ctl: Control, js: JobState, gos: Sequence[Go]) -> None:
        super()._advance(ctl, js, gos)
        now = time.time()
        for g in gos:  # a worker may start its next computation from now
            self.free_t[g.worker] = now

    def _view(self, ctl: Control, js: JobState, kappa: int, k: int, now: float) -> SspView:
        """The manager's picture on kappa's READY: the view's caps, the replay's remaining volumes
        (0 for receivers that reported TASK_DONE), and each sender's slack tau."""
        n = len(self.workers)
        b_in, b_out = self._bandwidth(ctl)
        for i in range(n):
            self.model.set_capacity(i, "up", float(b_in[i]))
            self.model.set_capacity(i, "down", float(b_out[i]))
        while self.model.active() and self.model.now < now:
            self.model.advance(now)
        self.model.now = max(self.model.now, now)
        active = np.zeros(n, dtype=bool)
        x = np.zeros((n, n), dtype=bool)
        V = np.zeros((n, n))
        for w, lv in self.live.items():
            i = self.ix[w]
            active[i] = True
            t_ = js.tasks.get(lv.task)
            reported = set(t_.done) if t_ is not None else set()
            left = self.model.left(w) if w in self.model.tasks else {}
            for r in lv.receivers:
                j = self.ix[r]
                x[i, j] = True
                if r not in reported:
                    # not reported yet: the replay's estimate, never quite 0 (it is still coming)
                    V[i, j] = max(left.get(j, 0.0), 1.0)
        tau = self._tau(self.ix[kappa], k, now, b_in)
        return SspView(now, self.ix[kappa], active, x, V, self.volume, b_in, b_out, tau)

    def _tau(self, kappa: int, k: int, now: float, b_in: np.ndarray) -> np.ndarray:
        """Per sender in flight (and kappa, whose iteration is k), how long the bound would hold it:
        blocked_for with the scheduler's estimates (EWMA compute times minus what has elapsed)."""
        n = len(self.workers)
        done = np.array([self.done.get(w, 10**9) for w in self.workers])
        mean = np.array([self.compute_est.get(w, 0.0) for w in self.workers])
        copies = 1.0 if self.chooser.mode == "l3" else float(self.p)
        mc = self.volume * copies / np.maximum(b_in, 1e-300)
        finish = mean + mc
        for w in self.workers:
            i = self.ix[w]
            if w in self.live:
                left = self.model.left(w).values() if w in self.model.tasks else [0.0]
                finish[i] = (max(left, default=0.0) if copies == 1.0 else sum(left)) / max(b_in[i], 1e-300)
            elif self.allowed.get(w, -1) > self.done.get(w, -1):  # computing since free_t
                finish[i] = max(0.0, mean[i] - (now - self.free_t.get(w, now))) + mc[i]
        tau = np.zeros(n)
        for w, lv in self.live.items():
            tau[self.ix[w]] = blocked_for(lv.k, self.s, done, finish, mean + mc)
        tau[kappa] = blocked_for(k, self.s, done, finish, mean + mc)
        return tau
