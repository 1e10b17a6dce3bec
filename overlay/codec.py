"""Frame codec: `u32 header_len | msgpack header | payload`, decoded straight into the receiver's buffers.

The receive side is an `asyncio.BufferedProtocol`: headers are parsed out of a small scratch
buffer, and payload bytes are read by the kernel directly into the memoryview the handler chose
for them (a slice of a numpy array), so a tensor is never copied on its way in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any, Protocol

import msgpack

from .messages import FramingError, ProtocolError, validate

log = logging.getLogger("wansync.codec")

LEN = struct.Struct("!I")
MAX_HEADER = 64 * 1024
# The largest segment a sender writes is overlay.link.DIRECT_SEGMENT_MAX (4 MiB): a frame of twice
# that is not a segment. One frame at a time per connection is all a peer can make us buffer.
MAX_PAYLOAD = 8 << 20
# Frame heads are read into this buffer, with whatever payload bytes follow them in the same read;
# those are then copied into the payload's own buffer. 64 KiB: at most a third of a 200 KB segment
# lands twice (at 256 KiB: all of it), while a run of small frames (acks, 16 KB chunks) still comes
# in a few reads.
SCRATCH = 64 * 1024
# Python >= 3.12's selector transport writes a list of parts with one sendmsg; 3.11 joins them first
VECTORED_WRITES = sys.version_info >= (3, 12)
JOIN_BELOW = 64 * 1024  # write_many on 3.11: parts smaller than this are joined, larger go as they are
SOCKET_BUFFER = 4 << 20
MAX_INVALID = 16  # invalid messages tolerated from one peer before it is disconnected
# Control connections carry a whole plan in TOPO_REPLY's header (~0.5 KiB per node for a ring), and
# never a payload; their scratch buffer grows to a large header only as its bytes arrive.
CONTROL_MAX_HEADER = 8 << 20
# Before the peer proved it holds the cluster secret it may send only the handshake (HELLO, AUTH:
# well under 1 KiB each) and costs at most a few KiB of buffers.
PREAUTH_MAX_HEADER = 1024
PREAUTH_SCRATCH = 2048
# A payload the handler has no buffer for (held or relayed frames) is allocated as its bytes
# arrive: this much first, then doubling, never the announced size at once.
GROW_FROM = 64 * 1024
# uvloop reads a readable socket up to 32 times per wake-up: a peer sending at memory speed held the
# loop for tens of ms, and every other socket and timer waited (a 4-node ring on loopback: one agent
# read its TASK 25-55 ms after the others in half the rounds, its predecessor's bytes first). A
# connection lets the loop go round after this much; 1 MiB is under 1 ms of copying, and a stream at
# 1 GB/s pays a thousand pauses a second for it.
READ_TURN = 1 << 20


class _Discard:
    """on_header's answer for a frame whose payload is not wanted: read past it, then deliver the
    header alone (payload None)."""


DISCARD = _Discard()


def encode(header: dict[str, Any], max_header: int = MAX_HEADER) -> bytes:
    """Length prefix plus msgpack header; the payload (header['nbytes'] bytes) is written after it."""
    body = msgpack.packb(header, use_bin_type=True)
    if len(body) > max_header:
        raise ValueError(f"header of {len(body)} bytes exceeds {max_header}")
    return LEN.pack(len(body)) + body


def decode_header(body: bytes | memoryview, peer: object = None) -> dict[str, Any]:
    try:
        header = msgpack.unpackb(body, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise ProtocolError(f"undecodable header ({type(exc).__name__})", peer=peer) from None
    return validate(header, peer)


class FrameHandler(Protocol):
    def on_header(self, header: dict[str, Any]) -> memoryview | _Discard | None:
        """Where the payload of this frame goes (exactly header['nbytes'] bytes), None for a buffer
        allocated as the bytes arrive, or DISCARD to drop them (on_frame then gets payload None)."""

    def on_frame(self, header: dict[str, Any], payload: memoryview | None) -> None: ...

    def on_invalid(self, error: ProtocolError) -> None: ...

    def on_closed(self, error: Exception | None) -> None: ...


_HEAD, _PAYLOAD, _DISCARD = 0, 1, 2


class FrameProtocol(asyncio.BufferedProtocol):
    """One TCP connection's frames; reading and writing both live here."""

    def __init__(self, handler: FrameHandler | None = None, *, peer: object = None,
                 max_payload: int = MAX_PAYLOAD, max_invalid: int = MAX_INVALID,
                 on_bytes: Callable[[int], None] | None = None, max_header: int = MAX_HEADER,
                 preauth: bool = False) -> None:
        """preauth: until `authenticated()` the peer may send only small headers and no payload, and
        the connection's buffers stay a few KiB (a stranger costs next to nothing)."""
        self.handler = handler
        self.peer = peer
        self._limits = (max_header, max_payload)
        self.max_payload = 0 if preauth else max_payload
        # both ways: larger headers are a FramingError (in) / ValueError (out)
        self.max_header = min(max_header, PREAUTH_MAX_HEADER) if preauth else max_header
        self._scratch = PREAUTH_SCRATCH if preauth else SCRATCH
        self.max_invalid = max_invalid
        self.invalid = 0
        self.on_bytes = on_bytes  # receive-side hook (downlink shaping, meters)
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self._buf = bytearray(self._scratch)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._state = _HEAD
        self._need = 0  # bytes of the frame head being received (grows the scratch as they arrive)
        self._dest: memoryview | None = None
        self._want = 0  # payload bytes of the current frame
        self._growing = False  # _dest is ours, grown as bytes arrive
        self._filled = 0
        self._header: dict[str, Any] | None = None
        self._discard_left = 0
        self._dead = False  # aborted: nothing more from this stream is acted on
        self.close_reason: ProtocolError | None = None  # why we aborted (already reported to the handler)
        self._unreported: ProtocolError | None = None  # why we closed, for on_closed to hear
        self._closed_by_us = False
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.bytes_in = 0
        self.address: tuple[str, int] | None = None  # the peer's (host, port), as the socket says
        self.read_turn = READ_TURN
        self._turn_bytes = 0  # read since this connection last let the loop go round
        self._holds: set[str] = set()  # why reading is paused (the downlink cap, a full inbox, a turn)

    # --- connection lifecycle -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport subclass
        transport.set_write_buffer_limits(high=512 << 10, low=128 << 10)
        addr = transport.get_extra_info("peername")
        self.address = (str(addr[0]), int(addr[1])) if isinstance(addr, tuple) and len(addr) >= 2 else None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # a multi-MiB write should fit the kernel in one send(): Python 3.11's transport copies
            # (and later memmoves) whatever a send leaves over
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)

    def authenticated(self) -> None:
        """The peer proved itself: full frame limits and a full-size scratch buffer from now on."""
        self.max_header, self.max_payload = self._limits
        self._scratch = SCRATCH
        if len(self._buf) < SCRATCH:
            n = self._end - self._start
            grown = bytearray(SCRATCH)
            grown[:n] = self._buf[self._start:self._end]
            self._buf, self._view = grown, memoryview(grown)
            self._start, self._end = 0, n

    def connection_lost(self, exc: Exception | None) -> None:
        self._can_write.set()
        if exc is None and self._unreported is not None:
            exc = self._unreported
        elif exc is None and not (self._dead or self._closed_by_us) and (
                self._state != _HEAD or self._end > self._start):
            exc = FramingError("connection closed in the middle of a frame", peer=self.peer)
        if self.handler is not None:
            self.handler.on_closed(exc)
        if not self.closed.done():
            self.closed.set_result(exc)

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def close(self, abort: bool = False) -> None:
        """Close from our side: the end is ours, so on_closed hears no "closed mid-frame" error."""
        self._closed_by_us = True
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()

    def abort(self, error: Exception) -> None:
        """Stop reading this stream for good and close it; the handler hears why (on_invalid) once,
        and on_closed then gets no second, vaguer reason ("closed in the middle of a frame")."""
        if self._dead:
            return
        self._dead = True
        self.close_reason = error if isinstance(error, ProtocolError) else ProtocolError(str(error), peer=self.peer)
        if self.handler is not None:
            self.handler.on_invalid(self.close_reason)
        if self.transport is not None:
            self.transport.abort()

    # --- writing --------------------------------------------------------------------------
    def write(self, header: dict[str, Any], payload: memoryview | bytes | None = None) -> None:
        assert self.transport is not None
        self.transport.write(encode(header, self.max_header))
        if payload is not None and len(payload):
            self.transport.write(payload)

    def write_raw(self, data: bytes | memoryview) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def write_many(self, parts: list[bytes | memoryview]) -> None:
        """One writev (uvloop, Python >= 3.12), not one send per part. Python 3.11's writelines joins
        the parts (a copy of every byte): there small parts are joined, and a large one is written as
        it is (one send from the tensor's memory, no copy on our side)."""
        assert self.transport is not None
        if VECTORED_WRITES or len(parts) == 1:
            self.transport.writelines(parts)
            return
        small: list[bytes | memoryview] = []
        for part in parts:
            if len(part) < JOIN_BELOW:
                small.append(part)
                continue
            if small:
                self.transport.writelines(small)
                small = []
            self.transport.write(part)
        if small:
            self.transport.writelines(small)

    async def drain(self) -> None:
        if not self._can_write.is_set():
            await self._can_write.wait()
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError(f"connection to {self.peer!r} is closed")

    # --- reading --------------------------------------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        if self._state == _HEAD:
            if self._end == len(self._buf):
                self._compact()
            if self._end == len(self._buf):  # a frame head larger than the scratch is arriving
                self._grow_scratch()
            return self._view[self._end:]
        if self._state == _PAYLOAD:
            assert self._dest is not None
            if self._growing and self._filled == len(self._dest):
                self._grow_dest()
            return self._dest[self._filled:]
        remaining = self._discard_left
        return self._view[: min(remaining, len(self._buf))]

    def buffer_updated(self, nbytes: int) -> None:
        if self._dead:
            return
        self.bytes_in += nbytes
        self._turn_bytes += nbytes
        if self._turn_bytes >= self.read_turn and "turn" not in self._holds:
            self.hold_reading("turn")  # takes effect when this read returns; the rest below goes on
            asyncio.get_running_loop().call_soon(self._next_turn)
        if self.on_bytes is not None:
            self.on_bytes(nbytes)
        try:
            if self._state == _HEAD:
                self._end += nbytes
                self._parse()
            elif self._state == _PAYLOAD:
                self._filled += nbytes
                if self._filled == self._want:
                    self._deliver()
                    self._parse()
            else:
                self._discard_left -= nbytes
                if self._discard_left == 0:
                    self._end_discard()
                    self._parse()
        except FramingError as exc:
            self.abort(exc)
        except Exception as exc:  # a bug in a handler: this connection ends, said plainly; the process goes on
            log.error("connection to %r: handling its frames failed (%s: %s); closing it", self.peer,
                      type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.DEBUG))
            self._dead = True
            self._unreported = ProtocolError(f"closed after an internal error ({type(exc).__name__})",
                                             peer=self.peer)
            if self.transport is not None:
                self.transport.abort()

    def hold_reading(self, why: str) -> None:
        """Stop reading for `why`; reading resumes once every reason held is released."""
        if not self._holds and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._holds.add(why)

    def release_reading(self, why: str) -> None:
        if why not in self._holds:
            return
        self._holds.discard(why)
        if not self._holds and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _next_turn(self) -> None:
        self._turn_bytes = 0
        self.release_reading("turn")

    def _compact(self) -> None:
        n = self._end - self._start
        if self._start:
            self._buf[:n] = self._buf[self._start:self._end]
        self._start, self._end = 0, n

    def _grow_scratch(self) -> None:
        """The scratch is full of one frame head still arriving: double it, up to that head's size
        (which _parse checked against max_header), never to the announced size at once."""
        size = min(max(self._need, len(self._buf) + 1), 2 * len(self._buf))
        if size <= len(self._buf):  # cannot happen: _need is only set for heads larger than the scratch
            raise FramingError("header does not fit", peer=self.peer)
        grown = bytearray(size)
        n = self._end - self._start
        grown[:n] = self._buf[self._start:self._end]
        self._buf, self._view = grown, memoryview(grown)
        self._start, self._end = 0, n

    def _grow_dest(self) -> None:
        """A payload we allocate ourselves has filled its buffer: double it (up to the frame's size)."""
        assert self._growing and self._dest is not None
        grown = bytearray(min(self._want, 2 * len(self._dest)))
        grown[:self._filled] = self._dest[:self._filled]
        self._dest = memoryview(grown)

    def _parse(self) -> None:
        while self._state == _HEAD and not self._dead:
            avail = self._end - self._start
            if avail < 4:
                break
            (hlen,) = LEN.unpack_from(self._buf, self._start)
            if hlen == 0 or hlen > self.max_header:
                raise FramingError(f"header length {hlen} outside 1..{self.max_header}", peer=self.peer)
            if avail < 4 + hlen:
                self._need = 4 + hlen
                if self._start + self._need > len(self._buf):
                    self._compact()  # the head starts at 0; get_buffer grows the scratch as it arrives
                break
            body = self._view[self._start + 4:self._start + 4 + hlen]
            self._start += 4 + hlen
            try:
                header = decode_header(body, self.peer)
            except ProtocolError as exc:
                nbytes = _raw_nbytes(body)
                if nbytes > self.max_payload:
                    raise FramingError(f"payload of {nbytes} bytes exceeds {self.max_payload}",
                                       peer=self.peer) from None
                self._invalid(exc)
                self._begin_discard(nbytes)
                continue
            nbytes = header.get("nbytes", 0)
            if nbytes > self.max_payload:
                raise FramingError(f"payload of {nbytes} bytes exceeds {self.max_payload}", peer=self.peer)
            if nbytes == 0:
                self._dispatch(header, None)
                continue
            try:
                dest = self.handler.on_header(header) if self.handler is not None else None
            except ProtocolError as exc:
                exc.peer = exc.peer if exc.peer is not None else self.peer
                self._invalid(exc)
                self._begin_discard(nbytes)
                continue
            if dest is DISCARD:
                self._begin_discard(nbytes, header)
                continue
            take = min(nbytes, self._end - self._start)
            self._growing = dest is None
            if dest is None:  # ours: what already arrived, or GROW_FROM, then doubling as bytes come
                dest = memoryview(bytearray(min(nbytes, max(take, GROW_FROM))))
            elif not isinstance(dest, memoryview) or len(dest) != nbytes:
                raise FramingError(f"handler gave {len(dest)} bytes for a {nbytes}-byte payload",  # type: ignore[arg-type]
                                   peer=self.peer)
            self._header, self._dest, self._want = header, dest, nbytes
            dest[:take] = self._view[self._start:self._start + take]
            self._start += take
            self._filled = take
            if take == nbytes:
                self._deliver()
            else:
                self._state = _PAYLOAD
        if self._start == self._end:
            self._start = self._end = 0
            if len(self._buf) > self._scratch:  # a large header came and went: give its memory back
                self._buf = bytearray(self._scratch)
                self._view = memoryview(self._buf)

    def let_go(self, owner: object) -> bool:
        """The payload being read now lands in `owner`'s memory (an array a handler gave as its
        destination) and that owner gave the memory to someone else (an aborted task's result, which is a
        training script's region): the rest of the payload goes to a buffer of our own, and the frame
        is still delivered whole (its handler drops it, its task being gone). True if it was."""
        if self._state != _PAYLOAD or self._growing or self._dest is None or self._dest.obj is not owner:
            return False
        self._dest = memoryview(bytearray(len(self._dest)))  # the size was accepted with the header
        return True

    def _begin_discard(self, nbytes: int, header: dict[str, Any] | None = None) -> None:
        """Read past `nbytes` of payload; then deliver `header` alone (None: an invalid frame)."""
        take = min(nbytes, self._end - self._start)
        self._start += take
        self._header = header
        if nbytes > take:
            self._discard_left = nbytes - take
            self._state = _DISCARD
        else:
            self._end_discard()

    def _end_discard(self) -> None:
        header, self._header, self._state = self._header, None, _HEAD
        if header is not None:
            self._dispatch(header, None)

    def _deliver(self) -> None:
        header, dest = self._header, self._dest
        self._header, self._dest, self._filled, self._state = None, None, 0, _HEAD
        self._growing = False
        assert header is not None and dest is not None
        self._dispatch(header, dest if len(dest) == self._want else dest[:self._want])

    def _dispatch(self, header: dict[str, Any], payload: memoryview | None) -> None:
        if self.handler is None or self._dead:
            return
        try:
            self.handler.on_frame(header, payload)
        except ProtocolError as exc:
            exc.peer = exc.peer if exc.peer is not None else self.peer
            self._invalid(exc)

    def note_invalid(self, exc: ProtocolError) -> None:
        """A well-framed message the handler found invalid after the fact: counted like any other."""
        self._invalid(exc)

    def _invalid(self, exc: ProtocolError) -> None:
        if self._dead:
            return
        self.invalid += 1
        if self.handler is not None:
            self.handler.on_invalid(exc)
        if self.invalid >= self.max_invalid:  # on_closed hears why (each message was reported already)
            self._dead = True
            self._unreported = ProtocolError(f"{self.invalid} invalid messages (the limit): disconnected",
                                             peer=exc.peer if exc.peer is not None else self.peer)
            if self.transport is not None:
                self.transport.abort()


def _raw_nbytes(body: bytes | memoryview) -> int:
    """Best effort: how much payload an invalid header announced, so framing can skip past it."""
    try:
        header = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception:
        return 0
    n = header.get("nbytes", 0) if isinstance(header, dict) else 0
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
