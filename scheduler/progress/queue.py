"""A ready queue (P-Reduce): workers queue on READY; the first p queued form a partial reduce of their
contributions (each from its own iteration), which they all receive. When fewer than p workers are
still to come (the others finished all their iterations, or were lost), whoever is queued forms one."""

from __future__ import annotations

from typing import Any

from ..tasks import JobState, TaskRecord
from .base import Control, Model, register


@register
class ReadyQueue(Model):
    name = "queue"
    rule = "result"

    def __init__(self, group: int = 2, **_: Any) -> None:
        if group < 1:
            raise ValueError(f"group must be >= 1, got {group}")
        self.p = group
        self.queue: list[tuple[int, int]] = []  # (worker, iteration) in READY order
        self.last_in: set[int] = set()  # workers that reported their last iteration READY
        self.formed = 0  # tasks formed from the queue

    def start(self, ctl: Control, js: JobState) -> None:
        pass

    def ready(self, ctl: Control, js: JobState, node: int, rnd: int, have: set[int]) -> None:
        self.queue = [(n, r) for n, r in self.queue if n != node] + [(node, rnd)]
        if rnd >= js.rounds - 1:
            self.last_in.add(node)
        self._form(ctl, js)

    def task_done(self, ctl: Control, js: JobState, rec: TaskRecord) -> None:
        if rec.aborted:  # nothing of it was applied: its members queue again
            for n, k in rec.iters.items():
                if n in ctl.alive() and all(n != q for q, _ in self.queue):
                    self.queue.append((n, k))
        self._form(ctl, js)

    def lost(self, ctl: Control, js: JobState, node: int) -> None:
        self.queue = [(n, r) for n, r in self.queue if n != node]
        self._form(ctl, js)

    def _form(self, ctl: Control, js: JobState) -> None:
        alive = set(ctl.alive())
        self.queue = [(n, r) for n, r in self.queue if n in alive]
        while len(self.queue) >= self.p:
            self._group(ctl, js, self.queue[:self.p])
            self.queue = self.queue[self.p:]
        # who may still queue: every living worker not queued now that has an iteration left to report
        coming = alive - self.last_in - {n for n, _ in self.queue}
        if self.queue and not coming:  # nobody else will queue: the last ones go together
            self._group(ctl, js, self.queue)
            self.queue = []

    def _group(self, ctl: Control, js: JobState, group: list[tuple[int, int]]) -> None:
        iters = dict(group)
        self.formed += 1
        ctl.form(js, sorted(iters), None, max(iters.values()), iters=iters)
