"""The emulated wire of one link: pieces released by the pacer, written on schedule by one timer.

When a pacer (the emulated WAN) is attached, every segment is cut into pieces no larger than its
burst, and the pacer says when each piece may arrive (token-bucket release plus one-way delay).
Pieces wait in this line, which the process's wire clock writes out on schedule: the sender never
sleeps per piece, delay is pipelined, and a process that is descheduled for a moment does not leave
the emulated wire idle (the schedule, not the wake-up, decides the rate). What the line writes goes
into the pacer's fidelity books (`wrote`, `wire_busy`).

Every delay line of a process shares one timer (`WireClock`): a wake-up writes every line's due
pieces, and when pieces of many links come due at different moments, wake-ups are at least
FLUSH_GRAIN_S apart (pieces that came due meanwhile are written in that wake-up, at most
FLUSH_GRAIN_S late; never earlier than the pacer's `early_s`). A node sending on fifteen links then
wakes up about as often as one sending on two. A segment's pieces stay together in the line as one
run (their due times, where each ends): a wake-up writes the due part of a run as one slice and books
it in one call, so a piece costs a list entry, not a Python object, a method call and a write of its
own. A late write never gives a link more than its rate (the schedule decides it); the fidelity
books count the lateness at the end of a backlog.

On a kernel-shaped link (tc backend: the pacer keeps only delay, `set_kernel_rate` gives the rate
the kernel shapes to) nothing is paced here, but the queues below the sender's round-robin are
sized from that rate: KERNEL_AHEAD_S of link time each (this line beyond its delay, the transport
buffer, unsent socket bytes via TCP_NOTSENT_LOWAT). Unbounded,
the socket and the line hold megabytes: a node's own chunks were all queued before a relayed flow's
first segment arrived, so relays and fairness waited behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
import socket
import time
import weakref
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from itertools import accumulate
from typing import Protocol

from .codec import FrameProtocol

LINE_SLACK = 4 << 20  # bytes the delay line may hold beyond (delay + lookahead) x rate
LOOKAHEAD_S = 0.020  # how far ahead of the wire the sender may schedule pieces (bounds the line)
KERNEL_AHEAD_MIN = 64 << 10  # kernel-shaped links: the least each queue below the round-robin may hold
# ... and the link time each may hold. The kernel asks for more (wakes the sender) only when an ACK
# comes in, and a link's ACKs queue behind the data going the other way: with 10 ms, a 2-node ring at
# 100 Mbit/s left its links idle 13 % of the time (1.87 s a round, the simulator 1.63); with 40 ms,
# 1.63 s and the books at 99.7 %. Still short next to a round, so relays and fairness keep deciding
KERNEL_AHEAD_S = 0.040
# A process's delay lines wake up together at most every FLUSH_GRAIN_S: a piece that comes due in
# between waits at most that long. 2 ms: a tenth of the guard's 20 ms lag limit and of LOOKAHEAD_S
FLUSH_GRAIN_S = 0.001


class Pacer(Protocol):
    """What the emulated WAN offers a sender (see emulation.link.LinkShaper)."""

    max_write: int
    delay_s: float
    jitter_s: float
    early_s: float  # how much before its time a piece may be written
    rate_Bps: float  # the link's current rate in bytes/s (inf: unlimited)

    def release_in(self, nbytes: int) -> float:
        """Take nbytes of tokens; seconds from now until they have crossed the link (rate + delay)."""

    def release_run(self, sizes: list[int]) -> list[float]:
        """release_in for consecutive pieces (one segment), in one call."""

    def wire_busy(self, since: float, until: float, last_nbytes: int) -> None:
        """Fidelity books: the wire had a backlog from `since` until the last piece (written at
        `until`, the wire clock's time) was through."""

    def wrote(self, nbytes: int, at: float | None = None) -> None: ...


class _Run:
    """Consecutive pieces of one segment (or one control frame) for one socket: piece j is
    seg[ends[j - 1]:ends[j]], piece 0 with `head` (the frame's header) before it, due at dues[j];
    `booked[j]`: the released piece's bytes for the books (None: a control frame, not booked).
    `next`: the first piece not yet written."""

    __slots__ = ("conn", "head", "seg", "ends", "dues", "booked", "next")

    def __init__(self, conn: FrameProtocol, head: bytes, seg: memoryview | bytes, ends: list[int],
                 dues: list[float], booked: list[int] | None) -> None:
        self.conn, self.head, self.seg, self.ends, self.dues, self.booked = conn, head, seg, ends, dues, booked
        self.next = 0


class WireClock:
    """The one timer of every delay line on an event loop. A line asks to be flushed at a time; the
    clock wakes at the earliest such time, but never sooner than `grain` after its previous wake-up,
    and flushes every line whose time has come.

    Its times are `now()`'s, not the loop's: uvloop's loop.time() counts whole milliseconds, and the
    lines' due times are the fidelity books' times, set against the pacers' own (time.monotonic), so
    a millisecond off per backlog reads as a link ~15 % short on a 3 ms backlog. The loop's timer is
    asked in the loop's time, converted."""

    def __init__(self, loop: asyncio.AbstractEventLoop, grain: float = FLUSH_GRAIN_S,
                 now: Callable[[], float] | None = None) -> None:
        self.loop = loop
        self.grain = grain
        self.now = now or loop.time
        self.wakeups = 0
        self.late_s = 0.0  # summed over wake-ups: how long after the earliest line's time it came
        self.late_max_s = 0.0
        self._heap: list[tuple[float, int, DelayLine]] = []
        self._seq = 0
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = math.inf
        self._last = -math.inf

    def want(self, line: DelayLine, t: float) -> None:
        """Flush `line` at time t (this clock's; or at its first wake-up after it)."""
        line._want_t = t
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, line))
        if t < self._armed_at:
            self._arm()

    def _arm(self) -> None:
        heap = self._heap
        while heap and heap[0][2]._want_t != heap[0][0]:  # stale: flushed, dropped or asked again
            heapq.heappop(heap)
        if not heap:
            return
        t = max(heap[0][0], self._last + self.grain)
        if self._handle is not None:
            if self._armed_at <= t:
                return
            self._handle.cancel()
        self._armed_at = t
        self._handle = self.loop.call_at(self.loop.time() + (t - self.now()), self._fire)

    def _fire(self) -> None:
        self._handle, self._armed_at = None, math.inf
        self.wakeups += 1
        now = self._last = self.now()
        heap = self._heap
        if heap:
            late = now - heap[0][0]
            self.late_s += late
            self.late_max_s = max(self.late_max_s, late)
        lines = []
        while heap and heap[0][0] <= now:
            t, _, line = heapq.heappop(heap)
            if line._want_t == t:
                line._want_t = None
                lines.append(line)
        for line in lines:
            line._flush(now)
        self._arm()


_CLOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WireClock] = weakref.WeakKeyDictionary()


def wire_clock(loop: asyncio.AbstractEventLoop | None = None) -> WireClock:
    """The loop's WireClock (one per event loop, shared by every delay line on it)."""
    loop = loop or asyncio.get_running_loop()
    clock = _CLOCKS.get(loop)
    if clock is None:
        # asyncio's own loops keep time.monotonic(); any other (uvloop) gets it here
        exact = isinstance(loop, asyncio.BaseEventLoop)
        clock = _CLOCKS[loop] = WireClock(loop, now=None if exact else time.monotonic)
    return clock


class DelayLine:
    """Pieces of one link's segments and control frames, each due at the time the pacer gave it."""

    def __init__(self, pacer: Pacer) -> None:
        self.pacer = pacer
        self.conn: FrameProtocol | None = None  # the sender's socket: pieces queued for another are dropped
        self._idle = True  # the sender has nothing to schedule: with the line empty, the wire's backlog ended
        self.kernel_rate_Bps: float | None = None  # rate the kernel shapes this link to (tc backend)
        self.bytes = 0  # bytes in the line
        self.space = asyncio.Event()  # set while the line holds no more than cap()
        self.space.set()
        self._line: deque[_Run] = deque()  # runs of pieces in due order (FIFO, even with jitter)
        self._want_t: float | None = None  # when the wire clock is to flush this line (None: not asked)
        self._last_due = 0.0
        self._wire_since: float | None = None  # start of the current backlog on the emulated wire
        self._last_write = 0.0
        self._last_piece = 0
        self._clock: WireClock | None = None
        self._grain = FLUSH_GRAIN_S

    def start(self) -> None:
        self._clock = wire_clock()
        self._grain = self._clock.grain

    @property
    def idle(self) -> bool:
        """The sender has nothing to schedule (set by the sender; its pacer hears it too)."""
        return self._idle

    @idle.setter
    def idle(self, idle: bool) -> None:
        self._idle = idle
        tell = getattr(self.pacer, "sender_idle", None)
        if tell is not None:
            tell(idle)
        if not idle and self._line and self.kernel_shaped():
            busy = getattr(self.pacer, "kernel_busy", None)  # pieces still on their way: the wire was busy
            if busy is not None:
                busy()

    def __len__(self) -> int:
        return len(self._line)

    # --- what the sender puts on the wire ------------------------------------------------------------
    async def send(self, conn: FrameProtocol, prefix: bytes, seg: memoryview) -> None:
        """Put a segment's pieces on the line at the times the pacer releases them; return once the
        line has room again (bounded even when the rate is not). The header rides with the first
        piece: one release and one write for both."""
        pacer = self.pacer
        step = pacer.max_write
        n = len(seg)
        first = min(n, max(0, step - len(prefix)))
        ends = [first, *range(first + step, n, step)] if first < n else [first]
        if ends[-1] != n:
            ends.append(n)
        sizes = [len(prefix) + first, *(b - a for a, b in zip(ends, ends[1:], strict=False))]
        offsets = pacer.release_run(sizes)
        now = self._now()
        # FIFO even with jitter: no piece is due before the one ahead of it
        dues = list(accumulate((now + o for o in offsets), max, initial=self._last_due))[1:]
        run = _Run(conn, prefix, seg, ends, dues, sizes)
        if dues[0] - now <= pacer.early_s and not self._line:  # due now, nothing ahead: write now, no timer
            self._last_due = dues[-1]
            self._line.append(run)
            self.bytes += len(prefix) + n
            self._flush(now)  # what is due goes now; the clock is asked for the rest
        else:
            self._put(run, len(prefix) + n)
        ahead = offsets[-1] - pacer.delay_s
        if ahead > LOOKAHEAD_S:  # one wake-up per ~LOOKAHEAD_S/2 of wire time, not one per piece
            await asyncio.sleep(ahead - LOOKAHEAD_S / 2)
        if self.bytes > self.cap():
            self.space.clear()
            await self.space.wait()

    def control(self, conn: FrameProtocol, data: bytes) -> None:
        """Control frames cost no tokens but keep FIFO order with the data pieces already scheduled."""
        if not self._line and self.pacer.delay_s <= 0:
            conn.write_raw(data)
        else:
            self.append(self._now() + self.pacer.delay_s, data, conn, booked=0)

    def append(self, due: float, data: bytes | memoryview, conn: FrameProtocol, *, booked: int) -> None:
        """Queue `data` alone for the wire at `due` (the wire clock's time); `booked`: bytes of a released piece it
        completes (0: none, a control frame)."""
        due = max(self._last_due, due)
        self._put(_Run(conn, b"", data, [len(data)], [due], [booked] if booked else None), len(data))

    def _put(self, run: _Run, nbytes: int) -> None:
        self._last_due = run.dues[-1]
        self._line.append(run)
        self.bytes += nbytes
        if len(self._line) == 1:
            assert self._clock is not None
            self._clock.want(self, run.dues[0] - self.pacer.early_s)

    def drop(self) -> None:
        """Forget every queued piece (the socket they were for is gone, or the sender closes)."""
        self._line.clear()
        self.bytes = 0
        self.space.set()
        self._want_t = None  # the clock forgets this line's wake-up
        self.maybe_wire_idle()

    def maybe_wire_idle(self) -> None:
        """The sender is idle and the line empty: the wire's backlog ended, book it."""
        if self._idle and not self._line and self._wire_since is not None:
            self.pacer.wire_busy(self._wire_since, self._last_write, self._last_piece)
            self._wire_since = None

    # --- the timer -----------------------------------------------------------------------------------
    def _flush(self, now: float) -> None:
        """Write every piece that is due (a wake-up of the wire clock), each run's due part as one
        slice; a late wake-up catches up instead of idling the wire."""
        conn = self.conn
        line = self._line
        limit = now + self.pacer.early_s
        parts: list[bytes | memoryview] = []
        gone = 0
        while line:
            run = line[0]
            i = run.next
            if run.dues[i] > limit:
                break
            k = bisect_right(run.dues, limit, i)
            lo = run.ends[i - 1] if i else 0
            hi = run.ends[k - 1]
            gone += hi - lo + (len(run.head) if i == 0 else 0)
            if run.conn is conn and conn is not None:  # never bytes of a dead socket on a new one
                if i == 0 and run.head:
                    parts.append(run.head)
                if hi > lo:
                    parts.append(run.seg[lo:hi])
                if run.booked is not None:
                    self._book(run, i, k, now)
            if k < len(run.dues):
                run.next = k
                break
            line.popleft()
        self.bytes -= gone
        if parts:
            assert conn is not None
            conn.write_many(parts)  # everything due in one writev, not one send per piece
        if not self.space.is_set() and self.bytes <= self.cap():  # most flushes find no sender waiting
            self.space.set()
        if line:
            assert self._clock is not None
            head = line[0]
            self._clock.want(self, head.dues[head.next] - self.pacer.early_s)
        else:
            self._want_t = None  # nothing left: a wake-up asked for earlier has nothing to do
            self.maybe_wire_idle()

    def _book(self, run: _Run, i: int, k: int, now: float) -> None:
        """The fidelity books for pieces i..k-1 of a run: a piece written late crossed late, unless the
        wire clock's own grain (FLUSH_GRAIN_S, this emulator's choice) is all that delayed it; acks do
        not extend a backlog. One call for the run's pieces where the pacer keeps no per-piece books."""
        assert run.booked is not None
        dues, booked = run.dues, run.booked
        if self._wire_since is None:
            self._wire_since = dues[i]
        floor = now - self._grain
        wrote_run = getattr(self.pacer, "wrote_run", None)
        if wrote_run is not None:
            wrote_run(booked[i:k], dues[i:k], floor)
        else:
            for j in range(i, k):
                self.pacer.wrote(booked[j], max(dues[j], floor))
        self._last_piece = booked[k - 1]
        self._last_write = max(dues[k - 1], floor)

    # --- sizes ---------------------------------------------------------------------------------------
    def cap(self) -> float:
        """Bytes the line may hold before the sender waits."""
        pacer = self.pacer
        if self.kernel_shaped():  # the line holds the bytes in flight over the delay, and a little more
            assert self.kernel_rate_Bps is not None
            return self.kernel_rate_Bps * (pacer.delay_s + pacer.jitter_s) + self.kernel_ahead()
        if math.isinf(pacer.rate_Bps):
            return LINE_SLACK
        return pacer.rate_Bps * (pacer.delay_s + pacer.jitter_s + LOOKAHEAD_S) + LINE_SLACK

    def rate_Bps(self) -> float:
        """The link's rate: the pacer's, or on a kernel-shaped link the kernel's (inf: unlimited)."""
        if self.kernel_shaped():
            assert self.kernel_rate_Bps is not None
            return self.kernel_rate_Bps
        return self.pacer.rate_Bps

    def kernel_shaped(self) -> bool:
        return self.kernel_rate_Bps is not None and math.isinf(self.pacer.rate_Bps)

    def kernel_ahead(self) -> int:
        """Bytes each queue below the round-robin may hold on a kernel-shaped link: KERNEL_AHEAD_S."""
        assert self.kernel_rate_Bps is not None
        return max(KERNEL_AHEAD_MIN, int(self.kernel_rate_Bps * KERNEL_AHEAD_S))

    def set_kernel_rate(self, rate_Bps: float) -> None:
        """The kernel shapes this link to rate_Bps; an outage (0) keeps the last rate, as the
        application shaper does. The pacer hears it too: it keeps the kernel books."""
        if rate_Bps > 0:
            self.kernel_rate_Bps = rate_Bps
        tell = getattr(self.pacer, "set_kernel_rate", None)
        if tell is not None and math.isinf(self.pacer.rate_Bps):
            tell(rate_Bps)
        if self.conn is not None:
            self.bound_kernel_queue(self.conn)

    def bound_kernel_queue(self, conn: FrameProtocol) -> None:
        """Kernel-shaped link: the transport buffers at most kernel_ahead() before the send loop
        waits (drain), and the socket keeps at most that much unsent (TCP_NOTSENT_LOWAT), instead of
        the default megabytes (SO_SNDBUF) that would make round-robin decisions far ahead of the wire."""
        if not self.kernel_shaped() or conn.transport is None:
            return
        ahead = self.kernel_ahead()
        conn.transport.set_write_buffer_limits(high=ahead, low=ahead // 2)
        sock = conn.transport.get_extra_info("socket")
        if sock is not None and hasattr(socket, "TCP_NOTSENT_LOWAT"):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, ahead)

    @property
    def early(self) -> float:
        return self.pacer.early_s

    def _now(self) -> float:
        assert self._clock is not None
        return self._clock.now()
