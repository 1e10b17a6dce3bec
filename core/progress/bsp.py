"""BSP: one task per round, every worker contributes and receives, formed once every worker is READY
for it. The live scheduler runs this rule as its round barrier (it also freezes the round's plan
version and retries an aborted round: scheduler state), the simulator through `ready` here."""

from __future__ import annotations

from collections.abc import Iterable

from .base import Action, Decision, Form, register


@register()
class Bsp(Decision):
    name = "bsp"
    rule = "result"
    barrier = True

    def __init__(self) -> None:
        super().__init__()
        self.waiting: dict[int, set[int]] = {}  # iteration -> workers READY for it

    def ready(self, worker: int, iteration: int, t: float, *, last: bool = False, defer: bool = False,
              alive: Iterable[int] | None = None) -> list[Action]:
        have = self.waiting.setdefault(iteration, set())
        have.add(worker)
        everyone = self._alive(alive)
        if not have >= set(everyone):
            return []
        del self.waiting[iteration]
        members = tuple(sorted(everyone))
        return [Form(members, members, dict.fromkeys(members, iteration))]
