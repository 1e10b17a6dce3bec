"""Wall-clock time every node agrees on: a Cristian-style offset to the scheduler's clock.

One-way throughput samples (bytes / (receive-complete - send-start)) and round times (first start
to last end) compare timestamps taken on different hosts, so each agent estimates its offset to
the scheduler from a few request/reply exchanges and keeps the one with the shortest round trip
(its error is at most half that round trip). `skew` lets tests give a node a wrong clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterable


class SyncedClock:
    def __init__(self, skew: float = 0.0) -> None:
        self.skew = skew  # this host's clock error (injected by tests; 0 on real hosts)
        self.offset = 0.0  # estimated correction toward the scheduler's clock
        self.error_bound = float("inf")

    def local(self) -> float:
        """This host's own (possibly wrong) wall clock."""
        return time.time() + self.skew

    def now(self) -> float:
        """The scheduler's wall clock, as best this node knows it."""
        return self.local() + self.offset

    def update(self, exchanges: Iterable[tuple[float, float, float]]) -> float:
        """exchanges: (t0 local send, t1 scheduler reply time, t2 local receive). Returns the offset."""
        t0, t1, t2 = min(exchanges, key=lambda e: e[2] - e[0])
        self.offset = t1 - (t0 + t2) / 2
        self.error_bound = (t2 - t0) / 2
        return self.offset
