"""Task records: once every receiver of a task reported, its record (with the simulator's prediction);
a task no attempt could end exact, recorded as aborted; and when a job is over."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Protocol

from core.capshare import CapSharing
from core.plan import Plan
from overlay.messages import JobEnd

from .events import Observed
from .progress import Control
from .progress.base import all_recorded
from .registry import Registry
from .tasks import JobState, Task, TaskRecord
from .versions import Versions
from .view import NetworkView

log = logging.getLogger("wansync.scheduler")

# the simulator's round time for a plan started this long after the job's t0: a value, or a future
# of one computed elsewhere (wansync.predict.RoundPredictor.submit), which the loop never waits for
Predict = Callable[[Plan, float], "float | None | Future[float | None]"]
PREDICTION_WAIT_S = 60.0  # at a job's end, how long its records wait for predictions still running


MEASURED_KEEP = 32  # rounds a planner sees in memory["measured"]


def measured(memory: dict, scheme: str, round_s: float) -> None:
    """What a round of the job's plan took, for its planner: memory["measured"] holds (sequence number,
    plan scheme, round seconds) of the latest MEASURED_KEEP rounds, oldest first (auto compares them
    with what it predicted)."""
    rounds = memory.setdefault("measured", [])
    rounds.append((len(rounds) and rounds[-1][0] + 1, scheme, round_s))
    del rounds[:-MEASURED_KEEP]


class Host(Observed, Protocol):
    control: Control  # what the job's progress model is told of each record through


class Records:
    def __init__(self, registry: Registry, view: NetworkView, versions: Versions, cap_sharing: CapSharing,
                 send_rates: Callable[[JobState, Mapping[int, Mapping[tuple[int, int], list]]], None],
                 host: Host, predict: Predict | None) -> None:
        """predict(plan, seconds since the job's t0) -> predicted round time (the simulator), or None."""
        self.registry = registry
        self.view = view
        self.versions = versions
        self.cap_sharing = cap_sharing
        self.send_rates = send_rates
        self.host = host
        self.predict = predict
        # per job, records whose prediction is still being simulated (a future may serve several)
        self._pending: dict[int, list[tuple[Future, TaskRecord]]] = {}
        self._draining: set[int] = set()

    def record(self, js: JobState, t: Task) -> None:
        """Every receiver of the task reported: its record, with the simulator's prediction where it is
        known at once (else a `prediction` event follows when it is: see recorded)."""
        plans = self.versions.plans
        plan = plans[t.version] if t.version is not None else js.plan
        if not set(t.receivers_of(plan)) <= set(t.done):
            return
        t.started_t = None
        rec = t.record(js, plan, self.view.coverage())
        pending = None
        if self.predict is not None and rec.version in plans:
            try:
                got = self.predict(plans[rec.version], rec.t_start - js.t0)
            except NotImplementedError as exc:  # a plan the simulator cannot replay yet: no prediction
                log.info("task %d: no prediction (%s)", t.id, exc)
            else:
                if isinstance(got, Future) and not got.done():
                    pending = got
                else:
                    rec.prediction_s = _value(got, t.id)
        self.recorded(js, t, rec, pending)

    def recorded(self, js: JobState, t: Task, rec: TaskRecord, pending: Future | None = None) -> None:
        """The record counts at once (the `task` event: rounds, faults, progress go on); a prediction
        still being simulated (`pending`) reaches the record, and the event stream as `prediction`,
        when it is known — before the job is finished (_drain)."""
        self.send_rates(js, self.cap_sharing.end(t.id, t.attempt))
        js.records.append(rec)
        plan = self.versions.plans.get(rec.version)
        if t.barrier and rec.ok and not rec.aborted and plan is not None:
            measured(js.memory, plan.scheme, rec.round_s)
        t.recorded_t = time.time()
        data = rec.to_json()
        if pending is not None:
            data["prediction_pending"] = True
            self._pending.setdefault(js.job, []).append((pending, rec))
            loop = asyncio.get_running_loop()
            pending.add_done_callback(lambda f: _call_soon(loop, self._predicted, js, f))
        self.host.on_event("task", data)
        if t.finished is not None and not t.finished.done():
            t.finished.set_result(rec)
        if js.progress is not None:
            js.progress.task_done(self.host.control, js, rec)
        self.maybe_finish(js)

    def _predicted(self, js: JobState, fut: Future) -> None:
        """A prediction arrived: the records waiting for it get it."""
        waiting = self._pending.get(js.job, [])
        mine = [rec for f, rec in waiting if f is fut]
        waiting[:] = [(f, rec) for f, rec in waiting if f is not fut]
        for rec in mine:
            rec.prediction_s = _value(fut, rec.task)
            self._tell(rec)

    def _tell(self, rec: TaskRecord) -> None:
        self.host.on_event("prediction", {"job": rec.job, "task": rec.task, "attempt": rec.attempt,
                                          "round": rec.round, "prediction_s": rec.prediction_s})

    async def _drain(self, js: JobState) -> None:
        """The job is over: its records wait for the predictions under way (PREDICTION_WAIT_S at most;
        those still running then stay without one), then the job is finished."""
        try:
            waiting = [asyncio.wrap_future(f) for f, _ in self._pending.get(js.job, []) if not f.done()]
            if waiting:
                await asyncio.wait(waiting, timeout=PREDICTION_WAIT_S)
            late = 0
            for fut, rec in self._pending.pop(js.job, []):
                if fut.done():
                    rec.prediction_s = _value(fut, rec.task)
                else:
                    late += 1
                self._tell(rec)
            if late:
                log.warning("job %d: %d round(s) recorded without a prediction: the simulator took longer than "
                            "%.0f s after the job's end", js.job, late, PREDICTION_WAIT_S)
        finally:
            self._draining.discard(js.job)
            self._finish(js)

    def give_up(self, js: JobState, t: Task, why: str) -> None:
        """A formed task no attempt could end exact: recorded as aborted (nothing of it was applied)."""
        now = time.time()
        rec = TaskRecord(job=js.job, scheme=js.scheme, task=t.id, round=t.round, version=-1, round_s=0.0,
                         compute_s=0.0, ok=False, digests_agree=False, versions_agree=False, t_start=now, t_end=now,
                         warmup=False, errors=[why], attempt=t.attempt, members=list(t.members),
                         receivers=list(t.receivers or t.members), bytes=js.spec.params * 4, aborted=True)
        log.warning("job %d task %d abandoned after %d attempts: %s", js.job, t.id, t.attempt, why)
        self.host.note_event("task_abandoned", job=js.job, task=t.id, why=why)
        self.recorded(js, t, rec)

    def maybe_finish(self, js: JobState) -> None:
        """Done when every task is recorded (as the progress model counts them) and every agent still
        here sent its job stats."""
        over = js.progress.over(js) if js.progress is not None else all_recorded(js)
        if (js.finished.is_set() or not (all(n in js.stats for n in self.registry.agents) and over)
                or js.job in self._draining):
            return
        if self._pending.get(js.job):
            self._draining.add(js.job)
            asyncio.ensure_future(self._drain(js))
        else:
            self._pending.pop(js.job, None)
            self._finish(js)

    def _finish(self, js: JobState) -> None:
        """The job is over: agents that did every round and wait in case the last one is aborted (a
        node lost before the others had its sum) may go (JOB_END)."""
        js.finished.set()
        self.registry.broadcast(JobEnd(job=js.job))


def _value(got: float | None | Future, task: int) -> float | None:
    """A prediction's value; None where the simulator could not give one (said why, once)."""
    if not isinstance(got, Future):
        return got
    try:
        return got.result()
    except NotImplementedError as exc:  # a plan the simulator cannot replay yet
        log.info("task %d: no prediction (%s)", task, exc)
    except Exception as exc:  # the simulator's process failed: the record stands without a prediction
        log.warning("task %d: no prediction (%s: %s)", task, type(exc).__name__, exc)
    return None


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: object) -> None:
    """From the predictor's thread onto the loop; a loop that closed meanwhile has no one to tell."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass
