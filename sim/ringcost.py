"""The paper's ring cost model as an engine for job mode (seed 003, Eq. 2): a group's ring all-reduce
takes 2(m - 1) alpha + 2 (m - 1)/m v / b, b the slowest hop of the ring, alpha the slowest hop's delay.

Selective reduce's own simulator is flow level with contention only at host edges, and every worker is
in at most one group at a time, so groups in flight share nothing and this closed form is what that
simulator computes; it makes n = 200 with a 500 MB model cheap where the exact engine would replay
millions of segments. A hop's rate is min(link, sender's uplink cap, receiver's downlink cap) along its
route. Only ring plans (scheme "ring") are replayed; anything else is the exact engine's.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable

from .model import MBIT, SimNetwork, TaskRun


class RingCost:
    """Same surface as the exact engine for sim.job: `add` a task, `advance` to a time."""

    def __init__(self, net: SimNetwork, start_s: float = 0.0) -> None:
        self.net = net
        self.now = start_s
        self._ends: list[tuple[float, int, Hashable, tuple[int, ...]]] = []
        self._seq = 0

    def hop(self, a: int, b: int) -> tuple[float, float]:
        """Rate (Mbit/s) and one-way delay (s) from a to b along the route."""
        path = self.net.route(a, b)
        rate, delay = float("inf"), 0.0
        for u, v in zip(path, path[1:], strict=False):
            rate = min(rate, self.net.rates_mbps[(u, v)])
            delay += self.net.delays_s.get((u, v), 0.0)
        rate = min(rate, self.net.uplink_mbps.get(a, rate), self.net.downlink_mbps.get(b, rate))
        return rate, delay

    def ring_s(self, ring: tuple[int, ...], nbytes: int) -> float:
        m = len(ring)
        if m <= 1:
            return 0.0
        hops = [self.hop(ring[i], ring[(i + 1) % m]) for i in range(m)]
        rate = min(r for r, _ in hops)
        alpha = max(d for _, d in hops)
        return 2 * (m - 1) * alpha + 2 * (m - 1) / m * nbytes / (rate * MBIT)

    def add(self, task: TaskRun) -> None:
        plan = task.plan
        if plan.scheme != "ring":
            raise NotImplementedError(f"the ring cost model replays ring plans, not {plan.scheme!r}")
        if task.start_s < self.now:
            raise ValueError(f"task {task.key!r} starts at {task.start_s}, before the clock ({self.now})")
        start = max([task.start_s, *(task.ready_s or {}).values()])
        end = start + self.ring_s(tuple(sorted(plan.participants)), plan.params * 4)
        self._seq += 1
        heapq.heappush(self._ends, (end, self._seq, task.key, tuple(plan.receiver_set)))

    def advance(self, until: float, stop_at_end: bool = True) -> list[tuple[Hashable, int | None, float]]:
        """Tasks over by `until` (the first instant only, with stop_at_end): every receiver's done time
        and the task's end, as the exact engine reports them."""
        found: list[tuple[Hashable, int | None, float]] = []
        while self._ends and self._ends[0][0] <= until:
            t = self._ends[0][0]
            if found and stop_at_end and t > found[-1][2]:
                break
            end, _, key, receivers = heapq.heappop(self._ends)
            self.now = max(self.now, end)
            found += [(key, r, end) for r in receivers] + [(key, None, end)]
        if not found:
            self.now = max(self.now, until)
        return found
