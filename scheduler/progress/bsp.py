"""BSP: one task per round, "everyone contributes, everyone receives", formed once every member is
READY for it; the first READY freezes the round's plan version (the scheduler's barrier).

The rule is core.progress's `bsp` decision (the simulator's job mode runs it as it is); live, the
scheduler's round barrier carries it out, since it also freezes the round's plan version and retries
an aborted round (scheduler state): this model declares the barrier and sends each READY there."""

from __future__ import annotations

from typing import Any

from core.progress import DECISIONS

from ..tasks import JobState, TaskRecord
from .base import Control, Model, register

_RULE = DECISIONS["bsp"]  # what the registry says BSP is: a barrier, workers wait for the result


@register
class Bsp(Model):
    name = "bsp"
    rule = _RULE.rule
    uses_barrier = _RULE.barrier

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
