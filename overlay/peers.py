"""One node's place in the overlay: listen, dial, handshake, reconnect, relay, acknowledge.

Every data frame is acknowledged per hop once its whole chunk arrived at that hop; duplicates
(resends after a reconnect, a lost ack) are dropped by key and segment offset, so nothing is
delivered or summed twice. Frames whose path continues beyond this node are relayed by the
source route in their header, segment by segment as they arrive (cut-through), never by a table
of our own.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import struct
import termios
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from core.classes import TrafficClass

from .auth import HANDSHAKE_TIMEOUT_S, AuthError, Handshake, NonceMemory, TlsFiles
from .budget import MemoryBudget
from .burstlog import BurstLog
from .codec import DISCARD, MAX_HEADER, MAX_INVALID, MAX_PAYLOAD, FrameProtocol, _Discard
from .link import SEGMENT_BYTES, Blocks, LinkSender, Pacer, Transfer
from .messages import ProtocolError, chunk_key
from .probeframes import ProbeFrames

log = logging.getLogger("wansync.overlay")

RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 2.0
# Accepted connections still in their handshake: more are refused at once (a stranger may not pile
# up sockets and buffers); a neighbour's redial gets through once the others time out.
MAX_HALF_OPEN = 64
RELAY_BUDGET = 256 << 20  # a sink without a budget of its own (tests): what relays may hold
EPOCHS_KEPT = 8  # incarnations per peer whose invalid-message counts are remembered
ERRORS_KEPT = 256  # protocol errors kept for inspection (all are counted)


class HoldRefused(Exception):
    """The sink cannot hold this segment now (its memory budget for other tasks is full).

    The overlay discards it without recording or acknowledging it, so the sender keeps the chunk
    and sends it again after the next reconnect; nothing is lost and nothing counts as invalid."""


class ChunkSink(Protocol):
    """Where chunks addressed to this node go (the chunk engine)."""

    def chunk_buffer(self, header: dict[str, Any]) -> memoryview | None:
        """Destination of this segment's bytes; raise ProtocolError for a chunk that cannot exist,
        HoldRefused for one it cannot hold now (resent later)."""

    def chunk_segment(self, header: dict[str, Any], payload: memoryview) -> None:
        """A segment landed (exactly once per key and offset)."""

    def admit_relay(self, header: dict[str, Any], peer: int) -> None:
        """Before relaying a chunk for others: raise HoldRefused (after saying why) if its job, task
        or task is not one this node expects traffic of now."""


class ReceiveLimiter(Protocol):
    def delay_for(self, nbytes: int, *, allow_large: bool = False) -> float: ...

    def resumed(self, waiting: bool) -> None: ...


@dataclass
class _Rx:
    total: int
    got: int = 0  # bytes held: always a prefix [0, got) of the chunk
    relay: Transfer | None = None
    next_hop: int | None = None
    src: int | None = None
    charged: int = 0  # relay bytes reserved in the memory budget for peer `src`


@dataclass
class InMeter:
    bytes: int = 0
    chunks: int = 0


Sample = Callable[..., None]  # src, dst, bytes, seconds (, True: an active probe's chunk)


class Overlay:
    def __init__(self, node: int, cluster: str, sink: ChunkSink, *, neighbors: list[int],
                 pacers: Mapping[int, Pacer] | None = None, downlink: ReceiveLimiter | None = None,
                 segment_bytes: int = SEGMENT_BYTES, on_sample: Sample | None = None,
                 host: str = "127.0.0.1", clock: Callable[[], float] = time.time, secret: bytes | None = None,
                 tls: TlsFiles | None = None, max_payload: int = MAX_PAYLOAD, max_header: int = MAX_HEADER,
                 max_invalid: int = MAX_INVALID, budget: MemoryBudget | None = None) -> None:
        """secret: the cluster secret neighbours must prove they hold (overlay.auth); None = no
        authentication (--insecure). tls: mutual TLS on every data connection. max_*: per-frame
        limits on what a neighbour may send, and how many invalid messages before we hang up.
        budget: memory for chunks relayed for others, shared with what the sink holds for later
        tasks (default: the sink's `budget`, else a budget of our own)."""
        self.node = node
        self.cluster = cluster
        self.secret = secret
        self.tls = tls
        self.limits = {"max_payload": max_payload, "max_header": max_header, "max_invalid": max_invalid}
        self.sink = sink
        self.budget = budget or getattr(sink, "budget", None) or MemoryBudget(RELAY_BUDGET)
        self._relay_refused: set[int] = set()  # peers whose relayed bytes found no room (resent later)
        self._half_open = 0  # accepted connections still in their handshake
        self.burst = BurstLog(log)  # refusals: one line per burst per kind and peer, every burst
        self.nonces = NonceMemory()  # challenges seen lately: a replayed handshake is named as one
        self.neighbors = set(neighbors)
        self.host = host
        self.downlink = downlink
        self.on_sample = on_sample
        self.clock = clock
        self.senders = {n: LinkSender(node, n, pacer=(pacers or {}).get(n), segment_bytes=segment_bytes, clock=clock)
                        for n in sorted(self.neighbors)}
        self.meters_in = {n: InMeter() for n in self.neighbors}
        self.port = 0
        self.errors: deque[ProtocolError] = deque(maxlen=ERRORS_KEPT)  # the latest, for logs and tests
        self.error_count = 0  # every protocol error and refusal since start
        self._rx: dict[tuple, _Rx] = {}
        self._probe_frames = ProbeFrames()  # probes: counted and timed, their bytes read past
        self._in_transit: dict[tuple[int, ...], int] = {}
        self._done: dict[tuple[int, int], set[tuple]] = {}
        self._server: asyncio.AbstractServer | None = None
        self._conns: dict[int, FrameProtocol] = {}
        self._connected: dict[int, asyncio.Event] = {n: asyncio.Event() for n in self.neighbors}
        self._dialers: list[asyncio.Task] = []
        self._dialing: set[int] = set()
        self._addrs: dict[int, tuple[str, int]] = {}
        self.min_epoch: dict[int, int] = {}  # peer -> lowest incarnation accepted (FENCE)
        # peer -> incarnation -> invalid messages: the limit holds across reconnects of an incarnation,
        # and a connection claiming another incarnation in between does not reset it
        self._invalid: dict[int, dict[int, int]] = {}
        self.epoch = time.time_ns()  # this process's incarnation, sent in HELLO
        self._closing = False
        # link-down faults: peers we neither dial nor accept until `suspend(peer, False)`
        self._down: set[int] = set()
        self._up = {n: asyncio.Event() for n in self.neighbors}
        self._discard = memoryview(bytearray(SEGMENT_BYTES))

    # --- lifecycle -------------------------------------------------------------------------------
    async def listen(self, port: int = 0) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: self._protocol(None), self.host, port,
                                                ssl=self.tls.server_context() if self.tls else None)
        self.port = self._server.sockets[0].getsockname()[1]
        for s in self.senders.values():
            s.start()
        return self.port

    def connect(self, peers: Mapping[int, tuple[str, int]]) -> None:
        """Dial every neighbour with a higher id (one connection per pair); lower ids dial us. Called
        again when a peer restarted somewhere else: its dialer picks up the new address."""
        for n in sorted(self.neighbors):
            if n > self.node:
                if n not in peers:
                    if n in self._addrs:
                        continue  # lost for now; keep its last address
                    raise ValueError(f"no address for neighbour {n}")
                moved = n in self._addrs and self._addrs[n] != tuple(peers[n])
                self._addrs[n] = (peers[n][0], int(peers[n][1]))
                if n not in self._dialing:
                    self._dialing.add(n)
                    self._dialers.append(asyncio.create_task(self._dial_forever(n), name=f"dial {self.node}->{n}"))
                elif moved:
                    self.drop_connection(n)

    def fence(self, peer: int, epoch: int) -> None:
        """A lost peer's incarnation `epoch` and older are refused from now on (zombies)."""
        if peer in self.neighbors:
            self.min_epoch[peer] = max(self.min_epoch.get(peer, 0), epoch + 1)
            self.drop_connection(peer)

    def new_incarnation(self) -> int:
        """A fenced node starts over: a newer epoch, and every connection of the old one dropped."""
        self.epoch = time.time_ns()
        for peer in list(self._conns):
            self.drop_connection(peer)
        return self.epoch

    async def wait_connected(self, timeout: float = 30.0, peers: Iterable[int] | None = None) -> None:
        """Until every neighbour (or those in `peers`: the live ones) is connected."""
        want = self.neighbors if not peers else set(peers) & self.neighbors
        await asyncio.wait_for(asyncio.gather(*(self._connected[n].wait() for n in want)), timeout)

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

    def note_error(self, error: ProtocolError) -> None:
        self.errors.append(error)
        self.error_count += 1

    def drop_connection(self, peer: int) -> None:
        """Cut the socket to a neighbour (fault injection, tests, a resend wanted); the dialer reconnects."""
        conn = self._conns.get(peer)
        if conn is not None:
            conn.close(abort=True)

    def suspend(self, peer: int, down: bool) -> None:
        """Link down (fault injection): cut the socket and neither dial nor accept the peer until up.
        Unacknowledged chunks stay with their senders and go again after the reconnect."""
        if peer not in self.neighbors:
            raise ValueError(f"node {peer} is not a neighbour of node {self.node}")
        if down:
            self._down.add(peer)
            self._up[peer].clear()
            self.drop_connection(peer)
        else:
            self._down.discard(peer)
            self._up[peer].set()

    # --- sending ---------------------------------------------------------------------------------
    def send_chunk(self, header: dict[str, Any], payload: memoryview, path: tuple[int, ...], *,
                   rate_Bps: float | None = None) -> Transfer:
        """Start a chunk transfer from this node along `path` (path[0] is this node). A header with a
        traffic class (`cls`) shares every link of the path by it; `rate_Bps` paces this flow to a
        scheduler-assigned rate on its first hop (overlay.classes)."""
        if path[0] != self.node or len(path) < 2:
            raise ValueError(f"path {path} does not start at node {self.node}")
        if path[1] not in self.senders:
            raise ValueError(f"node {path[1]} is not a neighbour of {self.node}")
        h = dict(header, path=list(path), hop=0, total=len(payload))
        tr = Transfer(key=chunk_key(h), header=h, payload=payload, ready=len(payload), flow=(path[0], path[-1]),
                      **_class_of(h, rate_Bps))
        tr.done = asyncio.get_running_loop().create_future()
        path = tuple(path)
        self._in_transit[path] = self._in_transit.get(path, 0) + 1
        tr.on_release = partial(self._acked, path)  # acked or dropped: at once, not a loop callback later
        self.senders[path[1]].send(tr)
        return tr

    def set_flow_rate(self, job: int, task: int, attempt: int, tree: int, dst: int, rate_Bps: float) -> None:
        """A paced flow's new rate (RATES) on every link its chunks may leave by; 0 holds it."""
        for sender in self.senders.values():
            for kind in ("agg", "bcast"):  # the tree's two classes (_class_of)
                sender.set_class_rate((job, task, attempt, tree, kind, dst), rate_Bps)

    def in_transit(self, path: tuple[int, ...]) -> int:
        """Chunks this node sent on `path` that its first hop has not acknowledged yet."""
        return self._in_transit.get(path, 0)

    def _acked(self, path: tuple[int, ...]) -> None:
        self._in_transit[path] -= 1

    def abort(self, job: int, task: int | None = None, attempt: int | None = None) -> int:
        """Drop every transfer of this task's attempts up to `attempt` (or of the whole job), sent
        or relayed through us: they are never sent or resent again."""
        def drop(k: tuple) -> bool:
            return k[0] == job and (task is None or (k[1] == task and (attempt is None or k[2] <= attempt)))
        for key in [k for k in self._rx if drop(k)]:
            del self._rx[key]
        return sum(s.cancel(drop) for s in self.senders.values())

    def abort_to(self, job: int, task: int, dst: int) -> int:
        """Drop every transfer of this task addressed to `dst` (a receiver left it), sent or relayed."""
        def drop(k: tuple) -> bool:
            return k[0] == job and k[1] == task and k[7] == dst
        for key in [k for k in self._rx if drop(k)]:
            del self._rx[key]
        return sum(s.cancel(drop) for s in self.senders.values())

    def let_go(self, owner: object) -> int:
        """No byte read from here on lands in memory `owner` exports (FrameProtocol.let_go): a task whose
        result lives in memory it does not own ended, and a frame of it half read on some connection
        must not finish writing there. How many frames were diverted."""
        return sum(proto.let_go(owner) for proto in list(self._conns.values()))

    def forget_before(self, job: int, task: int) -> None:
        """Duplicate detection only needs keys of tasks still in flight: those of tasks before `task`
        (over everywhere), and their transfers never acknowledged, are of no use to anyone now."""
        def old(k: tuple) -> bool:
            return (k[0], k[1]) < (job, task) and k[5] != "probe"  # probes belong to no task
        for jt in [jt for jt in self._done if jt < (job, task)]:
            del self._done[jt]
        for key in [k for k in self._rx if old(k)]:
            del self._rx[key]
        for s in self.senders.values():
            s.cancel(old)

    # --- receiving -------------------------------------------------------------------------------
    def _protocol(self, peer: int | None) -> asyncio.BaseProtocol:
        if peer is None:  # accepted: a stranger until it proves otherwise
            if self._half_open >= MAX_HALF_OPEN:
                self.burst.log(logging.WARNING, "half-open", f"node {self.node} refused connections: already "
                               f"{MAX_HALF_OPEN} waiting to authenticate")
                return _Refuse()
            self._half_open += 1
        proto = FrameProtocol(peer=peer, on_bytes=None, preauth=True, **self.limits)
        proto.handler = _Handshake(self, proto, expect=peer)
        if self.downlink is not None:
            proto.on_bytes = _receive_pacer(proto, self.downlink)
        return proto

    async def _dial_forever(self, peer: int) -> None:
        backoff = RECONNECT_MIN_S
        loop = asyncio.get_running_loop()
        while not self._closing:
            if peer in self._down:
                await self._up[peer].wait()
                backoff = RECONNECT_MIN_S
            host, port = self._addrs[peer]
            try:
                _, proto = await loop.create_connection(lambda: self._protocol(peer), host, port,
                                                        ssl=self.tls.client_context() if self.tls else None)
                hs = proto.handler
                assert isinstance(hs, _Handshake)
                hs.start()
                await asyncio.wait_for(hs.done, HANDSHAKE_TIMEOUT_S)
                backoff = RECONNECT_MIN_S
                await proto.closed
            except (OSError, TimeoutError, ProtocolError, ConnectionError) as exc:
                log.debug("node %d: dial %d failed: %s", self.node, peer, exc)
            if self._closing:
                return
            await asyncio.sleep(backoff)
            backoff = min(RECONNECT_MAX_S, backoff * 2)

    def _attach(self, peer: int, proto: FrameProtocol, epoch: int = 0) -> None:
        old = self._conns.get(peer)
        if old is not None and old is not proto:
            log.info("node %d: a new connection from node %d replaces the old one", self.node, peer)
            old.close()  # closed by us: its end is not reported as an error
        self._conns[peer] = proto
        proto.peer = peer
        proto.authenticated()
        counts = self._invalid.setdefault(peer, {})
        proto.invalid = counts.setdefault(epoch, 0)  # a reconnect of the same incarnation does not clear it
        while len(counts) > EPOCHS_KEPT:
            del counts[min(counts)]
        proto.handler = _PeerConn(self, peer, proto, epoch)
        self.senders[peer].attach(proto)
        self._connected[peer].set()

    def _detach(self, peer: int, proto: FrameProtocol) -> None:
        if self._conns.get(peer) is proto:
            del self._conns[peer]
            self._connected[peer].clear()
        # partly received chunks keep their state: the resend from the start drops what we have
        self._probe_frames.drop(peer)
        self.senders[peer].detach(proto)

    def _on_chunk_header(self, peer: int, h: dict[str, Any]) -> tuple[str, Any]:
        path, hop = h["path"], h["hop"]
        if path[hop] != peer or path[hop + 1] != self.node:
            raise ProtocolError(f"path {path} at hop {hop} does not lead from {peer} to {self.node}",
                                field="path", peer=peer, msg_type="CHUNK")
        key = chunk_key(h)
        if h["kind"] == "probe":  # measures the link, then dropped: never held, relayed or summed
            return "probe", (key, self._probe_frames.header(peer, h, key), DISCARD, 0)
        if key in self._done.get((h["job"], h["task"]), ()):
            return "dup", key
        rx = self._rx.get(key)
        if rx is not None and rx.total != h["total"]:
            raise ProtocolError("total changed within one chunk", field="total", peer=peer, msg_type="CHUNK")
        # bytes land exactly once and in order: a resend after a reconnect starts again at 0 and may cut
        # segments elsewhere (a relay forwards what is ready, the segment size follows the link rate)
        got = 0 if rx is None else rx.got
        off, n = h["off"], h["nbytes"]
        if off + n <= got and n > 0:
            return "dup", key
        if off > got:  # a gap (its start was refused, never acked): dropped, the whole chunk comes again
            return "dup", key
        skip = got - off  # > 0: the segment overlaps what we hold; only its tail is new
        if hop + 2 == len(path):  # this node is the destination
            try:
                dest = self.sink.chunk_buffer(h) if skip == 0 else None
            except HoldRefused:  # not recorded, so never acked: discarded like a duplicate, resent later
                return "dup", key
            if rx is None:
                rx = self._rx[key] = _Rx(h["total"])
            rx.src = peer
            return "local", (key, rx, dest, skip)
        nxt = path[hop + 2]
        if nxt not in self.senders:
            raise ProtocolError(f"next hop {nxt} is not a neighbour of {self.node}", field="path", peer=peer,
                                msg_type="CHUNK")
        if rx is None:
            admit = getattr(self.sink, "admit_relay", None)
            try:
                if admit is not None:
                    admit(h, peer)
            except HoldRefused:  # a job or task this node expects nothing of: said why, never held
                return "dup", key
        if rx is None:
            # a relayed chunk is admitted whole or not at all: its size is reserved in the budget now
            # (memory itself is allocated as its bytes arrive), so no admitted chunk ever waits for
            # bytes that were refused, which would block its flow's later chunks behind it
            if not self.budget.room(peer, h["total"]):
                self._refuse_relay(peer, h["total"])
                return "dup", key
            self.budget.take(peer, h["total"])
            rx = self._rx[key] = _Rx(h["total"], next_hop=nxt, charged=h["total"])
            rh = {k: v for k, v in h.items() if k not in ("off", "nbytes", "t_send", "t")}
            rh.update(t="CHUNK", hop=hop + 1)
            rx.relay = Transfer(key=key, header=rh, payload=Blocks(), ready=0, flow=(path[0], path[-1]),
                                total=h["total"], on_release=lambda rx=rx: self._relay_released(rx),
                                **_class_of(h, None))
            self.senders[nxt].send(rx.relay)
        rx.src = peer
        return "relay", (key, rx, None, skip)

    def _refuse_relay(self, peer: int, total: int) -> None:
        """Not acknowledged, so the sender keeps the chunk; it is asked for again once there is room."""
        if total > self.budget.peer_limit:  # no room will ever come: no resend asked for, and no
            # mark that would hide this peer's next "budget full" (each has its own line, per burst)
            self.burst.log(logging.ERROR, "relay too big",
                           f"node {self.node}: a {total}-byte chunk from node {peer} can never be relayed here: a "
                           f"peer may hold at most {self.budget.peer_limit} bytes of this node's budget (raise "
                           f"--hold-budget-mb, or use smaller chunks)", peer=peer)
            return
        self.burst.log(logging.WARNING, "relay budget full",
                       f"node {self.node}: memory budget full ({self.budget.used} of {self.budget.limit} bytes, "
                       f"{self.budget.by_peer.get(peer, 0)} for node {peer}): refusing chunks it relays "
                       f"through us until there is room", peer=peer)
        self._relay_refused.add(peer)  # neighbours only: asked to resend once there is room

    def _relay_released(self, rx: _Rx) -> None:
        """The next hop has the whole chunk (or it was cancelled): its bytes leave the budget, and
        peers refused for want of room are asked to send again (a reconnect resends what is unacked)."""
        if rx.charged and rx.src is not None:
            self.budget.give(rx.src, rx.charged)
            rx.charged = 0
        if self._relay_refused and self.budget.used <= self.budget.limit // 2:
            peers, self._relay_refused = self._relay_refused, set()
            for p in peers:
                self.drop_connection(p)

    def _on_chunk(self, peer: int, h: dict[str, Any], payload: memoryview | None, disp: tuple[str, Any]) -> None:
        kind, info = disp
        if kind == "dup":
            if h["off"] + h["nbytes"] == h["total"] and info in self._done.get((h["job"], h["task"]), ()):
                self.senders[peer].send_ack(info)  # our ack may have been lost
            return
        key, rx, _, skip = info
        if kind == "probe":
            nbytes, whole = self._probe_frames.segment(peer, h, key, rx)
            meter = self.meters_in[peer]
            meter.bytes += nbytes
            if whole:  # acknowledged and timed like any chunk (the meter holds its bytes first)
                meter.chunks += 1
                self.senders[peer].send_ack(key)
                if self.on_sample is not None:
                    self.on_sample(peer, self.node, rx.total, self.clock() - h["t_send"], True)
            return
        assert payload is not None
        if self._rx.get(key) is not rx:  # its task was aborted or forgotten while these bytes arrived
            return
        if skip:  # an overlapping resend: pass on only the bytes not yet held
            h = {**h, "off": h["off"] + skip, "nbytes": h["nbytes"] - skip}
            payload = payload[skip:]
        rx.got += h["nbytes"]
        meter = self.meters_in[peer]
        meter.bytes += h["nbytes"]
        if kind == "local":
            if skip:
                dest = self.sink.chunk_buffer(h)
                if dest is not None:
                    dest[:] = payload
                    payload = dest
            self.sink.chunk_segment(h, payload)
        else:
            tr = rx.relay
            assert tr is not None and isinstance(tr.payload, Blocks)
            tr.payload.append(payload)  # the bytes as they arrived (read straight into this buffer)
            tr.ready = rx.got
            self.senders[rx.next_hop].more_ready()
        if rx.got == rx.total:
            meter.chunks += 1
            del self._rx[key]
            self._done.setdefault((h["job"], h["task"]), set()).add(key)
            self.senders[peer].send_ack(key)
            if self.on_sample is not None:
                self.on_sample(peer, self.node, rx.total, self.clock() - h["t_send"])

def _receive_pacer(proto: FrameProtocol, limiter: ReceiveLimiter) -> Callable[[int], None]:
    """Downlink cap: stop reading while the node's receive bucket is in debt (TCP pushes back)."""
    loop = asyncio.get_running_loop()

    def on_bytes(n: int) -> None:
        wait = limiter.delay_for(n, allow_large=True)
        if wait > 0 and proto.transport is not None and not proto.transport.is_closing():
            proto.hold_reading("cap")
            loop.call_later(wait, _resume, proto, limiter)

    return on_bytes


def _resume(proto: FrameProtocol, limiter: ReceiveLimiter) -> None:
    if proto.transport is not None and not proto.transport.is_closing():
        limiter.resumed(_data_waiting(proto.transport))  # the guard's books: did the cap hold data back?
        proto.release_reading("cap")


def _data_waiting(transport: asyncio.BaseTransport) -> bool:
    """Whether the kernel holds received bytes for this connection (FIONREAD); True if it cannot say
    (TLS: its layer may hold decrypted bytes the kernel no longer does)."""
    sock = transport.get_extra_info("socket")
    if sock is None or transport.get_extra_info("ssl_object") is not None:
        return True
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0] > 0
    except OSError:
        return True


def _retrieved(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


class _Refuse(asyncio.Protocol):
    """A connection refused the moment it is accepted (too many half-open ones): costs no buffer."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]


class _Handshake:
    """Until the neighbour is authenticated (overlay.auth: HELLO both ways, then AUTH both ways) the
    connection carries nothing else; one invalid message, a wrong secret or silence ends it."""

    def __init__(self, overlay: Overlay, proto: FrameProtocol, expect: int | None) -> None:
        self.overlay = overlay
        self.proto = proto
        self.expect = expect
        self.auth = Handshake(overlay.cluster, overlay.node, "agent", dialer=expect is not None,
                              secret=overlay.secret, expect=expect, peer_role="agent", check_peer=self._check,
                              hello_extra={"epoch": overlay.epoch}, nonces=overlay.nonces)
        loop = asyncio.get_running_loop()
        self.done: asyncio.Future = loop.create_future()
        self.done.add_done_callback(_retrieved)  # an acceptor's outcome is only logged, never awaited
        self._counted_out = False
        # an accepted connection that never finishes the handshake must not stay open forever
        self._timer = None if expect is not None else loop.call_later(HANDSHAKE_TIMEOUT_S, self._timeout)

    def start(self) -> None:
        """Dialer: the opening HELLO."""
        self.proto.write(self.auth.start())

    def _check(self, node: int, role: str) -> str | None:
        if node not in self.overlay.neighbors:
            return f"node {node} is not a neighbour of node {self.overlay.node}"
        return None

    def on_header(self, header: dict[str, Any]) -> memoryview | None:
        raise ProtocolError("payload before the handshake", peer=self.proto.peer)

    def on_frame(self, header: dict[str, Any], payload: memoryview | None) -> None:
        ov = self.overlay
        if header["t"] == "HELLO" and header["node"] in ov._down:
            # the link is down (fault): no error, the peer just cannot get through
            self._settle(ConnectionError("link down"))
            self.proto.close()
            return
        try:
            replies = self.auth.receive(header)
        except AuthError as exc:
            self._refuse(exc.reason)
            return
        for reply in replies:
            self.proto.write(reply)
        if self.auth.done:
            node = self.auth.peer
            assert node is not None and self.auth.peer_hello is not None
            epoch = self.auth.peer_hello.get("epoch", 0)
            if epoch < ov.min_epoch.get(node, 0):
                self._refuse(f"node {node} runs incarnation {epoch}, which was fenced when it was lost (a zombie)")
                return
            ov._attach(node, self.proto, epoch)
            self._settle(None, node)

    def _settle(self, exc: Exception | None, node: int | None = None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.expect is None and not self._counted_out:  # an accepted one is no longer half-open
            self._counted_out = True
            self.overlay._half_open -= 1
        if not self.done.done():
            if exc is None:
                self.done.set_result(node)
            else:
                self.done.set_exception(exc)

    def _log_refusal(self, why: str) -> None:
        """One line per burst, keyed by whom we dialled or the address that dialled us: never by the
        node id, cluster or reason a stranger claims (a new one per connection would be a new line)."""
        addr = self.proto.address
        peer = self.expect if self.expect is not None else (addr[0] if addr else None)
        where = f" to node {self.expect}" if self.expect is not None else (
            f" from {addr[0]}:{addr[1]}" if addr else "")
        kind = "dial refused" if self.expect is not None else "handshake refused"
        self.overlay.burst.log(logging.WARNING, kind, f"node {self.overlay.node} refused a connection{where}: {why}",
                               peer=peer)

    def _refuse(self, why: str) -> None:
        if self.done.done():
            return
        self._log_refusal(why)
        self.overlay.note_error(AuthError(why, peer=self.proto.peer))
        self._settle(AuthError(why, peer=self.proto.peer))
        self.proto.close()

    def _timeout(self) -> None:
        self._timer = None
        self._refuse(f"no handshake within {HANDSHAKE_TIMEOUT_S:.0f} s")

    def on_invalid(self, error: ProtocolError) -> None:
        self._refuse(error.reason if isinstance(error, ProtocolError) else str(error))

    def on_closed(self, error: Exception | None) -> None:
        if not self.done.done():
            why = self.auth.closed_reason()
            if isinstance(error, ProtocolError):  # e.g. a truncated frame: name it
                why = error.reason
                self.overlay.note_error(error)
            if self.expect is not None or isinstance(error, ProtocolError):
                self._log_refusal(why)  # dialled: the other end refused us (it logged why)
            self._settle(ConnectionError(why))


class _PeerConn:
    """Frames from one authenticated neighbour."""

    def __init__(self, overlay: Overlay, peer: int, proto: FrameProtocol, epoch: int = 0) -> None:
        self.overlay = overlay
        self.peer = peer
        self.proto = proto
        self.epoch = epoch
        self._disp: tuple[str, Any] | None = None

    def on_header(self, header: dict[str, Any]) -> memoryview | _Discard | None:
        if header["t"] != "CHUNK":
            raise ProtocolError("payload on a non-data message", peer=self.peer)
        disp = self._disp = self.overlay._on_chunk_header(self.peer, header)
        if disp[0] == "dup":
            return DISCARD
        return disp[1][2]  # None: allocated as the bytes arrive (relayed or held); DISCARD: a probe

    def on_frame(self, header: dict[str, Any], payload: memoryview | None) -> None:
        t = header["t"]
        ov = self.overlay
        if t == "CHUNK":
            disp, self._disp = self._disp, None
            assert disp is not None
            ov._on_chunk(self.peer, header, payload, disp)
        elif t == "ACK":
            ov.senders[self.peer].on_ack(chunk_key(header))
        elif t == "ACKS":
            on_ack = ov.senders[self.peer].on_ack
            for key in header["keys"]:
                on_ack(tuple(key))
        else:
            raise ProtocolError(f"{t} is not a data-plane message", field="t", peer=self.peer, msg_type=t)

    def on_invalid(self, error: ProtocolError) -> None:
        self.overlay.burst.log(logging.WARNING, error.kind, f"node {self.overlay.node}: {error}", peer=self.peer)
        self.overlay.note_error(error)
        self.overlay._invalid.setdefault(self.peer, {})[self.epoch] = self.proto.invalid

    def on_closed(self, error: Exception | None) -> None:
        if isinstance(error, ProtocolError):  # a truncated frame (resent, never half used), or the limit
            log.warning("node %d: %s", self.overlay.node, error)
            self.overlay.note_error(error)
        self.overlay._detach(self.peer, self.proto)


def _class_of(h: Mapping[str, Any], rate_Bps: float | None) -> dict[str, Any]:
    """A transfer's traffic class on a link, from its header: (job, task, attempt, tree, kind) — a
    tree's aggregation and broadcast are two classes of its weight, so a link both use gives it the
    weight once for each (as tree packing counts it) — and the destination too where it is paced (a
    paced flow is a class of its own); none: the default."""
    v = h.get("cls")
    if v is None:
        return {}
    tree, tclass = TrafficClass.from_wire(v)
    key: tuple = (h["job"], h["task"], h["attempt"], tree, h["kind"])
    if rate_Bps is not None:
        key += (h["path"][-1],)
    return {"cls": key, "tclass": tclass, "rate_Bps": rate_Bps}
