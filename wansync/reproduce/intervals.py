"""The median across seeds and a distribution-free interval for it: a symmetric pair of order statistics
whose binomial coverage of the true median is exact, so the interval says what it is (no normality assumed).

With n values sorted x(1) <= ... <= x(n), the pair [x(k), x(n+1-k)] covers the median with probability
P(k <= B <= n - k), B ~ Binomial(n, 1/2). We take the largest k (the tightest pair) whose coverage is at
least 95 %; with 5 values or fewer none reaches it, and [min, max] is reported with its coverage."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

TARGET = 0.95


def coverage(n: int, k: int) -> float:
    """P(k <= B <= n - k), B ~ Binomial(n, 1/2): how often [x(k), x(n+1-k)] holds the population median."""
    if n < 1 or not 1 <= k <= (n + 1) // 2:
        raise ValueError(f"no symmetric pair k = {k} of {n} values")
    tail = sum(math.comb(n, i) for i in range(k))  # P(B <= k - 1) x 2^n
    return 1.0 - 2.0 * tail / 2**n


def order_k(n: int, target: float = TARGET) -> tuple[int, bool]:
    """The largest k whose pair covers at least `target`; (1, False) when not even [min, max] does."""
    best = 0
    for k in range(1, (n + 1) // 2 + 1):
        if coverage(n, k) >= target:
            best = k
    return (best, True) if best else (1, False)


@dataclass(frozen=True)
class Interval:
    """The median of n values and the order-statistic pair around it, with its exact coverage."""

    n: int
    median: float
    lo: float
    hi: float
    k: int  # lo = x(k), hi = x(n + 1 - k)
    coverage: float
    meets_target: bool  # coverage >= 95 %

    def label(self) -> str:
        """What the interval is, in words: `[2nd, 8th] of 9: 96.1 %`."""
        if self.n == 1:
            return "1 run: no interval"
        pair = "[min, max]" if self.k == 1 else f"[{_ordinal(self.k)}, {_ordinal(self.n + 1 - self.k)}]"
        note = "" if self.meets_target else f" (no 95 % interval from {self.n} seeds)"
        return f"{pair} of {self.n}: {100 * self.coverage:.1f} %{note}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "interval": self.label()}


def interval(values: Sequence[float], target: float = TARGET) -> Interval:
    """Median and order-statistic interval of `values` (at least one)."""
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("no values")
    n = len(xs)
    k, ok = order_k(n, target)
    return Interval(n, float(statistics.median(xs)), xs[k - 1], xs[n - k], k, coverage(n, k), ok)


def _ordinal(i: int) -> str:
    suffix = "th" if 10 <= i % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(i % 10, "th")
    return f"{i}{suffix}"
