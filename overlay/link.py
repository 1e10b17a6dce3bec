"""Everything one node sends to one neighbour over one TCP connection.

Transfers (chunks, own or relayed) are cut into segments: relayed ones into at most
`segment_bytes` (cut-through at every relay), single-hop ones into about 25 ms of link time
(fewer headers where the rate is high). A `LinkSender` composes two parts:
- the class scheduler (`overlay.classes`): traffic classes by priority, deadline and weighted share
  (one default class unless a plan asks for more), each a set of per-flow queues served by deficit
  round-robin (`overlay.drr`), so flows share the link fairly in bytes; it decides which segment
  goes next, and paces a class to a scheduler-assigned rate where one is set;
- the delay line (`overlay.delayline`), when a pacer (the emulated WAN) is attached: pieces released
  by the pacer, written by one timer on schedule, with the fidelity books; on a kernel-shaped link
  (tc backend) it sizes the queues below the round-robin from the kernel's rate instead.
The sender itself keeps what belongs to the connection: a transfer stays in `unacked` until the
neighbour acknowledges the whole chunk, and is sent again from its start after a reconnect (the
receiver drops the segments it already has); acks go out in order with the data, those of one turn
of the event loop in one frame, without waking the send loop; the meters count what went out.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from core.classes import DEFAULT, TrafficClass

from .classes import ClassScheduler
from .codec import FrameProtocol, encode
from .delayline import DelayLine, Pacer
from .messages import ChunkKey, acks_for

SEGMENT_BYTES = 64 * 1024
WRITE_PIECE = 256 * 1024  # largest single write on an unshaped link
# a single-hop segment may take this much link time (no relay waits for it). 25 ms: a CREW link's
# 200 KB chunk at --scale 0.05 goes in one frame (a header, a validation, an ack's worth of Python
# per chunk instead of two), and round-robin turns stay short next to any round
DIRECT_SEGMENT_S = 0.025
DIRECT_SEGMENT_MAX = 4 << 20


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
    cls: Hashable = None  # its traffic class's key on the link (overlay.classes); None: the default
    tclass: TrafficClass = DEFAULT
    rate_Bps: float | None = None  # paced to at most this on its first hop (a scheduler-assigned rate)

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
        self.flows: ClassScheduler[Transfer] = ClassScheduler()
        self.line = DelayLine(pacer) if pacer is not None else None  # the emulated wire, if paced
        self._control: deque[dict[str, Any]] = deque()
        self._acks: list[ChunkKey] = []  # chunks received whole here, to acknowledge (_flush_acks)
        self._mid_frame = False  # unpaced: the send loop is between a frame's pieces (nothing may cut in)
        self._direct = segment_bytes  # _direct_segment() as of the current pick (_next_segment)
        self.ack_frames = 0  # ACK/ACKS frames sent, and the keys they carried
        self.acks_sent = 0
        self._wake = asyncio.Event()
        self._attached = asyncio.Event()
        self._idle = True  # the send loop has nothing to schedule
        self._tasks: list[asyncio.Task] = []
        self._closed = False
        self._last_progress = time.monotonic()  # last ack, or when unacknowledged chunks began to wait

    # --- public -----------------------------------------------------------------------------
    def start(self) -> None:
        if self.line is not None:
            self.line.start()
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

    @property
    def kernel_rate_Bps(self) -> float | None:
        """Rate the kernel shapes this link to (tc backend), if known."""
        return self.line.kernel_rate_Bps if self.line is not None else None

    def set_kernel_rate(self, rate_Bps: float) -> None:
        """The kernel shapes this link to rate_Bps (tc backend, delay-only pacer): not paced here,
        but segments and the queues below the round-robin are sized from it (overlay.delayline). An
        outage (0) keeps the last rate, as the application shaper does."""
        if self.line is not None:
            self.line.set_kernel_rate(rate_Bps)

    def attach(self, conn: FrameProtocol) -> None:
        """A (re)connected socket: everything not yet acknowledged goes again, from its start."""
        self.conn = conn
        if self.line is not None:
            self.line.conn = conn
            self.line.bound_kernel_queue(conn)
        self._drop_line()
        self.flows.clear()
        for tr in self.unacked.values():
            if tr.sent:
                self.meter.resent += 1
            tr.sent = 0
            self.flows.enqueue(tr)
        self._attached.set()
        self._wake.set()

    def detach(self, conn: FrameProtocol) -> None:
        if self.conn is conn:
            self.conn = None
            if self.line is not None:
                self.line.conn = None
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
        self.flows.enqueue(tr)
        self._wake.set()

    def set_class_rate(self, cls: Hashable, rate_Bps: float | None) -> None:
        """A paced class's new rate (overlay.classes); it may send at once if it was held."""
        self.flows.set_rate(cls, rate_Bps)
        self._wake.set()

    def more_ready(self) -> None:
        """A relayed transfer received more bytes."""
        self._wake.set()

    def send_control(self, header: dict[str, Any]) -> None:
        self._control.append(header)
        self._wake.set()

    def send_ack(self, key: ChunkKey) -> None:
        """Acknowledge a chunk received whole. Every ack of this turn of the event loop goes out in one
        frame at the start of the next turn (when the send loop would have run for it), without a wake-up
        of the send loop; where the wire cannot take it then, the send loop sends it first thing."""
        if not self._acks:
            asyncio.get_running_loop().call_soon(self._flush_acks)
        self._acks.append(key)

    def _flush_acks(self) -> None:
        conn = self.conn
        if not self._acks:
            return
        if (conn is None or self._mid_frame or self._closed
                or (self.pacer is not None and getattr(self.pacer, "held", False))):
            self._wake.set()  # the send loop sends them once it can (attach, a frame's end, an outage's end)
            return
        keys, self._acks = self._acks, []
        frames = acks_for(keys)
        self.ack_frames += len(frames)
        self.acks_sent += len(keys)
        data = b"".join(encode(h) for h in frames)
        if self.line is None:
            conn.write_raw(data)
        else:
            self.line.control(conn, data)

    def on_ack(self, key: tuple) -> bool:
        tr = self.unacked.pop(key, None)
        if tr is None:
            return False
        tr.release()
        self._last_progress = time.monotonic()
        self.meter.acks += 1
        if tr.done is not None and not tr.done.done():
            tr.done.set_result(True)
        self.flows.remove(tr)  # acked before we finished (a resend after reconnect)
        return True

    def cancel(self, drop: Callable[[tuple], bool]) -> int:
        """Forget transfers whose key `drop` names (an aborted attempt): never sent or resent again."""
        gone = [k for k in self.unacked if drop(k)]
        for k in gone:
            tr = self.unacked.pop(k)
            tr.release()
            if tr.done is not None and not tr.done.done():
                tr.done.cancel()
            self.flows.remove(tr)
        return len(gone)

    # --- internals ---------------------------------------------------------------------------
    def _next_segment(self) -> tuple[Transfer, memoryview] | None:
        """The flow scheduler's next segment: each turn earns one quantum of bytes, enough for the
        largest segment either kind of transfer sends."""
        self._direct = self._direct_segment()  # for this pick's _step calls: one rate reading, not one per call
        return self.flows.next(max(self.segment_bytes, self._direct), self._step)

    def _step(self, tr: Transfer) -> int:
        """The largest segment of a transfer: relayed ones are cut for cut-through, direct ones by time
        (a paced one by time at its own rate, so its pacing is smooth, not a chunk per turn)."""
        if len(tr.header["path"]) > 2:
            return self.segment_bytes
        seg = self._direct
        if tr.rate_Bps is not None:
            paced = int(tr.rate_Bps * DIRECT_SEGMENT_S) // self.segment_bytes * self.segment_bytes
            seg = min(seg, max(self.segment_bytes, paced))
        return seg

    def _direct_segment(self) -> int:
        """Single-hop transfers need no cut-through: segments of ~DIRECT_SEGMENT_S of link time
        (64 KiB up to 21 Mbit/s, up to 4 MiB unshaped) save a header, a validation and a syscall
        per 64 KiB where the rate makes them costly, and keep round-robin turns short in time."""
        rate = math.inf if self.line is None else self.line.rate_Bps()
        if math.isinf(rate):
            return max(self.segment_bytes, DIRECT_SEGMENT_MAX)
        n = int(rate * DIRECT_SEGMENT_S) // self.segment_bytes * self.segment_bytes
        return min(max(self.segment_bytes, DIRECT_SEGMENT_MAX), max(self.segment_bytes, n))

    async def _send_loop(self) -> None:
        line = self.line
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
                    data = encode(self._control.popleft())
                    if line is None:
                        conn.write_raw(data)
                    else:
                        line.control(conn, data)
                if self._acks:
                    self._flush_acks()
                nxt = self._next_segment()
                if nxt is None:
                    self._set_idle(True)
                    self._wake.clear()
                    if not self._control:
                        await self._wait_wake(self.flows.wake_at)
                    continue
                self._set_idle(False)
                tr, seg = nxt
                if tr.sent == 0:
                    tr.t_send = self.clock()
                prefix = encode({**tr.header, "off": tr.sent, "nbytes": len(seg), "t_send": tr.t_send})
                if line is None:
                    conn.write_raw(prefix)
                    self._mid_frame = True  # acks wait for the frame's last piece
                    try:
                        # moderate pieces: Python 3.11's selector transport copies what a send leaves
                        # over and memmoves its whole buffer after every send, quadratic in multi-MiB
                        for i in range(0, len(seg), WRITE_PIECE):
                            if i:
                                await conn.drain()
                            conn.write_raw(seg[i:i + WRITE_PIECE])
                    finally:
                        self._mid_frame = False
                else:
                    await line.send(conn, prefix, seg)  # paced pieces; returns once the line has room
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

    async def _wait_wake(self, until: float | None) -> None:
        """Until there is more to send, or a paced class has its tokens again (monotonic `until`)."""
        if until is None:
            await self._wake.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), max(0.0, until - time.monotonic()))

    def _set_idle(self, idle: bool) -> None:
        if idle != self._idle:
            self._idle = idle
            self.meter.busy(not idle)
            if self.line is not None:
                self.line.idle = idle
        if idle and self.line is not None:
            self.line.maybe_wire_idle()

    def _drop_line(self) -> None:
        if self.line is not None:
            self.line.drop()
