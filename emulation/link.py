"""The WAN seen by one sender: per directed link a rate and a one-way delay, plus node caps.

`LinkShaper` is what the overlay's link sender paces its writes through. It also keeps the
fidelity guard's books: while the link had a backlog, how many bytes went out versus how many
the configured rate allowed (less the time it had nothing to send, or its node's uplink held it).
A ratio below 97 % means the process could not keep up (CPU-bound), and a run with such a link is
invalid. The node caps keep books of their own: `Uplink` (one bucket shared by all of a node's
outgoing links) while it was the binding constraint, `Downlink` (the receive limiter) while it was
in debt.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque
from collections.abc import Callable
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
# A piece the overlay never wrote (its connection dropped) is forgotten by the uplink's books once it
# is this late: a loop that late is judged by the event-loop lag check anyway
STALE_S = 1.0
# Downlink: a read that comes this long after the receive debt was paid no longer continues the
# backlog (the senders paused). Longer than any cap's burst (2 ms, or 16 KiB: 13 ms at 10 Mbit/s),
# so a late resume that lets tokens overflow the burst shows in the books; 5x the loop-lag limit
RESUME_GAP_S = 0.05


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


class Backlogs:
    """How many of a node's link shapers are backlogged now: the event-loop meter asks every tick
    whether the node has traffic, and a count answers without looking at every link."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class LinkShaper:
    """Egress shaping of one directed link: its bucket, the node's shared uplink bucket, its delay.

    It never sleeps: `release_in` takes the tokens and says when the bytes will have crossed the
    link; the overlay's delay line writes them then. The fidelity guard's books: bytes written
    while the wire had a backlog, against what the configured rate allowed over that time.
    """

    def __init__(self, spec: LinkSpec, *, uplink: TokenBucket | None = None, seed: int = 0,
                 clock: Callable[[], float] = time.monotonic, backlogs: Backlogs | None = None) -> None:
        """clock: the event loop's clock (asyncio's is time.monotonic); tests pass a fake one.
        backlogs: a count shared by a node's shapers of how many are backlogged (an O(1) "busy")."""
        self.spec = spec
        self.backlogs = backlogs
        self._clock = clock
        self.bucket = TokenBucket(spec.rate_mbps * MBIT, reserve_s=EARLY_S, clock=clock)
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
        self.held_s = 0.0  # backlog time the node's uplink, not this link, held the pieces back
        self.idle_s = 0.0  # backlog time the link had nothing to send (the delay line still held pieces)
        self._pending = 0  # written in the backlog still open
        self.wrote_at = 0.0  # when the latest piece was written, as the books count it (the delay line's clock)
        self._held = 0.0  # held_s of the backlog still open
        self._idle = 0.0  # idle_s of the backlog still open
        self._last_release: float | None = None  # when the open backlog's previous piece was released
        self._backlog = False
        # pieces released, not yet written: (bytes, write due, uplink due, uplink backlog), for the
        # uplink's books (kept only when the node has an Uplink with books)
        self._inflight: deque[tuple[int, float, float, _CapBacklog | None]] = deque()
        self._books_uplink = isinstance(uplink, Uplink)
        # kernel books (tc backend: this shaper keeps only delay; the kernel shapes the rate): the
        # wire as the configured rate would drain it, to tell time the link waited for data
        self.kernel_rate: float | None = None
        self._vfree: float | None = None  # when the kernel's link would have sent what was released
        # ... and when it would have sent the previous backlog's bytes: a backlog that starts before
        # then queues behind them in the kernel, and that time was booked by the previous backlog
        self._kernel_tail = -math.inf
        self._was_idle = True  # the sender had nothing to send since the previous release
        # rate changes (a trace) while a backlog is open: (when, on the wire clock, the rate before it).
        # The books hold a backlog against the rate each part of it had, not against the last one
        self._rate_steps: list[tuple[float, float]] = []

    @property
    def rate_mbps(self) -> float:
        return 0.0 if self._outage else self.bucket.rate / MBIT

    def set_kernel_rate(self, rate_Bps: float) -> None:
        """tc backend: the kernel shapes this link to rate_Bps (this shaper keeps only the delay).
        The books then judge what the sender handed the kernel while it had data against that rate:
        a starved agent leaves the kernel's queue empty. An outage (0) keeps the last rate."""
        if rate_Bps > 0:
            if self.bucket.unlimited and self.kernel_rate is not None and rate_Bps != self.kernel_rate:
                self._rate_step(self.kernel_rate, 0.0)  # the kernel sends what it holds at the new rate
            self.kernel_rate = rate_Bps

    def _rate_step(self, before: float, lag: float) -> None:
        """The books' rate moves now: a backlog open across it keeps `before` for its part up to `lag`
        from now, on the wire's time (the bucket's pieces reach the wire one delay after their release)."""
        if self._backlog:
            self._rate_steps.append((self._clock() + lag, before))

    def _mean_rate(self, since: float, until: float, rate: float) -> float:
        """The books' rate averaged over [since, until]: `rate` after the last step, each step's
        `before` up to it (an open backlog's steps, _rate_step)."""
        steps, self._rate_steps = self._rate_steps, []
        if not steps or until <= since:
            return rate
        area, t0 = 0.0, since
        for t, before in steps:
            t = min(max(t, since), until)
            area += (t - t0) * before
            t0 = t
        area += (until - t0) * rate
        return area / (until - since)

    def sender_idle(self, idle: bool) -> None:
        """The link's sender has nothing to send (True) or has again (False): kernel books count
        the wire's idle time only after the sender ran out of data, never while it was held back."""
        if idle:
            self._was_idle = True

    def kernel_busy(self) -> None:
        """The sender has data again, and the kernel still holds some of ours: the wire never idled."""
        self._was_idle = False

    def _kernel_release(self, now: float, nbytes: int) -> None:
        """Kernel books: pieces released at `now` keep the configured rate's wire busy until _vfree;
        if the sender had run dry and the wire went free before this release, the link waited for data."""
        assert self.kernel_rate is not None
        vfree = self._vfree
        if vfree is not None and self._was_idle and now > vfree:
            self._idle += now - vfree
        start = max(now, self._kernel_tail) if vfree is None else max(vfree, now)
        self._vfree = start + nbytes / self.kernel_rate
        self._was_idle = False

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
            if not self.bucket.unlimited and rate_mbps * MBIT != self.bucket.rate:
                self._rate_step(self.bucket.rate, self.delay_s)
            self.bucket.set_rate(rate_mbps * MBIT)
        self._wake()

    @property
    def written_bytes(self) -> int:
        """Bytes written to the wire so far, at their due times (not when scheduled ahead)."""
        return self.sent_bytes + self._pending

    @property
    def backlogged(self) -> bool:
        """True from the first piece of a backlog until the wire is idle again (the loop-lag check
        judges the loop while the node had traffic)."""
        return self._backlog

    def _set_backlog(self, on: bool) -> None:
        if on != self._backlog:
            self._backlog = on
            if self.backlogs is not None:
                self.backlogs.n += 1 if on else -1

    def release_in(self, nbytes: int) -> float:
        self._set_backlog(True)
        wait = self.bucket.delay_for(nbytes)
        now = self._clock()
        if self.kernel_rate is not None and self.bucket.unlimited:
            self._kernel_release(now, nbytes)
        if self._last_release is not None and now > self._last_release and not self.bucket.unlimited:
            # the wire went free (the previous piece was through) before this piece was asked for: the
            # link waited for data (an upstream slower than it, a receiver pushing back), not for CPU.
            # A sender that schedules 20 ms ahead comes late only if its loop does (the lag check)
            self._idle += now - self._last_release
        if self.uplink is not None:
            up = self.uplink.delay_for(nbytes)
            if up > wait and not self.bucket.unlimited:
                # the uplink holds this piece back beyond what the link alone would (its own tokens,
                # or right behind the previous piece at the link's rate): not the link's shortfall
                alone = now + wait
                if self._last_release is not None:
                    alone = max(alone, self._last_release + nbytes / self.bucket.rate)
                self._held += max(0.0, now + up - alone)
            wait = max(wait, up)
            self._last_release = now + wait
            offset = wait + self.delay_s + (self._rng.uniform(0, self.jitter_s) if self.jitter_s else 0.0)
            if self._books_uplink:
                assert isinstance(self.uplink, Uplink)
                self._forget_stale(now)
                self._inflight.append((nbytes, now + offset, now + up, self.uplink.released(up)))
            return offset
        self._last_release = now + wait
        if self.jitter_s:
            return wait + self.delay_s + self._rng.uniform(0, self.jitter_s)
        return wait + self.delay_s

    def release_run(self, sizes: list[int]) -> list[float]:
        """release_in for the consecutive pieces of one segment, with one clock reading and one pass
        over the bucket (what the delay line asks per segment). Same tokens, books and offsets as one
        release_in per piece; the node's uplink keeps its per-piece books, so with one it is exactly that."""
        if self.uplink is not None or not sizes:
            return [self.release_in(n) for n in sizes]
        self._set_backlog(True)
        bucket = self.bucket
        waits = bucket.delays_for(sizes)
        if not bucket.unlimited:
            now = bucket._last  # the clock reading of this refill
            if self._last_release is not None and now > self._last_release:
                self._idle += now - self._last_release  # as in release_in: the wire waited for data
            self._last_release = now + waits[-1]
        else:
            now = self._last_release = self._clock()
            if self.kernel_rate is not None:
                self._kernel_release(now, sum(sizes))
        delay = self.delay_s
        if self.jitter_s:
            uniform, jitter = self._rng.uniform, self.jitter_s
            return [w + delay + uniform(0, jitter) for w in waits]
        return [w + delay for w in waits]

    def wrote(self, nbytes: int, at: float | None = None) -> None:
        """A released piece was written; `at`: when, as far as the books are concerned (the writer
        may say a write its own timer grain delayed was on time; default now)."""
        self._pending += nbytes
        now = self._clock() if at is None else at
        self.wrote_at = max(self.wrote_at, now)
        if self._inflight:  # the uplink's books: this piece crossed the uplink `late` after its tokens
            self._forget_stale(now)
            if self._inflight:
                _, due, up_due, cap = self._inflight.popleft()
                if cap is not None:
                    assert isinstance(self.uplink, Uplink)
                    self.uplink.written(cap, nbytes, up_due + max(0.0, now - due))

    def wrote_run(self, sizes: list[int], ats: list[float], floor: float) -> None:
        """`wrote` for consecutive pieces written at once, piece j at max(ats[j], floor): one call,
        the same books (per piece only where the node's uplink keeps books of its own)."""
        if self._books_uplink:
            for n, at in zip(sizes, ats, strict=True):
                self.wrote(n, max(at, floor))
        else:
            self._pending += sum(sizes)
            self.wrote_at = max(self.wrote_at, ats[-1], floor)

    def _forget_stale(self, now: float) -> None:
        """Pieces the overlay dropped unwritten (their connection closed) leave the uplink's books."""
        q = self._inflight
        while q and q[0][1] < now - STALE_S:
            cap = q.popleft()[3]
            if cap is not None:
                assert isinstance(self.uplink, Uplink)
                self.uplink.written(cap, 0, None)

    def wire_busy(self, since: float, until: float, last_nbytes: int) -> None:
        self._set_backlog(False)
        self._last_release = None
        held, self._held = self._held, 0.0
        idle, self._idle = self._idle, 0.0
        vfree = self._vfree if self.bucket.unlimited else None
        self._vfree, self._was_idle = None, True
        rate = self.bucket.rate
        if self.bucket.unlimited:
            if self.kernel_rate is None:  # delay-only and no kernel rate known: no rate to keep books against
                self._pending = 0
                self._rate_steps = []
                return
            rate = self.kernel_rate
        if vfree is not None:  # kernel books
            # a sender that ran dry for a moment while the kernel still held its bytes, then had data
            # again: until the kernel is through with those, the wire is the previous backlog's
            # (booked there), not this one's, and this one's bytes cannot go sooner
            since = max(since, self._kernel_tail + self.delay_s)
            self._kernel_tail = vfree
        span = max(0.0, until - since) + last_nbytes / rate
        if vfree is not None:  # kernel books: what was written is through at the configured rate by then
            span = max(span, vfree + self.delay_s - since)
        rate = self._mean_rate(since, since + span, rate)
        held = min(held, span)
        idle = min(idle, span - held)
        self.busy_s += span
        self.held_s += held
        self.idle_s += idle
        # time the uplink held the pieces is judged by the uplink's books, and time the link waited for
        # data is nobody's shortfall: neither is held against the link
        self.expected_bytes += (span - held - idle) * rate
        self.sent_bytes += self._pending
        self._pending = 0

    def guard(self) -> dict[str, float]:
        """Achieved vs configured while backlogged (1.0 = the link got all its rate)."""
        # the bucket's initial burst is free: never report more than the rate allowed
        ratio = min(1.0, self.sent_bytes / self.expected_bytes) if self.expected_bytes > 0 else 1.0
        rate_mbps = self.kernel_rate / MBIT if self.bucket.unlimited and self.kernel_rate else self.rate_mbps
        return {"busy_s": self.busy_s, "held_s": self.held_s, "idle_s": self.idle_s,
                "sent_bytes": float(self.sent_bytes),
                "expected_bytes": self.expected_bytes, "achieved_ratio": ratio,
                "rate_mbps": rate_mbps}


@dataclass(eq=False)
class _CapBacklog:
    """One stretch of pieces that each found the uplink in debt (the uplink made them wait)."""

    since: float | None = None  # when its first piece crossed (virtual: tokens paid + lateness)
    until: float = 0.0
    last_n: int = 0
    sent: int = 0
    pending: int = 0  # released, not yet written
    open: bool = True
    rate: float = 0.0  # the uplink's rate while it lasted (a trace's change ends a backlog)


def _books(busy_s: float, expected: float, sent: float, rate_Bps: float) -> dict[str, float]:
    ratio = min(1.0, sent / expected) if expected > 0 else 1.0
    return {"busy_s": busy_s, "sent_bytes": float(sent), "expected_bytes": expected, "achieved_ratio": ratio,
            "rate_mbps": rate_Bps / MBIT}


class Uplink(TokenBucket):
    """A node's uplink cap: one bucket every outgoing link takes its tokens from, with the guard's books.

    A backlog is a stretch of pieces that each found the bucket in debt. The books are kept when the
    pieces are written: one written `late` seconds after its due time crossed the uplink `late`
    seconds after its tokens were paid, so a loop that writes late stretches the backlog without
    adding bytes, as on a link. Bytes sent over the backlog vs rate x its length: the bucket's
    accounting is exact, so only lateness (a CPU-starved process) brings the ratio below 1."""

    def __init__(self, rate_Bps: float, *, clock: Callable[[], float] = time.monotonic, **kw: object) -> None:
        super().__init__(rate_Bps, clock=clock, **kw)  # type: ignore[arg-type]
        self._current: _CapBacklog | None = None
        self._unsettled: list[_CapBacklog] = []
        self.busy_s = 0.0
        self.expected_bytes = 0.0
        self.sent_bytes = 0

    def released(self, wait: float) -> _CapBacklog | None:
        """A piece took its tokens and waits `wait` for them: the backlog it belongs to (None: the
        uplink was not in debt, so it did not limit this piece and its backlog, if any, has ended)."""
        cur = self._current
        if wait <= 0:
            if cur is not None:
                cur.open = False
                self._current = None
                self._settle(cur)
            return None
        if cur is None:
            cur = self._current = _CapBacklog(rate=self.rate)
            self._unsettled.append(cur)
        cur.pending += 1
        return cur

    def written(self, cap: _CapBacklog, nbytes: int, crossed: float | None) -> None:
        """A piece of `cap` was written; `crossed`: its virtual crossing time (None: never written)."""
        cap.pending -= 1
        if crossed is not None:
            if cap.since is None:
                cap.since = crossed
            cap.sent += nbytes
            if crossed >= cap.until:
                cap.until, cap.last_n = crossed, nbytes
        self._settle(cap)

    def _settle(self, cap: _CapBacklog) -> None:
        if cap.open or cap.pending > 0:
            return
        self._unsettled.remove(cap)
        busy, expected = self._span(cap)
        self.busy_s += busy
        self.expected_bytes += expected
        self.sent_bytes += cap.sent

    def _span(self, cap: _CapBacklog) -> tuple[float, float]:
        if cap.since is None:
            return 0.0, 0.0
        span = max(0.0, cap.until - cap.since) + cap.last_n / cap.rate
        return span, span * cap.rate

    def set_rate(self, rate_Bps: float) -> None:
        """A new cap rate (a trace) ends the backlog: each is booked at the rate it ran at."""
        cur = self._current
        if cur is not None and rate_Bps != self.rate:
            cur.open = False
            self._current = None
            self._settle(cur)
        super().set_rate(rate_Bps)

    def guard(self) -> dict[str, float]:
        """Achieved vs configured while the uplink was the binding constraint (backlogs still being
        written count with what is written so far)."""
        busy, expected, sent = self.busy_s, self.expected_bytes, float(self.sent_bytes)
        for cap in self._unsettled:
            b, e = self._span(cap)
            busy, expected, sent = busy + b, expected + e, sent + cap.sent
        return _books(busy, expected, sent, self.rate)


class Downlink(TokenBucket):
    """A node's downlink cap (the receive limiter: a connection stops reading while it is in debt),
    with the guard's books: bytes received while in debt vs rate x that time.

    A backlog starts with a read that leaves the bucket in debt and goes on while every next read
    comes before the debt is paid, or after it, within RESUME_GAP_S, when a connection the debt had
    paused found data waiting as it resumed (`resumed`): the cap, not the senders, held it back. A
    read after the debt of data that was not waiting (the senders' next task) starts a new backlog.
    Bytes = tokens at its start + rate x its length - tokens lost to the burst cap, so only reads
    resumed so late that the bucket overflowed (a CPU-starved loop) lower the ratio."""

    def __init__(self, rate_Bps: float, *, clock: Callable[[], float] = time.monotonic, **kw: object) -> None:
        super().__init__(rate_Bps, clock=clock, **kw)  # type: ignore[arg-type]
        self._since: float | None = None
        self._paid_at = 0.0
        self._sent = 0
        self._held = False  # since the last read in debt, a paused connection resumed with data waiting
        self.busy_s = 0.0
        self.expected_bytes = 0.0
        self.sent_bytes = 0

    def resumed(self, waiting: bool) -> None:
        """A connection paused for the debt reads again; `waiting`: the kernel held data for it."""
        self._held = self._held or waiting

    def delay_for(self, nbytes: int, *, allow_large: bool = False) -> float:
        wait = super().delay_for(nbytes, allow_large=allow_large)
        if self.unlimited:
            return wait
        now = self._last  # the clock reading of this refill
        late = now > self._paid_at
        if self._since is not None and (wait <= 0 or (late and not self._held) or now > self._paid_at + RESUME_GAP_S):
            self._close()  # the senders paused, or this read found the debt paid: the backlog ended then
        if wait > 0:
            if self._since is None:
                self._since, self._sent = now, 0
            self._sent += nbytes
            self._paid_at = now + wait
            self._held = False
        return wait

    @property
    def in_debt(self) -> bool:
        return self._since is not None and self._clock() < self._paid_at

    def set_rate(self, rate_Bps: float) -> None:
        """A new cap rate (a trace) ends the backlog: each is booked at the rate it ran at."""
        if self._since is not None and rate_Bps != self.rate:
            self._paid_at = min(self._paid_at, self._clock())
            self._close()
        super().set_rate(rate_Bps)

    def _close(self) -> None:
        assert self._since is not None
        span = max(0.0, self._paid_at - self._since)
        self.busy_s += span
        self.expected_bytes += span * self.rate
        self.sent_bytes += self._sent
        self._since = None

    def guard(self) -> dict[str, float]:
        busy, expected, sent = self.busy_s, self.expected_bytes, float(self.sent_bytes)
        if self._since is not None:
            span = max(0.0, self._paid_at - self._since)
            busy, expected, sent = busy + span, expected + span * self.rate, sent + self._sent
        return _books(busy, expected, sent, self.rate)
