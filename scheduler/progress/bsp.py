"""BSP: one task per round, "everyone contributes, everyone receives", formed once every member is
READY for it; the first READY freezes the round's plan version (the scheduler's barrier)."""

from __future__ import annotations

from typing import Any

from ..tasks import JobState, TaskRecord
from .base import Control, Model, register


@register
class Bsp(Model):
    name = "bsp"
    rule = "result"
    uses_barrier = True

    def ahead(self, nodes: int) -> int:
        return 1  # the barrier starts round r + 1 once r ended everywhere

    def over(self, js: JobState) -> bool:
        return len(js.records) >= js.rounds  # a round per task; a round aborted is asked for again

    def __init__(self, **_: Any) -> None:
        pass

    def start(self, ctl: Control, js: JobState) -> None:
        pass

    def ready(self, ctl: Control, js: JobState, node: int, rnd: int, have: set[int]) -> None:
        ctl.barrier_ready(js, rnd, node, have)

    def task_done(self, ctl: Control, js: JobState, rec: TaskRecord) -> None:
        pass

    def lost(self, ctl: Control, js: JobState, node: int) -> None:
        pass  # the barrier re-plans for the living (the scheduler's abort and retry)
