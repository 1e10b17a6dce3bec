"""Everything one node sends to one neighbour over one TCP connection.

Transfers (chunks, own or relayed) are cut into segments: relayed ones into at most
`segment_bytes` (cut-through at every relay), single-hop ones into about 10 ms of link time
(fewer headers where the rate is high). Flows that share the link are served by deficit
round-robin, so they share it fairly in bytes. A transfer stays in `unacked` until
the neighbour acknowledges the whole chunk, and is sent again from its start after a reconnect
(the receiver drops the segments it already has).

When a pacer (the emulated WAN) is attached, every segment is cut into pieces no larger than its
burst, and the pacer says when each piece may arrive (token-bucket release plus one-way delay).
Pieces wait in a delay line that one timer callback writes out on schedule: the sender never
sleeps per piece, delay is pipelined, and a process that is descheduled for a moment does not
leave the emulated wire idle (the schedule, not the wake-up, decides the rate).

On a kernel-shaped link (tc backend: the pacer keeps only delay, `set_kernel_rate` gives the rate
the kernel shapes to) the sender does not pace, but sizes what it lets run ahead from that rate:
segments of ~10 ms of link time as above, and about LOOKAHEAD_S of link time between the
round-robin and the wire (delay line beyond its delay, transport buffer, unsent socket bytes via
TCP_NOTSENT_LOWAT). Unbounded, the socket and the line hold megabytes: a node's own chunks were all
queued before a relayed flow's first segment arrived, so relays and fairness waited behind them.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import socket
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .codec import FrameProtocol, encode

SEGMENT_BYTES = 64 * 1024
WRITE_PIECE = 256 * 1024  # largest single write on an unshaped link
DIRECT_SEGMENT_S = 0.010  # a single-hop segment may take this much link time (no relay waits for it)
DIRECT_SEGMENT_MAX = 4 << 20
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


class Blocks:
    """A relayed chunk as the segments that arrived, in order: never one buffer sized by what the
    sender announced, so a relay holds only bytes it was actually sent."""

    def __init__(self) -> None:
        self._parts: list[memoryview] = []
        self._starts: list[int] = []
        self.size = 0

    def append(self, part: memoryview) -> None:
        self._starts.append(self.size)
        self._parts.append(part)
        self.size += len(part)

    def view(self, start: int, n: int) -> memoryview:
        """Up to n bytes from `start`, within one block (a sender's segment may end early)."""
        i = bisect.bisect_right(self._starts, start) - 1
        off = start - self._starts[i]
        return self._parts[i][off:off + n]


@dataclass(eq=False)
class Transfer:
    """One chunk crossing one hop. `ready` grows while a relay is still receiving it (cut-through)."""

    key: tuple
    header: dict[str, Any]  # CHUNK header without off/nbytes/t_send
    payload: memoryview | Blocks
    ready: int
    flow: Hashable
    sent: int = 0
    t_send: float = 0.0
    done: asyncio.Future | None = None  # resolved on the hop ack
    total: int = -1  # bytes of the whole chunk (default: the payload's length)
    on_release: Callable[[], None] | None = None  # acked or cancelled: the sender holds it no longer

    def __post_init__(self) -> None:
        if self.total < 0:
            assert isinstance(self.payload, memoryview)
            self.total = len(self.payload)

    def view(self, start: int, n: int) -> memoryview:
        if isinstance(self.payload, Blocks):
            return self.payload.view(start, n)
        return self.payload[start:start + n]

    def release(self) -> None:
        if self.on_release is not None:
            self.on_release()
            self.on_release = None


@dataclass
class LinkMeter:
    bytes: int = 0
    chunks: int = 0
    busy_s: float = 0.0
    segments: int = 0
    acks: int = 0
    resent: int = 0
    _since: float | None = field(default=None, repr=False)

    def busy(self, on: bool) -> None:
        now = time.monotonic()
        if on and self._since is None:
            self._since = now
        elif not on and self._since is not None:
            self.busy_s += now - self._since
            self._since = None

    def snapshot(self) -> dict[str, float]:
        busy = self.busy_s + (time.monotonic() - self._since if self._since is not None else 0.0)
        return {"bytes": self.bytes, "chunks": self.chunks, "busy_s": busy, "segments": self.segments,
                "resent": self.resent}


class LinkSender:
    def __init__(self, local: int, remote: int, *, pacer: Pacer | None = None,
                 segment_bytes: int = SEGMENT_BYTES, clock: Callable[[], float] = time.time) -> None:
        self.local = local
        self.remote = remote
        self.pacer = pacer
        self.segment_bytes = segment_bytes
        self.clock = clock  # stamps t_send: must agree with the receiver's clock (overlay.clock)
        self.meter = LinkMeter()
        self.conn: FrameProtocol | None = None
        self.unacked: dict[tuple, Transfer] = {}
        self._flows: dict[Hashable, deque[Transfer]] = {}
        self._order: deque[Hashable] = deque()
        self._deficit: dict[Hashable, int] = {}
        self._turn: Hashable | None = None
        self._control: deque[dict[str, Any]] = deque()
        self._wake = asyncio.Event()
        self._attached = asyncio.Event()
        self._line: deque[tuple[float, bytes | memoryview, FrameProtocol, bool]] = deque()
        self._flush_handle: asyncio.TimerHandle | None = None
        self._line_bytes = 0
        self._line_space = asyncio.Event()
        self._line_space.set()
        self._last_due = 0.0
        self._idle = True  # the send loop has nothing to schedule
        self._wire_since: float | None = None  # start of the current backlog on the emulated wire
        self._last_write = 0.0
        self._last_piece = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        self._closed = False
        self.kernel_rate_Bps: float | None = None  # rate the kernel shapes this link to (tc backend)
        self._last_progress = time.monotonic()  # last ack, or when unacknowledged chunks began to wait

    # --- public -----------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = [asyncio.create_task(self._send_loop(), name=f"link {self.local}->{self.remote}")]

    async def close(self) -> None:
        self._closed = True
        self._drop_line()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for tr in self.unacked.values():
            tr.release()
            if tr.done is not None and not tr.done.done():
                tr.done.cancel()

    def set_kernel_rate(self, rate_Bps: float) -> None:
        """The kernel shapes this link to rate_Bps (tc backend, delay-only pacer): not paced here,
        but segments and the queues below the round-robin are sized from it (see module doc). An
        outage (0) keeps the last rate, as the application shaper does."""
        if rate_Bps > 0:
            self.kernel_rate_Bps = rate_Bps
        if self.conn is not None:
            self._bound_kernel_queue(self.conn)

    def attach(self, conn: FrameProtocol) -> None:
        """A (re)connected socket: everything not yet acknowledged goes again, from its start."""
        self.conn = conn
        self._bound_kernel_queue(conn)
        self._drop_line()
        self._flows.clear()
        self._order.clear()
        self._deficit.clear()
        self._turn = None
        for tr in self.unacked.values():
            if tr.sent:
                self.meter.resent += 1
            tr.sent = 0
            self._queue(tr)
        self._attached.set()
        self._wake.set()

    def detach(self, conn: FrameProtocol) -> None:
        if self.conn is conn:
            self.conn = None
            self._attached.clear()
            self._drop_line()

    def stuck_s(self, now: float) -> float:
        """How long chunks have waited here without any acknowledgement (0 if none wait): a link
        whose bytes vanish (blackhole) shows it, a slow one keeps getting acks."""
        return now - self._last_progress if self.unacked else 0.0

    def send(self, tr: Transfer) -> None:
        if not self.unacked:
            self._last_progress = time.monotonic()
        self.unacked[tr.key] = tr
        self._queue(tr)
        self._wake.set()

    def more_ready(self) -> None:
        """A relayed transfer received more bytes."""
        self._wake.set()

    def send_control(self, header: dict[str, Any]) -> None:
        self._control.append(header)
        self._wake.set()

    def on_ack(self, key: tuple) -> bool:
        tr = self.unacked.pop(key, None)
        if tr is None:
            return False
        tr.release()
        self._last_progress = time.monotonic()
        self.meter.acks += 1
        if tr.done is not None and not tr.done.done():
            tr.done.set_result(True)
        flow = self._flows.get(tr.flow)
        if flow and tr in flow:  # acked before we finished (a resend after reconnect)
            flow.remove(tr)
        return True

    def cancel(self, drop: Callable[[tuple], bool]) -> int:
        """Forget transfers whose key `drop` names (an aborted attempt): never sent or resent again."""
        gone = [k for k in self.unacked if drop(k)]
        for k in gone:
            tr = self.unacked.pop(k)
            tr.release()
            if tr.done is not None and not tr.done.done():
                tr.done.cancel()
            flow = self._flows.get(tr.flow)
            if flow and tr in flow:
                flow.remove(tr)
        return len(gone)

    # --- internals ---------------------------------------------------------------------------
    def _queue(self, tr: Transfer) -> None:
        q = self._flows.get(tr.flow)
        if q is None:
            q = self._flows[tr.flow] = deque()
            self._order.append(tr.flow)
        q.append(tr)

    def _next_segment(self) -> tuple[Transfer, memoryview] | None:
        """Deficit round-robin over flows: each turn earns one quantum of bytes, so flows share the
        link fairly in bytes even though single-hop segments are larger than relayed ones."""
        for _ in range(len(self._order) + 1):
            if not self._order:
                return None
            flow = self._order[0]
            if self._turn != flow:
                self._turn = flow
                self._deficit[flow] = self._deficit.get(flow, 0) + self._quantum()
            q = self._flows[flow]
            while q and q[0].sent >= q[0].total:
                q.popleft()
            if not q:
                del self._flows[flow]
                self._deficit.pop(flow, None)
                self._order.popleft()
                self._turn = None
                continue
            tr = q[0]
            if tr.ready > tr.sent:
                step = self.segment_bytes if len(tr.header["path"]) > 2 else self._direct_segment()
                size = min(step, tr.ready - tr.sent)
                if size <= self._deficit[flow]:
                    seg = tr.view(tr.sent, size)
                    self._deficit[flow] -= len(seg)
                    return tr, seg
            else:
                self._deficit[flow] = 0  # waiting for a relay's upstream: an idle flow saves no credit
            self._order.rotate(-1)
            self._turn = None
        return None

    def _quantum(self) -> int:
        return max(self.segment_bytes, self._direct_segment())

    def _direct_segment(self) -> int:
        """Single-hop transfers need no cut-through: segments of ~DIRECT_SEGMENT_S of link time
        (64 KiB up to 52 Mbit/s, up to 4 MiB unshaped) save a header, a validation and a syscall
        per 64 KiB where the rate makes them costly, and keep round-robin turns short in time."""
        rate = self._rate_Bps()
        if math.isinf(rate):
            return max(self.segment_bytes, DIRECT_SEGMENT_MAX)
        n = int(rate * DIRECT_SEGMENT_S) // self.segment_bytes * self.segment_bytes
        return min(max(self.segment_bytes, DIRECT_SEGMENT_MAX), max(self.segment_bytes, n))

    async def _send_loop(self) -> None:
        while not self._closed:
            if self.conn is None:
                self._set_idle(True)
                await self._attached.wait()
                continue
            conn = self.conn
            try:
                if self.pacer is not None and getattr(self.pacer, "held", False):
                    # outage or blackhole: nothing crosses (acks neither) until it ends; idle, so
                    # the fidelity guard books no backlog for the held time
                    self._set_idle(True)
                    await self.pacer.wait_open()  # type: ignore[attr-defined]
                    continue
                while self._control:
                    self._emit_control(conn, encode(self._control.popleft()))
                nxt = self._next_segment()
                if nxt is None:
                    self._set_idle(True)
                    self._wake.clear()
                    if not self._control:
                        await self._wake.wait()
                    continue
                self._set_idle(False)
                tr, seg = nxt
                if tr.sent == 0:
                    tr.t_send = self.clock()
                header = dict(tr.header)
                header.update(off=tr.sent, nbytes=len(seg), t_send=tr.t_send)
                prefix = encode(header)
                if self.pacer is None:
                    conn.write_raw(prefix)
                    # moderate pieces: Python 3.11's selector transport copies what a send leaves
                    # over and memmoves its whole buffer after every send, quadratic in multi-MiB
                    for i in range(0, len(seg), WRITE_PIECE):
                        conn.write_raw(seg[i:i + WRITE_PIECE])
                        await conn.drain()
                else:
                    await self._schedule(conn, prefix, seg)
                    if self._line_bytes > self._line_cap():  # bounded even when the rate is not
                        self._line_space.clear()
                        await self._line_space.wait()
                await conn.drain()
                if self.conn is not conn:
                    continue  # the connection dropped mid-segment: attach() requeued everything
                tr.sent += len(seg)
                self.meter.bytes += len(seg)
                self.meter.segments += 1
                if tr.sent == tr.total:
                    self.meter.chunks += 1
            except (ConnectionError, RuntimeError):
                self.detach(conn)

    async def _schedule(self, conn: FrameProtocol, prefix: bytes, seg: memoryview) -> None:
        """Put a segment's pieces on the delay line at the times the pacer releases them."""
        pacer = self.pacer
        assert pacer is not None
        step = pacer.max_write
        pieces: list[bytes | memoryview] = [prefix] + [seg[i:i + step] for i in range(0, len(seg), step)]
        ahead = 0.0
        for piece in pieces:
            offset = pacer.release_in(len(piece))
            now = self._now()
            if offset <= self._early and not self._line:  # due now, nothing ahead of it: write it now
                self._write(conn, now + offset, piece, now)
            else:
                self._append(now + offset, piece, conn, paced=True)
            ahead = offset - pacer.delay_s
        if ahead > LOOKAHEAD_S:  # one wake-up per ~LOOKAHEAD_S/2 of wire time, not one per piece
            await asyncio.sleep(ahead - LOOKAHEAD_S / 2)

    def _emit_control(self, conn: FrameProtocol, data: bytes) -> None:
        """Control frames cost no tokens but keep FIFO order with the data pieces already scheduled."""
        if self.pacer is None or (not self._line and self.pacer.delay_s <= 0):
            conn.write_raw(data)
        else:
            self._append(self._now() + self.pacer.delay_s, data, conn, paced=False)

    def _append(self, due: float, data: bytes | memoryview, conn: FrameProtocol, *, paced: bool) -> None:
        due = max(self._last_due, due)  # FIFO even with jitter
        self._last_due = due
        self._line.append((due, data, conn, paced))
        self._line_bytes += len(data)
        if self._flush_handle is None:
            assert self._loop is not None
            self._flush_handle = self._loop.call_at(due - self._early, self._flush)

    def _flush(self) -> None:
        """Write every piece that is due; a late callback catches up instead of idling the wire."""
        self._flush_handle = None
        assert self._loop is not None
        now = self._loop.time()
        conn = self.conn
        pacer = self.pacer
        line = self._line
        early = self._early
        parts: list[bytes | memoryview] = []
        while line and line[0][0] <= now + early:
            due, data, owner, paced = line.popleft()
            self._line_bytes -= len(data)
            if owner is not conn or conn is None:  # never bytes of a dead socket on a new one
                continue
            parts.append(data)
            if paced and pacer is not None:
                self._book(due, len(data), now)
        if parts:
            assert conn is not None
            conn.write_many(parts)  # everything due in one writev, not one send per piece
        if self._line_bytes <= self._line_cap():
            self._line_space.set()
        if line:
            self._flush_handle = self._loop.call_at(line[0][0] - early, self._flush)
        else:
            self._maybe_wire_idle()

    def _write(self, conn: FrameProtocol, due: float, data: bytes | memoryview, now: float) -> None:
        conn.write_raw(data)
        self._book(due, len(data), now)

    def _book(self, due: float, nbytes: int, now: float) -> None:
        assert self.pacer is not None
        if self._wire_since is None:
            self._wire_since = due
        self.pacer.wrote(nbytes)
        self._last_piece = nbytes
        self._last_write = max(now, due)  # only lateness counts; acks do not extend the backlog

    def _line_cap(self) -> float:
        if self.pacer is None:
            return LINE_SLACK
        if self._kernel_shaped():  # the line holds the bytes in flight over the delay, and a little more
            assert self.kernel_rate_Bps is not None
            return self.kernel_rate_Bps * (self.pacer.delay_s + self.pacer.jitter_s) + self._kernel_ahead()
        if math.isinf(self.pacer.rate_Bps):
            return LINE_SLACK
        return self.pacer.rate_Bps * (self.pacer.delay_s + self.pacer.jitter_s + LOOKAHEAD_S) + LINE_SLACK

    def _rate_Bps(self) -> float:
        """The link's rate: the pacer's, or on a kernel-shaped link the kernel's; inf if unshaped."""
        if self.pacer is None:
            return math.inf
        if self._kernel_shaped():
            assert self.kernel_rate_Bps is not None
            return self.kernel_rate_Bps
        return self.pacer.rate_Bps

    def _kernel_shaped(self) -> bool:
        return self.kernel_rate_Bps is not None and self.pacer is not None and math.isinf(self.pacer.rate_Bps)

    def _kernel_ahead(self) -> int:
        """Bytes each queue below the round-robin may hold on a kernel-shaped link: LOOKAHEAD_S / 2."""
        assert self.kernel_rate_Bps is not None
        return max(KERNEL_AHEAD_MIN, int(self.kernel_rate_Bps * LOOKAHEAD_S / 2))

    def _bound_kernel_queue(self, conn: FrameProtocol) -> None:
        """Kernel-shaped link: the transport buffers at most _kernel_ahead() before the send loop
        waits (drain), and the socket keeps at most that much unsent (TCP_NOTSENT_LOWAT), instead of
        the default megabytes (SO_SNDBUF) that would make round-robin decisions far ahead of the wire."""
        if not self._kernel_shaped() or conn.transport is None:
            return
        ahead = self._kernel_ahead()
        conn.transport.set_write_buffer_limits(high=ahead, low=ahead // 2)
        sock = conn.transport.get_extra_info("socket")
        if sock is not None and hasattr(socket, "TCP_NOTSENT_LOWAT"):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, ahead)

    @property
    def _early(self) -> float:
        return self.pacer.early_s if self.pacer is not None else 0.0

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def _set_idle(self, idle: bool) -> None:
        if idle != self._idle:
            self._idle = idle
            self.meter.busy(not idle)
        if idle:
            self._maybe_wire_idle()

    def _maybe_wire_idle(self) -> None:
        if self._idle and not self._line and self._wire_since is not None and self.pacer is not None:
            self.pacer.wire_busy(self._wire_since, self._last_write, self._last_piece)
            self._wire_since = None

    def _drop_line(self) -> None:
        self._line.clear()
        self._line_bytes = 0
        self._line_space.set()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._maybe_wire_idle()
