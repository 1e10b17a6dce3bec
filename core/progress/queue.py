"""A ready queue (P-Reduce): workers queue on READY; the first p queued form a partial reduce of their
contributions (each from its own iteration), which they all receive. When nobody else will queue (the
others reported their last iteration, or were lost), whoever is queued forms one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .base import Action, Decision, Form, register


@register()
class Queue(Decision):
    name = "queue"
    rule = "result"

    def __init__(self, group: int = 2) -> None:
        if group < 1:
            raise ValueError(f"group must be >= 1, got {group}")
        super().__init__()
        self.p = group
        self.queue: list[tuple[int, int]] = []  # (worker, iteration) in READY order
        self.last_in: set[int] = set()  # workers that reported their last iteration READY
        self.formed = 0  # tasks formed from the queue
        self.stopped = False

    def ready(self, worker: int, iteration: int, t: float, *, last: bool = False, defer: bool = False,
              alive: Iterable[int] | None = None) -> list[Action]:
        self.queue = [(n, r) for n, r in self.queue if n != worker] + [(worker, iteration)]
        if last:
            self.last_in.add(worker)
        return self.form(alive)

    def over(self, ref: int | None, iters: Mapping[int, int], t: float, *, aborted: bool = False,
             back: Mapping[int, float] | None = None, t_end: float | None = None,
             alive: Iterable[int] | None = None) -> list[Action]:
        """Aborted: nothing of it was applied, its living members not queued queue again (in `iters`' order)."""
        if aborted:
            living = set(self._alive(alive))
            for n, k in iters.items():
                if n in living and all(n != q for q, _ in self.queue):
                    self.queue.append((n, k))
        return self.form(alive)

    def lost(self, worker: int, t: float, *, alive: Iterable[int] | None = None) -> list[Action]:
        super().lost(worker, t)
        self.queue = [(n, r) for n, r in self.queue if n != worker]
        return self.form(alive)

    def requeue(self, pairs: Iterable[tuple[int, int]], t: float, *,
                alive: Iterable[int] | None = None) -> list[Action]:
        """These (worker, iteration) queue again at the back, in this order, as a READY would (a worker
        queued already gives up its place): a task abandoned while some of its members had gone on."""
        for w, k in pairs:
            self.queue = [(n, r) for n, r in self.queue if n != w] + [(w, k)]
        return self.form(alive)

    def stop(self) -> None:
        """Form no more tasks; the queue empties."""
        self.stopped = True
        self.queue = []

    def form(self, alive: Iterable[int] | None = None) -> list[Action]:
        """Groups of p in READY order; the last ones together once nobody else will queue."""
        if self.stopped:
            return []
        living = set(self._alive(alive))
        self.queue = [(n, r) for n, r in self.queue if n in living]
        out: list[Action] = []
        while len(self.queue) >= self.p:
            out.append(self._group(self.queue[:self.p]))
            self.queue = self.queue[self.p:]
        # who may still queue: every living worker not queued now that has an iteration left to report
        coming = living - self.last_in - {n for n, _ in self.queue}
        if self.queue and not coming:
            out.append(self._group(self.queue))
            self.queue = []
        return out

    def _group(self, group: list[tuple[int, int]]) -> Form:
        self.formed += 1
        iters = dict(group)
        return Form(tuple(sorted(iters)), None, iters)
