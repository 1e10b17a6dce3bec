"""Selective reduce (seed 003) as a progress model: the controller of core.selective, live.

The same decision the simulator's job mode drives (core.progress's `selective`, around core.selective's
Controller) decides here; this module only feeds it the scheduler's events and forms the tasks it asks for:

    READY(node, k)   controller.ready: the worker joins the ready queue (P-Reduce: the first p go;
                     selective reduce: BAG + bpaWR; all-reduce: once everyone is there)
    a task recorded  controller.done: its members resumed training when each held the result (the
                     record's spans, on the agents' synced clocks); aborted: they queue again
    every dt         while a group waits on bpaWR's advice, a timer on the scheduler's loop ticks it

A launch is a task of the group's members, each contributing its own iteration, planned by the job's
scheme (ring by default: the paper's weighted ring; any planner, e.g. netstorm, mst) and weighted by
the controller (staleness weights summing to 1: the receivers hold the weighted average). A job of
the synthetic integer workload keeps uniform weights (a plain sum, exact `==` checks). Bandwidths
are the agents' configured caps as they registered (min of uplink and downlink; the paper's "precise
estimation"), with the controller's optional error e; or given explicitly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from core.progress import Action, Form, decide
from core.progress.selective import Selective
from core.selective import Controller, SelectiveConfig

from ..tasks import JobState, TaskRecord
from .base import Control, Model, register


@register
class SelectiveReduce(Model):
    name = "selective"
    rule = "result"
    groups = "partial"

    def __init__(self, scheme: str = "sr", group: int = 2, *, eta: float = 0.3, theta: float = 1.0,
                 dt: float = 0.01, c: int | None = None, prob_model: str = "hazard", warm: bool = True,
                 samples: Sequence[float] = (), bw_error: float = 0.0, weights: str = "staleness",
                 strict_trigger: bool = True, bandwidth: Mapping[int, float] | None = None, seed: int = 1,
                 **_: Any) -> None:
        """group: p, the minimum group; samples: the runtime profile (warm start); bandwidth: per worker
        Mbit/s (default: the registered caps). The model size comes from the job."""
        self.config = SelectiveConfig(scheme=scheme, p=group, eta=eta, theta=theta, dt=dt, c=c,
                                      prob_model=prob_model, warm=warm, strict_trigger=strict_trigger,
                                      bw_error=bw_error, weights=weights, seed=seed)  # refuses bad options now
        self.samples = tuple(samples)
        self.bandwidth = dict(bandwidth) if bandwidth is not None else None
        self.decision: Selective | None = None
        self.gids: dict[int, int] = {}  # task id -> the controller's group
        self.weighted = True
        self.stopped = False
        self._early: dict[int, TaskRecord] = {}  # recorded before form() returned (given up at once)
        self._timer: asyncio.TimerHandle | None = None
        self.t0 = 0.0

    def start(self, ctl: Control, js: JobState) -> None:
        bw = self.bandwidth if self.bandwidth is not None else ctl.node_bandwidth()
        workers = ctl.alive()
        missing = [n for n in workers if n not in bw]
        if missing:
            raise ValueError(f"bandwidth: workers {missing[:8]} have no bandwidth (no caps registered, none given)")
        self.weighted = bool(js.job_msg.get("workload"))
        cfg = dataclasses.replace(self.config, v_mbit=js.spec.params * 4 * 8 / 1e6,
                                  weights=self.config.weights if self.weighted else "uniform")
        self.t0 = time.time()
        decision = decide("selective", config=cfg, bandwidth=bw, samples=self.samples)
        assert isinstance(decision, Selective)
        self.decision = decision
        decision.start(workers, self.t0, rounds=js.rounds)  # forms nothing yet

    @property
    def controller(self) -> Controller | None:
        return None if self.decision is None else self.decision.controller

    def ready(self, ctl: Control, js: JobState, node: int, rnd: int, have: set[int]) -> None:
        if self.stopped or self.decision is None:
            return
        self._launch(ctl, js, self.decision.ready(node, rnd, time.time(), last=rnd >= js.rounds - 1))

    def task_done(self, ctl: Control, js: JobState, rec: TaskRecord) -> None:
        gid = self.gids.pop(rec.task, None)
        if gid is None:
            self._early[rec.task] = rec
            return
        assert self.decision is not None
        now = time.time()
        if rec.aborted:
            out = self.decision.over(gid, rec.iters, now, aborted=True)
        else:  # each member went on training when it held the result
            back = {int(n): min(now, float(span[1])) for n, span in rec.spans.items()}
            out = self.decision.over(gid, rec.iters, now, back=back, t_end=min(now, rec.t_end))
        if not self.stopped:
            self._launch(ctl, js, out)

    def lost(self, ctl: Control, js: JobState, node: int) -> None:
        if self.decision is not None:
            out = self.decision.lost(node, time.time())
            if not self.stopped:
                self._launch(ctl, js, out)

    def finished(self, ctl: Control, js: JobState, node: int) -> None:
        """Gone from the controller's queue and estimates, as a worker whose last iteration is in."""
        self.lost(ctl, js, node)

    def stop(self) -> None:
        """Form no more tasks (the job's time is up); tasks in flight still end and are recorded."""
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()

    def summary(self, t_end: float | None = None) -> dict[str, Any]:
        assert self.controller is not None
        return self.controller.summary(time.time() if t_end is None else t_end)

    def _launch(self, ctl: Control, js: JobState, actions: list[Action]) -> None:
        assert self.decision is not None
        for L in actions:
            assert isinstance(L, Form) and L.ref is not None
            opts = {"weights": dict(L.weights or {})} if self.weighted else None
            t = ctl.form(js, L.members, None, max(L.iters.values()), iters=dict(L.iters), options=opts)
            self.gids[t.id] = L.ref
            early = self._early.pop(t.id, None)
            if early is not None:
                self.task_done(ctl, js, early)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        wake = self.decision.wake_at
        if wake is not None and not self.stopped:
            self._timer = asyncio.get_running_loop().call_later(max(0.0, wake - time.time()), self._tick, ctl, js)

    def _tick(self, ctl: Control, js: JobState) -> None:
        self._timer = None
        if not self.stopped and self.decision is not None and not js.finished.is_set():
            self._launch(ctl, js, self.decision.tick(time.time()))
