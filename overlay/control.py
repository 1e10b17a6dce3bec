"""A control-plane connection (agent <-> scheduler): validated headers in, headers out, unshaped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from ssl import SSLContext
from typing import Any

from .auth import HANDSHAKE_TIMEOUT_S, Handshake, run_handshake
from .burstlog import BurstLog
from .codec import CONTROL_MAX_HEADER, FrameProtocol
from .messages import ProtocolError

log = logging.getLogger("wansync.control")
# Messages read but not yet handled: beyond this the socket is not read (TCP pushes back on the
# peer) until the handler catches up, so a flood costs a bounded queue, not memory without end.
INBOX_MAX = 256


def control_protocol(peer: object) -> FrameProtocol:
    """Control frames never carry payload (any payload is a framing error) but may carry a plan
    once the peer is authenticated; before that only the small handshake messages."""
    return FrameProtocol(peer=peer, max_payload=0, max_header=CONTROL_MAX_HEADER, preauth=True)


class Refuse(asyncio.Protocol):
    """A connection refused the moment it is accepted (too many half-open ones): costs no buffer."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]


class ControlConn:
    def __init__(self, proto: FrameProtocol, burst: BurstLog | None = None) -> None:
        """burst: where invalid messages are logged, one line per burst (the owner's, e.g. a scheduler's)."""
        self.proto = proto
        self.burst = burst or BurstLog(log)
        self.inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.errors: list[ProtocolError] = []
        self.authenticated = False  # until then one invalid message closes the connection
        self._paused = False
        # what the owner handles in the frame's own callback rather than a loop turn later, asked only
        # while nothing waits in the inbox (order kept): the header -> True if it was handled
        self.immediate: Callable[[dict[str, Any]], bool] | None = None
        proto.handler = self

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float = 10.0,
                      ssl: SSLContext | None = None) -> ControlConn:
        loop = asyncio.get_running_loop()
        _, proto = await asyncio.wait_for(
            loop.create_connection(lambda: control_protocol(f"{host}:{port}"), host, port, ssl=ssl), timeout)
        return cls(proto)

    async def handshake(self, hs: Handshake, timeout: float = HANDSHAKE_TIMEOUT_S) -> int:
        """Authenticate the peer (overlay.auth); its node id. Raises AuthError (or TimeoutError)."""
        try:
            peer = await run_handshake(hs, self.send, self.recv, timeout)
        except ProtocolError as exc:
            if self.errors and exc.reason == hs.closed_reason():  # we hung up: say why
                exc = type(exc)(f"{self.errors[-1].reason} (before authentication)", peer=self.proto.peer)
            self.close()
            raise exc from None
        except BaseException:
            self.close()
            raise
        self.authenticated = True
        self.proto.authenticated()
        return peer

    def send(self, header: dict[str, Any]) -> None:
        if self.proto.transport is None or self.proto.transport.is_closing():
            raise ConnectionError(f"control connection to {self.proto.peer!r} is closed")
        self.proto.write(header)

    async def recv(self) -> dict[str, Any] | None:
        """The next message, or None once the connection closed."""
        msg = await self.inbox.get()
        if self._paused and self.inbox.qsize() <= INBOX_MAX // 2:
            self._paused = False
            self.proto.release_reading("inbox")
        return msg

    def refuse(self, error: ProtocolError) -> None:
        """The handler found a message invalid (a rule beyond its schema): counted, logged, and at the
        limit the connection closes, like a message that failed validation."""
        self.proto.note_invalid(error)

    def close(self) -> None:
        self.proto.close()

    # FrameHandler
    def on_header(self, header: dict[str, Any]) -> memoryview | None:
        raise ProtocolError("control messages carry no payload", peer=self.proto.peer)

    def on_frame(self, header: dict[str, Any], payload: memoryview | None) -> None:
        if self.immediate is not None and self.inbox.empty() and self.immediate(header):
            return
        self.inbox.put_nowait(header)
        if not self._paused and self.inbox.qsize() >= INBOX_MAX and self.proto.transport is not None:
            self._paused = True
            self.proto.hold_reading("inbox")

    def on_invalid(self, error: ProtocolError) -> None:
        self.errors[:] = [*self.errors[-15:], error]
        if not self.authenticated:  # a stranger gets no second chance (the caller logs why)
            self.proto.close()
            return
        self.burst.log(logging.WARNING, error.kind, str(error), peer=self.proto.peer)

    def on_closed(self, error: Exception | None) -> None:
        if isinstance(error, ProtocolError):  # a truncated frame, or the invalid-message limit
            self.errors[:] = [*self.errors[-15:], error]
            if self.authenticated:
                log.warning("control connection to %s closed: %s", self.proto.peer, error.reason)
        self.inbox.put_nowait(None)
