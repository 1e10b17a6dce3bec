"""How one link is shared between traffic classes: strict priority, earliest deadline, weighted shares.

A plan may give each (task, tree) a class (core.plan.ChunkGroup: weight, priority, deadline,
per-edge rates); its chunks carry it in their header (`cls`), so every hop, relays included, shares
its links the same way without knowing the plan. On one link the next segment comes from the class
that has bytes ready and is
  1. of the highest priority (strict: a lower class sends only while no higher one has bytes ready),
  2. among equal priorities, of the earliest absolute deadline (classes without one come last),
  3. among equal ones, the furthest behind in weighted bytes (start-time fair queuing: each class
     has a virtual time that grows by bytes / weight as it sends; a class that becomes active starts
     at the link's current virtual time, so an idle class banks no credit).
It is work-conserving: a class waiting for its bytes (a relay's upstream) or for its rate (below)
never holds the link. Inside a class, flows (origin -> destination) share round-robin in bytes
(overlay.drr). Transfers without a class share one default class of weight 1, priority 0, no
deadline: with nothing classed the link behaves exactly as plain round-robin.

Where flows from different senders meet (a receiver's downlink, a node's uplink shared by its links)
no sender's scheduler sees the others. There the scheduler assigns per-flow rates (core.capshare,
sent as RATES; or a planner's `rates`, Mbit/s per tree edge) and the sender paces that flow to it
here: a paced class is its own class per destination, with a token bucket; its turn passes while
the bucket is empty, and a class at rate 0 is held until a new rate comes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

from core.classes import TrafficClass

from .drr import DeficitRoundRobin, Queued

# a paced class's burst: this much time at its rate, at least a segment (an idle one saves no more)
PACE_BURST_S = 0.025
PACE_MIN_BURST = 64 * 1024


class Classed(Queued, Protocol):
    cls: Hashable  # the class's key on this link (None: the default class)
    tclass: TrafficClass
    rate_Bps: float | None  # paced to at most this (a scheduler-assigned per-flow rate), or None


T = TypeVar("T", bound=Classed)


class _Class(Generic[T]):
    __slots__ = ("tclass", "flows", "vt", "rate", "tokens", "t_tokens", "active")

    def __init__(self, tclass: TrafficClass, rate: float | None) -> None:
        self.tclass = tclass
        self.flows: DeficitRoundRobin[T] = DeficitRoundRobin()
        self.vt = 0.0  # virtual time: bytes sent / weight, from where it last became active
        self.rate = rate
        self.tokens = 0.0
        self.t_tokens = 0.0
        self.active = False  # had bytes queued when last looked at

    def order(self) -> tuple[float, float, float]:
        dl = self.tclass.deadline
        return (-self.tclass.priority, math.inf if dl is None else dl, self.vt)


class ClassScheduler(Generic[T]):
    """Per-class round-robins; `next` picks the next segment by priority, deadline and weighted share."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._classes: dict[Hashable, _Class[T]] = {}
        self._vnow = 0.0  # the link's virtual time: the last served class's virtual time
        self.clock = clock
        self.wake_at: float | None = None  # after a None from `next`: when a paced class has tokens again

    def __len__(self) -> int:
        return len(self._classes)

    def enqueue(self, item: T) -> None:
        c = self._classes.get(item.cls)
        if c is None:
            c = self._classes[item.cls] = _Class(item.tclass, item.rate_Bps)
            c.t_tokens = self.clock()
        if not c.active:
            c.vt = max(c.vt, self._vnow)  # an idle class starts at the link's virtual time
            c.active = True
        c.flows.enqueue(item)

    def remove(self, item: T) -> None:
        c = self._classes.get(item.cls)
        if c is not None:
            c.flows.remove(item)

    def clear(self) -> None:
        self._classes.clear()
        self._vnow = 0.0

    def set_rate(self, cls: Hashable, rate_Bps: float | None) -> None:
        """A new scheduler-assigned rate for a paced class (0: held; None: unpaced)."""
        c = self._classes.get(cls)
        if c is not None:
            if c.rate is not None and c.rate <= 0:  # released: it banked no tokens and no virtual time
                c.tokens, c.t_tokens = 0.0, self.clock()
                c.vt = max(c.vt, self._vnow)
            c.rate = rate_Bps

    def next(self, quantum: int, step: Callable[[T], int]) -> tuple[T, memoryview] | None:
        """The next segment, or None if no class may send now (`wake_at` then says when a paced one
        may, or None if only bytes that have not arrived would do)."""
        self.wake_at = None
        if len(self._classes) == 1:  # the common case: one class, nothing to choose
            ((key, c),) = self._classes.items()
            return self._serve(key, c, quantum, step)
        for key, c in sorted(self._classes.items(), key=lambda kv: kv[1].order()):
            got = self._serve(key, c, quantum, step)
            if got is not None:
                return got
        return None

    def _serve(self, key: Hashable, c: _Class[T], quantum: int, step: Callable[[T], int]
               ) -> tuple[T, memoryview] | None:
        if c.rate is not None:
            now = self.clock()
            burst = min(float(quantum), max(PACE_MIN_BURST, c.rate * PACE_BURST_S))
            c.tokens = min(c.tokens + (now - c.t_tokens) * c.rate, burst)
            c.t_tokens = now
            if c.rate <= 0:
                return None  # held (a higher class has the cap): until `set_rate` gives it a rate
            if c.tokens <= 0:
                due = now - c.tokens / c.rate
                self.wake_at = due if self.wake_at is None else min(self.wake_at, due)
                return None
        got = c.flows.next(quantum, step)
        if got is None:
            if not c.flows:
                del self._classes[key]  # nothing queued: forgotten (it starts afresh if it returns)
            else:
                c.active = True
            return None
        n = len(got[1])
        c.vt += n / c.tclass.weight
        self._vnow = max(self._vnow, c.vt - n / c.tclass.weight)
        if c.rate is not None:
            c.tokens -= n  # may go negative: the segment is paid for before the next one
        return got
