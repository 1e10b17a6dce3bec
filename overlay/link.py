"""Everything one node sends to one neighbour over one TCP connection.

Transfers (chunks, own or relayed) are cut into segments of at most `segment_bytes`; flows that
share the link are served round-robin, one segment per turn. A transfer stays in `unacked` until
the neighbour acknowledges the whole chunk, and is sent again from its start after a reconnect
(the receiver drops the segments it already has). When a pacer (the emulated WAN) is attached,
every write passes it in pieces no larger than its burst, and is handed to a delay line that
delivers it after the link's one-way delay without holding up the next piece.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .codec import FrameProtocol, encode

SEGMENT_BYTES = 64 * 1024
DELAY_LINE_SLACK = 1 << 20  # bytes the delay line may hold beyond one bandwidth-delay product


class Pacer(Protocol):
    """What the emulated WAN offers a sender (see emulation.link.LinkShaper)."""

    max_write: int
    delay_s: float

    async def pace(self, nbytes: int) -> float: ...

    def busy(self, on: bool) -> None: ...


@dataclass(eq=False)
class Transfer:
    """One chunk crossing one hop. `ready` grows while a relay is still receiving it (cut-through)."""

    key: tuple
    header: dict[str, Any]  # CHUNK header without off/nbytes/t_send
    payload: memoryview
    ready: int
    flow: Hashable
    sent: int = 0
    t_send: float = 0.0
    done: asyncio.Future | None = None  # resolved on the hop ack

    @property
    def total(self) -> int:
        return len(self.payload)


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
                 segment_bytes: int = SEGMENT_BYTES) -> None:
        self.local = local
        self.remote = remote
        self.pacer = pacer
        self.segment_bytes = segment_bytes
        self.meter = LinkMeter()
        self.conn: FrameProtocol | None = None
        self.unacked: dict[tuple, Transfer] = {}
        self._flows: dict[Hashable, deque[Transfer]] = {}
        self._order: deque[Hashable] = deque()
        self._control: deque[dict[str, Any]] = deque()
        self._wake = asyncio.Event()
        self._attached = asyncio.Event()
        self._line: deque[tuple[float, bytes | memoryview, FrameProtocol]] = deque()
        self._line_bytes = 0
        self._line_wake = asyncio.Event()
        self._line_space = asyncio.Event()
        self._line_space.set()
        self._last_due = 0.0
        self._tasks: list[asyncio.Task] = []
        self._closed = False

    # --- public -----------------------------------------------------------------------------
    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._send_loop(), name=f"link {self.local}->{self.remote}")]
        if self.pacer is not None and self.pacer.delay_s > 0:
            self._tasks.append(asyncio.create_task(self._line_loop(), name=f"delay {self.local}->{self.remote}"))

    async def close(self) -> None:
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for tr in self.unacked.values():
            if tr.done is not None and not tr.done.done():
                tr.done.cancel()

    def attach(self, conn: FrameProtocol) -> None:
        """A (re)connected socket: everything not yet acknowledged goes again, from its start."""
        self.conn = conn
        self._drop_line()
        self._flows.clear()
        self._order.clear()
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

    def send(self, tr: Transfer) -> None:
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
        self.meter.acks += 1
        if tr.done is not None and not tr.done.done():
            tr.done.set_result(True)
        flow = self._flows.get(tr.flow)
        if flow and tr in flow:  # acked before we finished (a resend after reconnect)
            flow.remove(tr)
        return True

    def backlog_bytes(self) -> int:
        return sum(tr.total - tr.sent for tr in self.unacked.values())

    # --- internals ---------------------------------------------------------------------------
    def _queue(self, tr: Transfer) -> None:
        q = self._flows.get(tr.flow)
        if q is None:
            q = self._flows[tr.flow] = deque()
            self._order.append(tr.flow)
        q.append(tr)

    def _next_segment(self) -> tuple[Transfer, memoryview] | None:
        """Round-robin over flows: the next flow with a sendable segment gets one turn."""
        for _ in range(len(self._order)):
            flow = self._order[0]
            self._order.rotate(-1)
            q = self._flows[flow]
            while q and q[0].sent >= q[0].total:
                q.popleft()
            if not q:
                del self._flows[flow]
                self._order.remove(flow)
                continue
            tr = q[0]
            if tr.ready > tr.sent:
                end = min(tr.sent + self.segment_bytes, tr.ready)
                return tr, tr.payload[tr.sent:end]
        return None

    async def _send_loop(self) -> None:
        pacer = self.pacer
        while not self._closed:
            if self.conn is None:
                self._busy(False)
                await self._attached.wait()
                continue
            conn = self.conn
            try:
                while self._control:
                    await self._emit(conn, encode(self._control.popleft()), paced=False)
                nxt = self._next_segment()
                if nxt is None:
                    self._busy(False)
                    self._wake.clear()
                    if not self._control:
                        await self._wake.wait()
                    continue
                self._busy(True)
                tr, seg = nxt
                if tr.sent == 0:
                    tr.t_send = time.time()
                header = dict(tr.header)
                header.update(off=tr.sent, nbytes=len(seg), t_send=tr.t_send)
                prefix = encode(header)
                if pacer is None:
                    conn.write_raw(prefix)
                    conn.write_raw(seg)
                    await conn.drain()
                else:
                    await self._emit(conn, prefix, paced=True)
                    step = pacer.max_write
                    for i in range(0, len(seg), step):
                        await self._emit(conn, seg[i:i + step], paced=True)
                if self.conn is not conn:
                    continue  # the connection dropped mid-segment: attach() requeued everything
                tr.sent += len(seg)
                self.meter.bytes += len(seg)
                self.meter.segments += 1
                if tr.sent == tr.total:
                    self.meter.chunks += 1
            except (ConnectionError, RuntimeError):
                self.detach(conn)

    async def _emit(self, conn: FrameProtocol, data: bytes | memoryview, *, paced: bool) -> None:
        pacer = self.pacer
        if pacer is None:
            conn.write_raw(data)
            await conn.drain()
            return
        offset = await pacer.pace(len(data)) if paced else pacer.delay_s
        if pacer.delay_s <= 0 and offset <= 0:
            conn.write_raw(data)
            await conn.drain()
            return
        if self._line_bytes > self._line_limit():
            self._line_space.clear()
            await self._line_space.wait()
        due = max(self._last_due, time.monotonic() + offset)  # FIFO even with jitter
        self._last_due = due
        self._line.append((due, data, conn))
        self._line_bytes += len(data)
        self._line_wake.set()

    def _line_limit(self) -> int:
        pacer = self.pacer
        assert pacer is not None
        rate = getattr(pacer, "bucket", None)
        bdp = rate.rate * pacer.delay_s if rate is not None and not rate.unlimited else 0
        return int(bdp) + DELAY_LINE_SLACK

    async def _line_loop(self) -> None:
        """Deliver what the pacer released once its delay has passed: pipelined, never blocking pace()."""
        while not self._closed:
            if not self._line:
                self._line_wake.clear()
                await self._line_wake.wait()
                continue
            due = self._line[0][0]
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            conn = self.conn
            # write everything that is due in one go
            now = time.monotonic()
            while self._line and self._line[0][0] <= now:
                _, data, owner = self._line.popleft()
                self._line_bytes -= len(data)
                if owner is conn and conn is not None:  # never bytes of a dead socket on a new one
                    conn.write_raw(data)
            if self._line_bytes <= self._line_limit():
                self._line_space.set()
            if conn is not None:
                try:
                    await conn.drain()
                except ConnectionError:
                    self.detach(conn)

    def _drop_line(self) -> None:
        self._line.clear()
        self._line_bytes = 0
        self._line_space.set()

    def _busy(self, on: bool) -> None:
        self.meter.busy(on)
        if self.pacer is not None:
            self.pacer.busy(on)
