"""The WAN seen by one sender: per directed link a rate and a one-way delay, plus node caps.

`LinkShaper` is what the overlay's link sender paces its writes through. It also keeps the
fidelity guard's books: while the link had a backlog, how many bytes went out versus how many
the configured rate allowed. A ratio below 97 % means the process could not keep up (CPU-bound),
and a run with such a link is invalid.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from .token_bucket import TokenBucket

MBIT = 1e6 / 8  # bytes per second in one Mbit/s


@dataclass(frozen=True)
class LinkSpec:
    """One directed overlay link as configured: rate in Mbit/s, delay and jitter in seconds."""

    rate_mbps: float
    delay_s: float = 0.0
    jitter_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.rate_mbps > 0:
            raise ValueError(f"rate_mbps must be positive, got {self.rate_mbps}")
        if self.delay_s < 0 or self.jitter_s < 0:
            raise ValueError("delay_s and jitter_s must be non-negative")


class LinkShaper:
    """Egress shaping of one directed link: its bucket, the node's shared uplink bucket, its delay."""

    def __init__(self, spec: LinkSpec, *, uplink: TokenBucket | None = None, seed: int = 0,
                 clock: object = time.monotonic) -> None:
        self.spec = spec
        self.bucket = TokenBucket(spec.rate_mbps * MBIT)
        self.uplink = uplink
        self.delay_s = spec.delay_s
        self.jitter_s = spec.jitter_s
        self._rng = random.Random(seed)
        self._clock = clock
        # fidelity guard
        self.busy_s = 0.0
        self.expected_bytes = 0.0
        self.sent_bytes = 0
        self._busy_since: float | None = None

    @property
    def rate_mbps(self) -> float:
        return self.bucket.rate / MBIT

    @property
    def max_write(self) -> int:
        return min(self.bucket.burst, self.uplink.burst) if self.uplink else self.bucket.burst

    def set_rate(self, rate_mbps: float) -> None:
        self._account()
        self.bucket.set_rate(rate_mbps * MBIT)

    async def pace(self, nbytes: int) -> float:
        """Wait until nbytes may leave; return the delivery offset (one-way delay plus jitter)."""
        if self._busy_since is not None:
            self.sent_bytes += nbytes
        await self.bucket.consume(nbytes)
        if self.uplink is not None:
            await self.uplink.consume(nbytes)
        if self.jitter_s:
            return self.delay_s + self._rng.uniform(0, self.jitter_s)
        return self.delay_s

    def busy(self, on: bool) -> None:
        """The sender has (on) or no longer has (off) bytes waiting for this link."""
        if on and self._busy_since is None:
            self._busy_since = self._clock()  # type: ignore[operator]
        elif not on and self._busy_since is not None:
            self._account()
            self._busy_since = None

    def _account(self) -> None:
        if self._busy_since is None:
            return
        now = self._clock()  # type: ignore[operator]
        self.busy_s += now - self._busy_since
        self.expected_bytes += (now - self._busy_since) * self.bucket.rate
        self._busy_since = now

    def guard(self) -> dict[str, float]:
        """Achieved vs configured while backlogged (ratio 1.0 = the link got all its rate)."""
        self._account()
        # the first burst of every busy period is free; never count more than the rate allowed
        ratio = min(1.0, self.sent_bytes / self.expected_bytes) if self.expected_bytes > 0 else 1.0
        return {"busy_s": self.busy_s, "sent_bytes": float(self.sent_bytes),
                "expected_bytes": self.expected_bytes, "achieved_ratio": ratio,
                "rate_mbps": self.rate_mbps}
