"""What a progress model may ask of the scheduler (scheduler.progress.Control), in one object: the
living workers and their bandwidth, tasks formed or at the BSP barrier, GOs, a multicast's receiver
dropped, an attempt aborted, link suspicions (kept by liveness.py) and the timeline."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from core.plan import Plan
from overlay.messages import Drop, Go

from .events import Observed
from .failures import Failures
from .liveness import Liveness
from .records import Records
from .registry import Registry
from .start import TaskStart
from .tasks import JobState, Task
from .versions import Versions
from .view import NetworkView


class ModelControl:
    def __init__(self, registry: Registry, view: NetworkView, versions: Versions, starter: TaskStart,
                 records: Records, failures: Failures, liveness: Liveness, obs: Observed) -> None:
        self.registry = registry
        self.view = view
        self.versions = versions
        self.starter = starter
        self.records = records
        self.failures = failures
        self.liveness = liveness
        self.obs = obs

    @property
    def plans(self) -> Mapping[int, Plan]:
        return self.versions.plans

    def alive(self) -> list[int]:
        return sorted(self.registry.agents)

    def node_bandwidth(self) -> dict[int, float]:
        """Each registered agent's b = min(uplink, downlink) of its configured caps, Mbit/s (those
        with both caps): what a bandwidth-aware model (selective reduce) groups workers by."""
        return {n: min(a.uplink_mbps, a.downlink_mbps) for n, a in sorted(self.registry.agents.items())
                if a.uplink_mbps is not None and a.downlink_mbps is not None}

    def form(self, js: JobState, members: Iterable[int], receivers: Iterable[int] | None, rnd: int | None,
             iters: dict[int, int] | None = None, options: dict[str, Any] | None = None) -> Task:
        return self.starter.form(js, members, receivers, rnd, iters, options)

    def go(self, js: JobState, upto: int, node: int) -> None:
        """Worker `node` may compute iterations up to `upto` (a bounded progress model)."""
        self.obs.note_event("go", job=js.job, node=node, upto=upto)
        a = self.registry.agents.get(node)
        if a is not None:
            self.registry.send(a, Go(job=js.job, upto=upto))

    def barrier_ready(self, js: JobState, rnd: int, node: int, have: set[int]) -> None:
        """BSP: `node` is READY for round `rnd`; the round's task starts once every member is."""
        js.bsp_task(rnd).ask(node, have, time.time())
        self.starter.try_start(js, rnd, node)

    def drop_receiver(self, js: JobState, tid: int, node: int) -> None:
        """`node` leaves a running task's receivers (a multicast shrinks, SelMcast SSP): it applies
        nothing of it, whoever sends to it stops, the others go on; the task is over once the
        remaining receivers hold the result."""
        t = js.tasks[tid]
        if t.version is None or t.recorded_t is not None:
            raise RuntimeError(f"task {tid} is not running")
        plan = self.versions.plans[t.version]
        if node not in plan.receiver_set or node in t.dropped:
            raise ValueError(f"receivers: node {node} is not a receiver of task {tid}")
        t.dropped.add(node)
        replicates = any(g.children.get(node) for g in plan.groups)  # it passes the value on: keep feeding it
        self.obs.note_event("receiver_dropped", job=js.job, task=tid, node=node, replicates=replicates)
        agents = self.registry.agents
        for n in sorted(t.involved):
            if n in agents:
                self.registry.send(agents[n], Drop(job=js.job, task=tid, attempt=t.attempt, node=node,
                                                   replicates=replicates or None))
        self.records.record(js, t)

    def abort(self, js: JobState, tid: int, why: str) -> None:
        self.failures.abort(js, tid, why)

    def note_event(self, kind: str, **data: Any) -> dict[str, Any]:
        return self.obs.note_event(kind, **data)

    def waited(self) -> dict[tuple[int, int], float]:
        return self.liveness.waited()

    def suspect(self, link: tuple[int, int], seconds: float, kind: str, **data: Any) -> bool:
        return self.liveness.suspect(link, seconds, kind, **data)
