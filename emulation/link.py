"""The WAN seen by one sender: per directed link a rate and a one-way delay, plus node caps.

`LinkShaper` is what the overlay's link sender paces its writes through. It also keeps the
fidelity guard's books: while the link had a backlog, how many bytes went out versus how many
the configured rate allowed. A ratio below 97 % means the process could not keep up (CPU-bound),
and a run with such a link is invalid.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from .token_bucket import TokenBucket

MBIT = 1e6 / 8  # bytes per second in one Mbit/s
# The delay line may write a piece up to this much before it is due (event-loop timers have 1 ms
# resolution); the bucket keeps that much of its burst in reserve, so burst + rate*t still holds.
EARLY_S = 0.0005
# Writes are never larger than the burst, and on slow links smaller still: about 2 ms of link time
# (at least one MTU), so a 5 Mbit/s link is not lumpy at 100 ms scale (its 16 KiB burst is 26 ms).
PIECE_S = 0.002
MIN_PIECE = 1500
UNLIMITED_PIECE = 256 * 1024  # delay-only shapers (tc backend): pieces only bound the delay line's writes


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
    """Egress shaping of one directed link: its bucket, the node's shared uplink bucket, its delay.

    It never sleeps: `release_in` takes the tokens and says when the bytes will have crossed the
    link; the overlay's delay line writes them then. The fidelity guard's books: bytes written
    while the wire had a backlog, against what the configured rate allowed over that time.
    """

    def __init__(self, spec: LinkSpec, *, uplink: TokenBucket | None = None, seed: int = 0) -> None:
        self.spec = spec
        self.bucket = TokenBucket(spec.rate_mbps * MBIT, reserve_s=EARLY_S)
        # outage (trace rate 0) and blackhole (fault): the link holds every byte until both end;
        # the sender waits on `wait_open` instead of scheduling, so no backlog is booked meanwhile
        self._outage = False
        self._blackhole = False
        self._open: asyncio.Event | None = None
        self.uplink = uplink
        self.early_s = EARLY_S
        self.delay_s = spec.delay_s
        self.jitter_s = spec.jitter_s
        self._rng = random.Random(seed)
        self.busy_s = 0.0
        self.expected_bytes = 0.0
        self.sent_bytes = 0
        self._pending = 0  # written in the backlog still open

    @property
    def rate_mbps(self) -> float:
        return 0.0 if self._outage else self.bucket.rate / MBIT

    @property
    def rate_Bps(self) -> float:
        return 0.0 if self._outage else self.bucket.rate

    @property
    def held(self) -> bool:
        """True while the link carries nothing: an outage (rate 0) or a blackhole."""
        return self._outage or self._blackhole

    async def wait_open(self) -> None:
        if self._open is None:
            self._open = asyncio.Event()
        while self.held:
            self._open.clear()
            await self._open.wait()

    def blackhole(self, on: bool) -> None:
        """Fault: hold every byte (the TCP connection stays up, so only deadlines notice) until off.
        Held bytes are then delivered, not discarded: one TCP stream cannot lose a middle piece without
        breaking its framing, and after a real blackhole TCP retransmits them as well."""
        self._blackhole = on
        self._wake()

    def _wake(self) -> None:
        if not self.held and self._open is not None:
            self._open.set()

    @property
    def max_write(self) -> int:
        if self.bucket.unlimited and self.uplink is None:  # delay-only (the kernel shapes the rate)
            return UNLIMITED_PIECE
        burst = min(self.bucket.burst, self.uplink.burst) if self.uplink else self.bucket.burst
        return min(burst, max(MIN_PIECE, int(PIECE_S * self.bucket.rate)))

    def set_rate(self, rate_mbps: float) -> None:
        """0 is an outage (see emulation.trace): the bucket keeps its last rate, the link holds."""
        if rate_mbps < 0:
            raise ValueError(f"rate_mbps must be >= 0, got {rate_mbps}")
        self._outage = rate_mbps == 0
        if not self._outage:
            self.bucket.set_rate(rate_mbps * MBIT)
        self._wake()

    def release_in(self, nbytes: int) -> float:
        wait = self.bucket.delay_for(nbytes)
        if self.uplink is not None:
            wait = max(wait, self.uplink.delay_for(nbytes))
        if self.jitter_s:
            return wait + self.delay_s + self._rng.uniform(0, self.jitter_s)
        return wait + self.delay_s

    def wrote(self, nbytes: int) -> None:
        self._pending += nbytes

    def wire_busy(self, since: float, until: float, last_nbytes: int) -> None:
        if self.bucket.unlimited:  # delay-only: no rate to keep books against
            self._pending = 0
            return
        span = max(0.0, until - since) + last_nbytes / self.bucket.rate
        self.busy_s += span
        self.expected_bytes += span * self.bucket.rate
        self.sent_bytes += self._pending
        self._pending = 0

    def guard(self) -> dict[str, float]:
        """Achieved vs configured while backlogged (1.0 = the link got all its rate)."""
        # the bucket's initial burst is free: never report more than the rate allowed
        ratio = min(1.0, self.sent_bytes / self.expected_bytes) if self.expected_bytes > 0 else 1.0
        return {"busy_s": self.busy_s, "sent_bytes": float(self.sent_bytes),
                "expected_bytes": self.expected_bytes, "achieved_ratio": ratio,
                "rate_mbps": self.rate_mbps}
