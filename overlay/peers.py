"""One node's place in the overlay: listen, dial, handshake, reconnect, relay, acknowledge.

Every data frame is acknowledged per hop once its whole chunk arrived at that hop; duplicates
(resends after a reconnect, a lost ack) are dropped by key and segment offset, so nothing is
delivered or summed twice. Frames whose path continues beyond this node are relayed by the
source route in their header, segment by segment as they arrive (cut-through), never by a table
of our own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .codec import FrameProtocol
from .link import SEGMENT_BYTES, LinkSender, Pacer, Transfer
from .messages import ProtocolError, ack_for, chunk_key

log = logging.getLogger("wansync.overlay")

RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 2.0


class ChunkSink(Protocol):
    """Where chunks addressed to this node go (the chunk engine)."""

    def chunk_buffer(self, header: dict[str, Any]) -> memoryview | None:
        """Destination of this segment's bytes; raise ProtocolError for a chunk that cannot exist."""

    def chunk_segment(self, header: dict[str, Any], payload: memoryview) -> None:
        """A segment landed (exactly once per key and offset)."""


class ReceiveLimiter(Protocol):
    def delay_for(self, nbytes: int, *, allow_large: bool = False) -> float: ...


@dataclass
class _Rx:
    total: int
    got: int = 0
    offsets: set[int] = field(default_factory=set)
    relay: Transfer | None = None
    next_hop: int | None = None
    src: int | None = None


@dataclass
class InMeter:
    bytes: int = 0
    chunks: int = 0


Sample = Callable[[int, int, int, float], None]  # src, dst, bytes, seconds


class Overlay:
    def __init__(self, node: int, cluster: str, sink: ChunkSink, *, neighbors: list[int],
                 pacers: Mapping[int, Pacer] | None = None, downlink: ReceiveLimiter | None = None,
                 segment_bytes: int = SEGMENT_BYTES, on_sample: Sample | None = None,
                 host: str = "127.0.0.1", clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.cluster = cluster
        self.sink = sink
        self.neighbors = set(neighbors)
        self.host = host
        self.downlink = downlink
        self.on_sample = on_sample
        self.clock = clock
        self.senders = {n: LinkSender(node, n, pacer=(pacers or {}).get(n), segment_bytes=segment_bytes, clock=clock)
                        for n in sorted(self.neighbors)}
        self.meters_in = {n: InMeter() for n in self.neighbors}
        self.port = 0
        self.errors: list[ProtocolError] = []
        # None: relays follow the source route (the protocol). Set: relays ask their own auxiliary
        # table for the rest of the route, which can loop while tables update (Fig. 10; tests only);
        # a looping chunk then fails validation (its path visits a node twice) and is dropped
        self.relay_by_table: Callable[[dict[str, Any]], tuple[int, ...]] | None = None
        self._rx: dict[tuple, _Rx] = {}
        self._in_transit: dict[tuple[int, ...], int] = {}
        self._done: dict[tuple[int, int], set[tuple]] = {}
        self._server: asyncio.AbstractServer | None = None
        self._conns: dict[int, FrameProtocol] = {}
        self._connected: dict[int, asyncio.Event] = {n: asyncio.Event() for n in self.neighbors}
        self._dialers: list[asyncio.Task] = []
        self._closing = False
        self._discard = memoryview(bytearray(SEGMENT_BYTES))

    # --- lifecycle -------------------------------------------------------------------------------
    async def listen(self, port: int = 0) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: self._protocol(None), self.host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        for s in self.senders.values():
            s.start()
        return self.port

    def connect(self, peers: Mapping[int, tuple[str, int]]) -> None:
        """Dial every neighbour with a higher id (one connection per pair); lower ids dial us."""
        for n in sorted(self.neighbors):
            if n > self.node:
                if n not in peers:
                    raise ValueError(f"no address for neighbour {n}")
                self._dialers.append(asyncio.create_task(self._dial_forever(n, *peers[n]),
                                                         name=f"dial {self.node}->{n}"))

    async def wait_connected(self, timeout: float = 30.0) -> None:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in self._connected.values())), timeout)

    async def close(self) -> None:
        self._closing = True
        for t in self._dialers:
            t.cancel()
        await asyncio.gather(*self._dialers, return_exceptions=True)
        await asyncio.gather(*(s.close() for s in self.senders.values()))
        for c in list(self._conns.values()):
            c.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def drop_connection(self, peer: int) -> None:
        """Cut the socket to a neighbour (fault injection, tests); the dialer reconnects."""
        conn = self._conns.get(peer)
        if conn is not None and conn.transport is not None:
            conn.transport.abort()

    # --- sending ---------------------------------------------------------------------------------
    def send_chunk(self, header: dict[str, Any], payload: memoryview, path: tuple[int, ...]) -> Transfer:
        """Start a chunk transfer from this node along `path` (path[0] is this node)."""
        if path[0] != self.node or len(path) < 2:
            raise ValueError(f"path {path} does not start at node {self.node}")
        if path[1] not in self.senders:
            raise ValueError(f"node {path[1]} is not a neighbour of {self.node}")
        h = dict(header, path=list(path), hop=0, total=len(payload))
        tr = Transfer(key=chunk_key(h), header=h, payload=payload, ready=len(payload), flow=(path[0], path[-1]))
        tr.done = asyncio.get_running_loop().create_future()
        path = tuple(path)
        self._in_transit[path] = self._in_transit.get(path, 0) + 1
        tr.done.add_done_callback(lambda _f: self._acked(path))
        self.senders[path[1]].send(tr)
        return tr

    def in_transit(self, path: tuple[int, ...]) -> int:
        """Chunks this node sent on `path` that its first hop has not acknowledged yet."""
        return self._in_transit.get(path, 0)

    def _acked(self, path: tuple[int, ...]) -> None:
        self._in_transit[path] -= 1

    def forget_before(self, job: int, rnd: int) -> None:
        """Duplicate detection only needs keys of rounds still in flight (agents run one round ahead)."""
        for jr in [jr for jr in self._done if jr < (job, rnd)]:
            del self._done[jr]
        for key in [k for k in self._rx if (k[0], k[1]) < (job, rnd)]:
            del self._rx[key]

    # --- receiving -------------------------------------------------------------------------------
    def _protocol(self, peer: int | None) -> FrameProtocol:
        proto = FrameProtocol(peer=peer, on_bytes=None)
        proto.handler = _Handshake(self, proto, expect=peer)
        if self.downlink is not None:
            proto.on_bytes = _receive_pacer(proto, self.downlink)
        return proto

    async def _dial_forever(self, peer: int, host: str, port: int) -> None:
        backoff = RECONNECT_MIN_S
        loop = asyncio.get_running_loop()
        while not self._closing:
            try:
                _, proto = await loop.create_connection(lambda: self._protocol(peer), host, port)
                hs = proto.handler
                assert isinstance(hs, _Handshake)
                proto.write({"t": "HELLO", "node": self.node, "cluster": self.cluster, "role": "agent"})
                await asyncio.wait_for(hs.done, 10.0)
                backoff = RECONNECT_MIN_S
                await proto.closed
            except (OSError, TimeoutError, ProtocolError, ConnectionError) as exc:
                log.debug("node %d: dial %d failed: %s", self.node, peer, exc)
            if self._closing:
                return
            await asyncio.sleep(backoff)
            backoff = min(RECONNECT_MAX_S, backoff * 2)

    def _attach(self, peer: int, proto: FrameProtocol) -> None:
        old = self._conns.get(peer)
        if old is not None and old is not proto:
            old.close()
        self._conns[peer] = proto
        proto.peer = peer
        proto.handler = _PeerConn(self, peer, proto)
        self.senders[peer].attach(proto)
        self._connected[peer].set()

    def _detach(self, peer: int, proto: FrameProtocol) -> None:
        if self._conns.get(peer) is proto:
            del self._conns[peer]
            self._connected[peer].clear()
        # partly received chunks keep their state: the resend from the start drops what we have
        self.senders[peer].detach(proto)

    def _on_chunk_header(self, peer: int, h: dict[str, Any]) -> tuple[str, Any]:
        path, hop = h["path"], h["hop"]
        if path[hop] != peer or path[hop + 1] != self.node:
            raise ProtocolError(f"path {path} at hop {hop} does not lead from {peer} to {self.node}",
                                field="path", peer=peer, msg_type="CHUNK")
        key = chunk_key(h)
        if self.relay_by_table is not None and hop + 2 < len(path) and key not in self._rx:
            path = h["path"] = [*path[:hop + 1], *self.relay_by_table(h)]
        if key in self._done.get((h["job"], h["round"]), ()):
            return "dup", key
        rx = self._rx.get(key)
        if rx is not None and h["off"] in rx.offsets:
            return "dup", key
        if rx is not None and rx.total != h["total"]:
            raise ProtocolError("total changed within one chunk", field="total", peer=peer, msg_type="CHUNK")
        if hop + 2 == len(path):  # this node is the destination
            dest = self.sink.chunk_buffer(h)
            if rx is None:
                rx = self._rx[key] = _Rx(h["total"])
            rx.src = peer
            return "local", (key, rx, dest)
        nxt = path[hop + 2]
        if nxt not in self.senders:
            raise ProtocolError(f"next hop {nxt} is not a neighbour of {self.node}", field="path", peer=peer,
                                msg_type="CHUNK")
        if rx is None:
            rx = self._rx[key] = _Rx(h["total"], next_hop=nxt)
            rh = {k: v for k, v in h.items() if k not in ("off", "nbytes", "t_send", "t")}
            rh.update(t="CHUNK", hop=hop + 1)
            rx.relay = Transfer(key=key, header=rh, payload=memoryview(bytearray(h["total"])), ready=0,
                                flow=(path[0], path[-1]))
            self.senders[nxt].send(rx.relay)
        rx.src = peer
        assert rx.relay is not None
        return "relay", (key, rx, rx.relay.payload[h["off"]:h["off"] + h["nbytes"]])

    def _on_chunk(self, peer: int, h: dict[str, Any], payload: memoryview | None, disp: tuple[str, Any]) -> None:
        kind, info = disp
        if kind == "dup":
            if h["off"] + h["nbytes"] == h["total"] and info in self._done.get((h["job"], h["round"]), ()):
                self.senders[peer].send_control(ack_for(info))  # our ack may have been lost
            return
        key, rx, _ = info
        rx.offsets.add(h["off"])
        rx.got += h["nbytes"]
        meter = self.meters_in[peer]
        meter.bytes += h["nbytes"]
        if kind == "local":
            assert payload is not None
            self.sink.chunk_segment(h, payload)
        else:
            tr = rx.relay
            if h["off"] == tr.ready:
                tr.ready += h["nbytes"]
            self.senders[rx.next_hop].more_ready()
        if rx.got == rx.total:
            meter.chunks += 1
            del self._rx[key]
            self._done.setdefault((h["job"], h["round"]), set()).add(key)
            self.senders[peer].send_control(ack_for(key))
            if self.on_sample is not None:
                self.on_sample(peer, self.node, rx.total, self.clock() - h["t_send"])


def _receive_pacer(proto: FrameProtocol, limiter: ReceiveLimiter) -> Callable[[int], None]:
    """Downlink cap: stop reading while the node's receive bucket is in debt (TCP pushes back)."""
    loop = asyncio.get_running_loop()

    def on_bytes(n: int) -> None:
        wait = limiter.delay_for(n, allow_large=True)
        if wait > 0 and proto.transport is not None and not proto.transport.is_closing():
            proto.transport.pause_reading()
            loop.call_later(wait, _resume, proto)

    return on_bytes


def _resume(proto: FrameProtocol) -> None:
    if proto.transport is not None and not proto.transport.is_closing():
        proto.transport.resume_reading()


class _Handshake:
    """Until HELLO is exchanged the connection carries nothing else."""

    def __init__(self, overlay: Overlay, proto: FrameProtocol, expect: int | None) -> None:
        self.overlay = overlay
        self.proto = proto
        self.expect = expect
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()

    def on_header(self, header: dict[str, Any]) -> memoryview | None:
        raise ProtocolError("payload before the handshake", peer=self.proto.peer)

    def on_frame(self, header: dict[str, Any], payload: memoryview | None) -> None:
        ov = self.overlay
        if header["t"] != "HELLO":
            self._refuse(f"expected HELLO, got {header['t']}")
            return
        node, cluster = header["node"], header["cluster"]
        if cluster != ov.cluster:
            self._refuse(f"cluster {cluster!r} is not {ov.cluster!r}")
            return
        if node not in ov.neighbors or (self.expect is not None and node != self.expect):
            self._refuse(f"node {node} is not a neighbour of node {ov.node}")
            return
        if self.expect is None:  # we accepted: answer, then both sides are ready
            self.proto.write({"t": "HELLO", "node": ov.node, "cluster": ov.cluster, "role": "agent"})
        ov._attach(node, self.proto)
        if not self.done.done():
            self.done.set_result(node)

    def _refuse(self, why: str) -> None:
        log.warning("node %d refused a connection: %s", self.overlay.node, why)
        self.overlay.errors.append(ProtocolError(why, peer=self.proto.peer))
        if not self.done.done():
            self.done.set_exception(ProtocolError(why, peer=self.proto.peer))
        self.proto.close()

    def on_invalid(self, error: ProtocolError) -> None:
        self._refuse(str(error))

    def on_closed(self, error: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"closed during handshake: {error}"))


class _PeerConn:
    """Frames from one authenticated neighbour."""

    def __init__(self, overlay: Overlay, peer: int, proto: FrameProtocol) -> None:
        self.overlay = overlay
        self.peer = peer
        self.proto = proto
        self._disp: tuple[str, Any] | None = None

    def on_header(self, header: dict[str, Any]) -> memoryview | None:
        if header["t"] != "CHUNK":
            raise ProtocolError("payload on a non-data message", peer=self.peer)
        disp = self._disp = self.overlay._on_chunk_header(self.peer, header)
        if disp[0] == "dup":
            n = header["nbytes"]
            return self.overlay._discard[:n] if n <= len(self.overlay._discard) else None
        return disp[1][2]

    def on_frame(self, header: dict[str, Any], payload: memoryview | None) -> None:
        t = header["t"]
        ov = self.overlay
        if t == "CHUNK":
            disp, self._disp = self._disp, None
            assert disp is not None
            ov._on_chunk(self.peer, header, payload, disp)
        elif t == "ACK":
            ov.senders[self.peer].on_ack(chunk_key(header))
        else:
            raise ProtocolError(f"{t} is not a data-plane message", field="t", peer=self.peer, msg_type=t)

    def on_invalid(self, error: ProtocolError) -> None:
        log.warning("node %d: %s", self.overlay.node, error)
        self.overlay.errors.append(error)

    def on_closed(self, error: Exception | None) -> None:
        self.overlay._detach(self.peer, self.proto)
