"""A control-plane connection (agent <-> scheduler): validated headers in, headers out, unshaped."""

from __future__ import annotations

import asyncio
from typing import Any

from .codec import FrameProtocol
from .messages import ProtocolError


class ControlConn:
    def __init__(self, proto: FrameProtocol) -> None:
        self.proto = proto
        self.inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.errors: list[ProtocolError] = []
        proto.handler = self

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float = 10.0) -> ControlConn:
        loop = asyncio.get_running_loop()
        _, proto = await asyncio.wait_for(
            loop.create_connection(lambda: FrameProtocol(peer=f"{host}:{port}"), host, port), timeout)
        return cls(proto)

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

    def on_closed(self, error: Exception | None) -> None:
        self.inbox.put_nowait(None)
