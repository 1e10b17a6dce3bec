"""The emulated wire of one link: pieces released by the pacer, written by one timer on schedule.

When a pacer (the emulated WAN) is attached, every segment is cut into pieces no larger than its
burst, and the pacer says when each piece may arrive (token-bucket release plus one-way delay).
Pieces wait in this line, which one timer callback writes out on schedule: the sender never sleeps
per piece, delay is pipelined, and a process that is descheduled for a moment does not leave the
emulated wire idle (the schedule, not the wake-up, decides the rate). What the line writes goes
into the pacer's fidelity books (`wrote`, `wire_busy`).

On a kernel-shaped link (tc backend: the pacer keeps only delay, `set_kernel_rate` gives the rate
the kernel shapes to) nothing is paced here, but the queues below the sender's round-robin are
sized from that rate: about LOOKAHEAD_S of link time between the round-robin and the wire (this
line beyond its delay, the transport buffer, unsent socket bytes via TCP_NOTSENT_LOWAT). Unbounded,
the socket and the line hold megabytes: a node's own chunks were all queued before a relayed flow's
first segment arrived, so relays and fairness waited behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
from collections import deque
from typing import Protocol

from .codec import FrameProtocol

LINE_SLACK = 4 << 20  # bytes the delay line may hold beyond (delay + lookahead) x rate
LOOKAHEAD_S = 0.020  # how far ahead of the wire the sender may schedule pieces (bounds the line)
KERNEL_AHEAD_MIN = 64 << 10  # kernel-shaped links: the least each queue below the round-robin may hold


class Pacer(Protocol):
    """What the emulated WAN offers a sender (see emulation.link.LinkShaper)."""

    max_write: int
    delay_s: float
    jitter_s: float
    early_s: float  # how much before its time a piece may be written
    rate_Bps: float  # the link's current rate in bytes/s (inf: unlimited)

    def release_in(self, nbytes: int) -> float:
        """Take nbytes of tokens; seconds from now until they have crossed the link (rate + delay)."""

    def wire_busy(self, since: float, until: float, last_nbytes: int) -> None:
        """Fidelity books: the wire had a backlog from `since` until the last piece (written at
        `until`, loop time) was through."""

    def wrote(self, nbytes: int) -> None: ...


class DelayLine:
    """Pieces of one link's segments and control frames, each due at the time the pacer gave it."""

    def __init__(self, pacer: Pacer) -> None:
        self.pacer = pacer
        self.conn: FrameProtocol | None = None  # the sender's socket: pieces queued for another are dropped
        self.idle = True  # the sender has nothing to schedule: with the line empty, the wire's backlog ended
        self.kernel_rate_Bps: float | None = None  # rate the kernel shapes this link to (tc backend)
        self.bytes = 0  # bytes in the line
        self.space = asyncio.Event()  # set while the line holds no more than cap()
        self.space.set()
        self._line: deque[tuple[float, bytes | memoryview, FrameProtocol, bool]] = deque()
        self._flush_handle: asyncio.TimerHandle | None = None
        self._last_due = 0.0
        self._wire_since: float | None = None  # start of the current backlog on the emulated wire
        self._last_write = 0.0
        self._last_piece = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    def __len__(self) -> int:
        return len(self._line)

    # --- what the sender puts on the wire ------------------------------------------------------------
    async def send(self, conn: FrameProtocol, prefix: bytes, seg: memoryview) -> None:
        """Put a segment's pieces on the line at the times the pacer releases them; return once the
        line has room again (bounded even when the rate is not)."""
        pacer = self.pacer
        step = pacer.max_write
        pieces: list[bytes | memoryview] = [prefix] + [seg[i:i + step] for i in range(0, len(seg), step)]
        ahead = 0.0
        for piece in pieces:
            offset = pacer.release_in(len(piece))
            now = self._now()
            if offset <= self.early and not self._line:  # due now, nothing ahead of it: write it now
                self._write(conn, now + offset, piece, now)
            else:
                self.append(now + offset, piece, conn, paced=True)
            ahead = offset - pacer.delay_s
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
            self.append(self._now() + self.pacer.delay_s, data, conn, paced=False)

    def append(self, due: float, data: bytes | memoryview, conn: FrameProtocol, *, paced: bool) -> None:
        due = max(self._last_due, due)  # FIFO even with jitter
        self._last_due = due
        self._line.append((due, data, conn, paced))
        self.bytes += len(data)
        if self._flush_handle is None:
            assert self._loop is not None
            self._flush_handle = self._loop.call_at(due - self.early, self._flush)

    def drop(self) -> None:
        """Forget every queued piece (the socket they were for is gone, or the sender closes)."""
        self._line.clear()
        self.bytes = 0
        self.space.set()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self.maybe_wire_idle()

    def maybe_wire_idle(self) -> None:
        """The sender is idle and the line empty: the wire's backlog ended, book it."""
        if self.idle and not self._line and self._wire_since is not None:
            self.pacer.wire_busy(self._wire_since, self._last_write, self._last_piece)
            self._wire_since = None

    # --- the timer -----------------------------------------------------------------------------------
    def _flush(self) -> None:
        """Write every piece that is due; a late callback catches up instead of idling the wire."""
        self._flush_handle = None
        assert self._loop is not None
        now = self._loop.time()
        conn = self.conn
        line = self._line
        early = self.early
        parts: list[bytes | memoryview] = []
        while line and line[0][0] <= now + early:
            due, data, owner, paced = line.popleft()
            self.bytes -= len(data)
            if owner is not conn or conn is None:  # never bytes of a dead socket on a new one
                continue
            parts.append(data)
            if paced:
                self._book(due, len(data), now)
        if parts:
            assert conn is not None
            conn.write_many(parts)  # everything due in one writev, not one send per piece
        if self.bytes <= self.cap():
            self.space.set()
        if line:
            self._flush_handle = self._loop.call_at(line[0][0] - early, self._flush)
        else:
            self.maybe_wire_idle()

    def _write(self, conn: FrameProtocol, due: float, data: bytes | memoryview, now: float) -> None:
        conn.write_raw(data)
        self._book(due, len(data), now)

    def _book(self, due: float, nbytes: int, now: float) -> None:
        if self._wire_since is None:
            self._wire_since = due
        self.pacer.wrote(nbytes)
        self._last_piece = nbytes
        self._last_write = max(now, due)  # only lateness counts; acks do not extend the backlog

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
        """Bytes each queue below the round-robin may hold on a kernel-shaped link: LOOKAHEAD_S / 2."""
        assert self.kernel_rate_Bps is not None
        return max(KERNEL_AHEAD_MIN, int(self.kernel_rate_Bps * LOOKAHEAD_S / 2))

    def set_kernel_rate(self, rate_Bps: float) -> None:
        """The kernel shapes this link to rate_Bps; an outage (0) keeps the last rate, as the
        application shaper does."""
        if rate_Bps > 0:
            self.kernel_rate_Bps = rate_Bps
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
        assert self._loop is not None
        return self._loop.time()
