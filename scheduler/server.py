"""The scheduler's control port: accept, authenticate, read each agent's messages, dispatch them.

Strangers are bounded (at most MAX_HALF_OPEN connections in their handshake, refused beyond, one
log line per burst). After the handshake every message is a typed record (overlay.messages) handed
to the handler registered for its type. A handler's ProtocolError counts as an invalid message; any
other exception is a bug, which ends that connection with one clear line instead of leaving it open
and unread. CLOCK is answered here, at once: its delay is the agent's clock error bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from ssl import SSLContext
from typing import Any

from overlay.auth import AuthError, Handshake, NonceMemory
from overlay.burstlog import BurstLog
from overlay.control import ControlConn, Refuse, control_protocol
from overlay.messages import Clock, ProtocolError, Record, decode

from .registry import AgentInfo

log = logging.getLogger("wansync.scheduler")
MAX_HALF_OPEN = 64  # control connections accepted but not yet authenticated; more are refused at once

Handler = Callable[[AgentInfo, Any], None]


def _hostport(addr: tuple[str, int] | None) -> str:
    return "an unknown address" if addr is None else f"{addr[0]}:{addr[1]}"


class ControlServer:
    def __init__(self, cluster: str, secret: bytes | None, *, may_connect: Callable[[int, str], str | None],
                 handlers: dict[type[Record], Handler], on_closed: Callable[[AgentInfo], None],
                 ssl: SSLContext | None = None) -> None:
        self.cluster = cluster
        self.secret = secret
        self.may_connect = may_connect
        self.handlers = handlers
        self.on_closed = on_closed
        self.ssl = ssl
        self.half_open = 0  # accepted connections still in their handshake
        self.burst = BurstLog(log)  # one line per burst of refusals or invalid messages, not one per event
        self.nonces = NonceMemory()  # challenges seen lately: a replayed handshake is named as one
        self.server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self._accept, host, port, ssl=self.ssl)
        return self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accept(self) -> asyncio.BaseProtocol:
        if self.half_open >= MAX_HALF_OPEN:  # strangers may not pile up: each costs a task and buffers
            self.burst.log(logging.WARNING, "half-open", f"scheduler refused control connections: already "
                           f"{MAX_HALF_OPEN} waiting to authenticate")
            return Refuse()
        self.half_open += 1
        proto = control_protocol("agent?")
        conn = ControlConn(proto, self.burst)
        task = asyncio.get_running_loop().create_task(self._serve(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return proto

    async def _serve(self, conn: ControlConn) -> None:
        info: AgentInfo | None = None
        try:
            # HELLO both ways, then HMAC proofs both ways (overlay/auth.py); nothing registers before
            hs = Handshake(self.cluster, -1, "scheduler", dialer=False, secret=self.secret, peer_role="agent",
                           check_peer=self.may_connect, nonces=self.nonces)
            try:
                node = await conn.handshake(hs)
            except (AuthError, TimeoutError, ConnectionError) as exc:
                if hs.peer_hello is not None or conn.errors or isinstance(exc, TimeoutError):
                    addr = conn.proto.address
                    why = exc.reason if isinstance(exc, AuthError) else f"no handshake ({type(exc).__name__})"
                    # keyed by what we know, never by what the stranger said (it may say something new each time)
                    kind = "handshake timeout" if isinstance(exc, TimeoutError) else "handshake refused"
                    self.burst.log(logging.WARNING, kind, f"scheduler refused a control connection from "
                                   f"{_hostport(addr)}: {why}", peer=addr[0] if addr else None)
                return
            finally:
                self.half_open -= 1
            first = hs.peer_hello
            assert first is not None
            conn.proto.peer = f"agent {node}"
            info = AgentInfo(node, conn, last_seen=time.time(), epoch=int(first.get("epoch", 0)))
            await self._read(info)
        except ProtocolError as exc:
            log.warning("%s", exc)
        finally:
            conn.close()
            if info is not None:
                self.on_closed(info)

    async def _read(self, info: AgentInfo) -> None:
        conn = info.conn
        while True:
            header = await conn.recv()
            if header is None:
                return
            msg = decode(header)
            if isinstance(msg, Clock):
                try:
                    conn.send(Clock(t0=msg.t0, t1=time.time()).wire())
                except ConnectionError:  # it hung up (or was cut off) meanwhile: the end of it
                    return
                continue
            info.last_seen = time.time()
            handler = self.handlers.get(type(msg))
            try:
                if handler is None:
                    raise ProtocolError(f"{msg.T} is not a message an agent sends", field="t", msg_type=msg.T)
                handler(info, msg)
            except ProtocolError as exc:  # valid by its schema, not by the rules: counted like one that is not
                exc.peer = exc.peer if exc.peer is not None else conn.proto.peer
                conn.refuse(exc)
            except Exception as exc:  # a bug must not leave a connection open that nobody reads
                log.error("agent %d: handling its %s failed (%s: %s); closing its control connection",
                          info.node, msg.T, type(exc).__name__, exc)
                log.debug("handler failure", exc_info=True)
                return
