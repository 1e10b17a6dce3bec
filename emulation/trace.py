"""Fluctuation as a precomputed, seeded list of rate events, shared by both backends and the simulator.

A trace never depends on wall-clock time while running: it is computed up front, so every scheme
(and the simulator) sees exactly the same WAN over the same window.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class RateEvent:
    t: float  # seconds after the trace's time zero
    src: int
    dst: int
    rate_mbps: float


@dataclass(frozen=True)
class Trace:
    events: tuple[RateEvent, ...] = ()
    period_s: float | None = None  # the redraw period, where there is one

    def for_link(self, src: int, dst: int) -> list[RateEvent]:
        return [e for e in self.events if e.src == src and e.dst == dst]

    def scaled(self, scale: float) -> Trace:
        """--scale shrinks trace periods with model bytes and delays."""
        return Trace(tuple(RateEvent(e.t * scale, e.src, e.dst, e.rate_mbps) for e in self.events),
                     None if self.period_s is None else self.period_s * scale)

    def rates_at(self, t: float, base: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
        rates = dict(base)
        for e in self.events:
            if e.t > t:
                break
            rates[(e.src, e.dst)] = e.rate_mbps
        return rates


def constant() -> Trace:
    return Trace()


def redraw(links: Iterable[tuple[int, int]], period_s: float, horizon_s: float, lo: float = 20,
           hi: float = 155, seed: int = 1) -> Trace:
    """NetStorm's dynamic WAN: every period, every directed link draws randint(lo, hi) Mbit/s."""
    if period_s <= 0:
        raise ValueError(f"redraw period must be positive, got {period_s}")
    rng = random.Random(seed)
    order = sorted(links)
    events = []
    k = 1
    while k * period_s <= horizon_s:
        events.extend(RateEvent(k * period_s, a, b, float(rng.randint(int(lo), int(hi)))) for a, b in order)
        k += 1
    return Trace(tuple(events), period_s)
