"""Task records: once every receiver of a task reported, its record (with the simulator's prediction);
a task no attempt could end exact, recorded as aborted; and when a job is over."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from core.capshare import CapSharing
from core.plan import Plan

from .events import Observed
from .progress import Control
from .progress.base import all_recorded
from .registry import Registry
from .tasks import JobState, Task, TaskRecord
from .versions import Versions
from .view import NetworkView

log = logging.getLogger("wansync.scheduler")

Predict = Callable[[Plan, float], float | None]


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

    def record(self, js: JobState, t: Task) -> None:
        """Every receiver of the task reported: its record (with the simulator's prediction)."""
        plans = self.versions.plans
        plan = plans[t.version] if t.version is not None else js.plan
        if not set(t.receivers_of(plan)) <= set(t.done):
            return
        t.started_t = None
        rec = t.record(js, plan, self.view.coverage())
        if self.predict is not None and rec.version in plans:
            try:
                rec.prediction_s = self.predict(plans[rec.version], rec.t_start - js.t0)
            except NotImplementedError as exc:  # a plan the simulator cannot replay yet: no prediction
                log.info("task %d: no prediction (%s)", t.id, exc)
        self.recorded(js, t, rec)

    def recorded(self, js: JobState, t: Task, rec: TaskRecord) -> None:
        self.send_rates(js, self.cap_sharing.end(t.id, t.attempt))
        js.records.append(rec)
        plan = self.versions.plans.get(rec.version)
        if t.barrier and rec.ok and not rec.aborted and plan is not None:
            measured(js.memory, plan.scheme, rec.round_s)
        t.recorded_t = time.time()
        self.host.on_event("task", rec.to_json())
        if t.finished is not None and not t.finished.done():
            t.finished.set_result(rec)
        if js.progress is not None:
            js.progress.task_done(self.host.control, js, rec)
        self.maybe_finish(js)

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
        if all(n in js.stats for n in self.registry.agents) and over:
            js.finished.set()
