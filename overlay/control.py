"""A control-plane connection (agent <-> scheduler): validated headers in, headers out, unshaped."""

from __future__ import annotations

import asyncio
from ssl import SSLContext
from typing import Any

from .auth import HANDSHAKE_TIMEOUT_S, Handshake, run_handshake
from .codec import CONTROL_MAX_HEADER, FrameProtocol
from .messages import ProtocolError


def control_protocol(peer: object) -> FrameProtocol:
    """Control frames never carry payload (any payload is a framing error) but may carry a plan."""
    return FrameProtocol(peer=peer, max_payload=0, max_header=CONTROL_MAX_HEADER)


class ControlConn:
    def __init__(self, proto: FrameProtocol) -> None:
        self.proto = proto
        self.inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.errors: list[ProtocolError] = []
        self.authenticated = False  # until then one invalid message closes the connection
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
        return peer

    def send(self, header: dict[str, Any]) -> None:
        if self.proto.transport is None or self.proto.transport.is_closing():
            raise ConnectionError(f"control connection to {self.proto.peer!r} is closed")
        self.proto.write(header)

    async def recv(self) -> dict[str, Any] | None:
        """The next message, or None once the connection closed."""
        return await self.inbox.get()

    def close(self) -> None:
        self.proto.close()

    # FrameHandler
    def on_header(self, header: dict[str, Any]) -> memoryview | None:
        raise ProtocolError("control messages carry no payload", peer=self.proto.peer)

    def on_frame(self, header: dict[str, Any], payload: memoryview | None) -> None:
        self.inbox.put_nowait(header)

    def on_invalid(self, error: ProtocolError) -> None:
        self.errors.append(error)
        if not self.authenticated:  # a stranger gets no second chance
            self.proto.close()

    def on_closed(self, error: Exception | None) -> None:
        if isinstance(error, ProtocolError):  # a truncated frame
            self.errors.append(error)
        self.inbox.put_nowait(None)
