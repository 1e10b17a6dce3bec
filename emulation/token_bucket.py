"""An async token bucket that is exact over long runs and bounds every burst.

Tokens may go into debt: a consumer takes what it needs and then sleeps the debt off. Refills
come from the real clock, so oversleeping never loses rate, and a write is never larger than
the burst, so the bytes sent in any window of t seconds stay below burst + rate * t.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

MIN_BURST = 16 * 1024
BURST_SECONDS = 0.002


def burst_for(rate_Bps: float) -> int:
    """burst = max(2 ms x rate, 16 KiB), the foundation's rule."""
    if math.isinf(rate_Bps):
        return 1 << 62
    return max(int(BURST_SECONDS * rate_Bps), MIN_BURST)


class TokenBucket:
    def __init__(self, rate_Bps: float, *, burst: int | None = None, reserve_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """reserve_s: keep that much of the burst unused, for a writer that may write that early."""
        if rate_Bps <= 0:
            raise ValueError(f"rate must be positive, got {rate_Bps}")
        self._clock = clock
        self._sleep = sleep
        self._fixed_burst = burst
        self._reserve_s = reserve_s
        self.rate = float(rate_Bps)
        self.burst = self._burst()
        self.tokens = float(self.burst)
        self._last = clock()

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.rate)

    def _refill(self) -> None:
        now = self._clock()
        if not self.unlimited:
            self.tokens = min(self.burst, self.tokens + (now - self._last) * self.rate)
        self._last = now

    def set_rate(self, rate_Bps: float) -> None:
        """Takes effect at once, also for a transfer in progress (what was earned so far is kept)."""
        if rate_Bps <= 0:
            raise ValueError(f"rate must be positive, got {rate_Bps}")
        self._refill()
        self.rate = float(rate_Bps)
        self.burst = self._burst()
        self.tokens = min(self.tokens, float(self.burst))

    def _burst(self) -> int:
        if self._fixed_burst is not None:
            return self._fixed_burst
        full = burst_for(self.rate)
        if self.unlimited:
            return full
        return max(4096, full - int(self._reserve_s * self.rate))

    def delay_for(self, nbytes: int, *, allow_large: bool = False) -> float:
        """Take nbytes of tokens now; return how long the caller must wait before sending them.

        Senders never write more than the burst; a receiver (downlink cap) cannot choose how much
        the kernel hands it, so it may pass allow_large and pay the debt afterwards."""
        if nbytes > self.burst and not allow_large:
            raise ValueError(f"write of {nbytes} bytes exceeds the burst of {self.burst}")
        if self.unlimited:
            return 0.0
        self._refill()
        self.tokens -= nbytes
        return -self.tokens / self.rate if self.tokens < 0 else 0.0

    def delays_for(self, sizes: list[int]) -> list[float]:
        """delay_for of consecutive writes taken at one instant (one clock reading for a whole segment:
        the same tokens, the same waits, a fraction of the Python calls)."""
        burst = self.burst
        if self.unlimited:
            for n in sizes:
                if n > burst:
                    raise ValueError(f"write of {n} bytes exceeds the burst of {burst}")
            return [0.0] * len(sizes)
        self._refill()
        tokens, rate = self.tokens, self.rate
        out = []
        for n in sizes:
            if n > burst:
                self.tokens = tokens
                raise ValueError(f"write of {n} bytes exceeds the burst of {burst}")
            tokens -= n
            out.append(-tokens / rate if tokens < 0 else 0.0)
        self.tokens = tokens
        return out

    async def consume(self, nbytes: int) -> None:
        wait = self.delay_for(nbytes)
        if wait > 0:
            await self._sleep(wait)
