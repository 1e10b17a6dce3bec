"""A ready queue (P-Reduce): workers queue on READY; the first p queued form a partial reduce of their
contributions (each from its own iteration), which they all receive. When fewer than p workers are
still to come (the others finished all their iterations, or were lost), whoever is queued forms one.

The rule is core.progress's `queue` decision (the simulator's job mode runs the same one); this
adapter feeds it the scheduler's events and forms the tasks it asks for (`_group`, where CREW hooks in).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from core.progress import Action, Form, decide
from core.progress.queue import Queue

from ..tasks import JobState, TaskRecord
from .base import Control, Model, register


@register
class ReadyQueue(Model):
    name = "queue"
    rule = "result"
    groups = "partial"

    def __init__(self, group: int = 2, **_: Any) -> None:
        decision = decide("queue", group=group)
        assert isinstance(decision, Queue)
        self.decision = decision

    # the decision's state, as this model and CREW read it
    @property
    def p(self) -> int:
        return self.decision.p

    @property
    def queue(self) -> list[tuple[int, int]]:
        return self.decision.queue

    @property
    def formed(self) -> int:
        return self.decision.formed

    def start(self, ctl: Control, js: JobState) -> None:
        self._act(ctl, js, self.decision.start(ctl.alive(), time.time(), rounds=js.rounds))

    def ready(self, ctl: Control, js: JobState, node: int, rnd: int, have: set[int]) -> None:
        self._act(ctl, js, self.decision.ready(node, rnd, time.time(), last=rnd >= js.rounds - 1, alive=ctl.alive()))

    def task_done(self, ctl: Control, js: JobState, rec: TaskRecord) -> None:
        self._act(ctl, js, self.decision.over(None, rec.iters, time.time(), aborted=rec.aborted, alive=ctl.alive()))

    def lost(self, ctl: Control, js: JobState, node: int) -> None:
        self._act(ctl, js, self.decision.lost(node, time.time(), alive=ctl.alive()))

    def finished(self, ctl: Control, js: JobState, node: int) -> None:
        """Nobody waits for it: its last READY is in (the queued ones go together once nobody else comes)."""
        self.decision.last_in.add(node)
        self._act(ctl, js, self.decision.form(ctl.alive()))

    def _act(self, ctl: Control, js: JobState, actions: Sequence[Action]) -> None:
        for a in actions:
            assert isinstance(a, Form), f"a ready queue forms tasks only, not {a}"
            self._group(ctl, js, list(a.iters.items()))

    def _group(self, ctl: Control, js: JobState, group: list[tuple[int, int]]) -> None:
        iters = dict(group)
        ctl.form(js, sorted(iters), None, max(iters.values()), iters=iters)
