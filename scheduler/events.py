"""What the scheduler's parts tell its observers: events (dashboard, metrics) and the timeline.

Every part holds the scheduler as an `Observed` and calls through it, so an observer added later
(`Scheduler.subscribe`, or a test replacing `on_event`) hears every part."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

Event = Callable[[str, dict[str, Any]], None]


class Observed(Protocol):
    on_event: Event  # kind, data -> None: every event, as it happens

    def note_event(self, kind: str, **data: Any) -> dict[str, Any]:
        """Put something on the timeline and tell observers."""
        ...
