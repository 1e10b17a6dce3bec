"""Traffic classes: what a (task, tree) asks of every link it crosses.

Shared vocabulary of plans (core.plan), the data plane's link scheduler (overlay.classes) and the
simulator: a weight, a strict priority and an optional absolute deadline, and their wire form.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_WEIGHT = 1e6  # a weight is a relative share in (0, MAX_WEIGHT]
PRIORITIES = 8  # strict priority levels 0..7, higher first
NO_DEADLINE = -1.0  # on the wire: the class has no deadline
MBIT = 1e6 / 8  # bytes per second in one Mbit/s (plans give rates in Mbit/s)


@dataclass(frozen=True)
class TrafficClass:
    """What a class asks of every link it crosses; the default is plain round-robin."""

    weight: float = 1.0
    priority: int = 0
    deadline: float | None = None  # absolute, on the wire clock (overlay.clock)

    def to_wire(self, tree: int) -> list[float | int]:
        return [tree, self.weight, self.priority, NO_DEADLINE if self.deadline is None else self.deadline]

    @classmethod
    def from_wire(cls, v: list) -> tuple[int, TrafficClass]:
        """(tree, class) of a validated header's `cls` (overlay.fieldcheck.traffic_class)."""
        tree, weight, priority, deadline = v
        return tree, cls(float(weight), priority, None if deadline == NO_DEADLINE else float(deadline))


DEFAULT = TrafficClass()
