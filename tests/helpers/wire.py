"""Stand-ins on the wire: an in-memory overlay under one chunk engine (it records what the engine sends,
delivers nothing), and raw TCP peers that speak frames by hand — what an attacker (or a test) says."""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import msgpack

from overlay import auth
from overlay.auth import Handshake
from overlay.codec import encode


class RecordingWire:
    """Stands in for the overlay under one engine: records what the engine sends, delivers nothing."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, Any], tuple[int, ...]]] = []
        self.let_go_of: list[object] = []  # arrays the engine gave back (Overlay.let_go)
        self.clock = time.time

    def send_chunk(self, header: dict[str, Any], payload: memoryview, path: tuple[int, ...], *,
                   rate_Bps: float | None = None) -> None:
        self.sent.append((dict(header), tuple(path)))

    def in_transit(self, path: tuple[int, ...]) -> int:
        return 0

    def drop_connection(self, peer: int) -> None:
        pass

    def let_go(self, owner: object) -> int:
        self.let_go_of.append(owner)
        return 0


# --- raw peers: what an attacker (or a test) speaks on the wire ------------------------------------------------
class Raw:
    """One TCP connection speaking frames by hand: no FrameProtocol, no Handshake in the way."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int) -> Raw:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, header: dict) -> None:
        self.writer.write(encode(header))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv(self, timeout: float = 30.0) -> dict | None:
        """The next frame's header (payload skipped), or None once the other end closed."""
        try:
            async with asyncio.timeout(timeout):
                (n,) = struct.unpack("!I", await self.reader.readexactly(4))
                h = msgpack.unpackb(await self.reader.readexactly(n), raw=False, strict_map_key=False)
                if h.get("nbytes"):
                    await self.reader.readexactly(h["nbytes"])
                return h
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    async def closed_by_peer(self, timeout: float = 30.0) -> bool:
        """True once the other end hung up (everything it still sends is read and dropped); False if
        it had not within `timeout` (to show it stays open, prove it still answers instead)."""
        try:
            async with asyncio.timeout(timeout):
                while await self.reader.read(65536):
                    pass
            return True
        except ConnectionError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.writer.close()


async def authenticated(port: int, node: int, cluster: str, secret: bytes, *, expect: int,
                        role: str = "agent", peer_role: str = "agent", epoch: int = 0) -> Raw:
    """A raw connection that passed the real handshake as `node` (so the peer treats it as trusted)."""
    raw = await Raw.connect(port)
    hs = Handshake(cluster, node, role, dialer=True, secret=secret, expect=expect, peer_role=peer_role,
                   hello_extra={"epoch": epoch})
    await auth.run_handshake(hs, raw.send, raw.recv)
    return raw

