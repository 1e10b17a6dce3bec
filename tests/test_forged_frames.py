"""Forged CHUNK frames from an insider, over real authenticated TCP, into a running round.

The attacker holds the cluster secret and speaks for one node (whose real process has the link to the
victim down, so nobody displaces it): it passes the real handshake, then writes frames by hand. Frames
whose contributor bitmaps give them away (a doubled contribution, a stale round or attempt, a sum that
misses a participant) must never be summed: the victim's round either fails with TaskError (and is
aborted), or the frame is refused or dropped and the round completes with the exact sum, which every
test computes itself. A forged frame with a *plausible* bitmap is not detectable this way (issue 12
§6: the threat model of a shared secret); these tests do not claim it is.

Also here: a MAC wrong only in its last byte is refused by a live overlay over TCP.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from helpers.cluster import LocalNet
from helpers.secret import SECRET

from agents.taskpart import TaskAborted, TaskError, TaskPart
from agents.workload import contribution
from core.plan import Plan, make_layout, tree_group
from emulation.topology import uniform
from overlay import auth
from overlay.auth import Handshake
from overlay.codec import encode
from overlay.messages import acked_keys, bitmap, chunk_key, validate
from overlay.peers import Overlay

pytestmark = pytest.mark.loopback

JOB = 1
PARAMS, CHUNK = 20_000, 5_000  # four chunks of 20 KB: one frame each
DEADLINE = 30.0


async def until(cond: Callable[[], bool], timeout: float = DEADLINE, what: str = "condition") -> None:
    """Wait for a condition (not for time), with a generous deadline."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.005)


# --- the attacker's side: one raw TCP connection ----------------------------------------------------------
class Raw:
    """Frames written by hand; everything the other end sends is read in the background and kept."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.seen: list[dict[str, Any]] = []
        self.closed = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    @classmethod
    async def connect(cls, port: int) -> Raw:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, header: dict[str, Any]) -> None:
        self.writer.write(encode(header))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def _read_one(self) -> dict[str, Any] | None:
        try:
            (n,) = struct.unpack("!I", await self.reader.readexactly(4))
            h = msgpack.unpackb(await self.reader.readexactly(n), raw=False, strict_map_key=False)
            if h.get("nbytes"):
                await self.reader.readexactly(h["nbytes"])
            return h
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    async def recv(self) -> dict[str, Any] | None:
        """The next header during the handshake (before background reading starts)."""
        return await asyncio.wait_for(self._read_one(), DEADLINE)

    def start_reading(self) -> None:
        async def loop() -> None:
            while (h := await self._read_one()) is not None:
                self.seen.append(h)
            self.closed = True
        self._task = asyncio.create_task(loop())

    def acked(self, key: tuple) -> bool:
        return any(h.get("t") in ("ACK", "ACKS") and key in acked_keys(h) for h in self.seen)

    async def close(self) -> None:
        self.writer.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def authenticated(port: int, node: int, expect: int, cluster: str = "test") -> Raw:
    """A raw connection that passed the real handshake as `node` (the victim treats it as trusted)."""
    raw = await Raw.connect(port)
    hs = Handshake(cluster, node, "agent", dialer=True, secret=SECRET, expect=expect, peer_role="agent",
                   hello_extra={"epoch": time.time_ns()})
    await auth.run_handshake(hs, raw.send, raw.recv)
    raw.start_reading()
    return raw


def chunk_frame(*, rnd: int, attempt: int, version: int, chunk: int, kind: str, origin: int,
                contributors: list[int], path: list[int], hop: int, data: np.ndarray) -> tuple[bytes, tuple]:
    """A well-formed CHUNK frame (it passes schema validation: only its content lies) and its key."""
    payload = np.ascontiguousarray(data, dtype=np.float32).tobytes()
    h = validate({"t": "CHUNK", "job": JOB, "task": rnd, "attempt": attempt, "version": version,
                  "chunk": chunk, "kind": kind, "origin": origin, "contributors": bitmap(contributors),
                  "t_send": time.time(), "path": path, "hop": hop, "off": 0, "total": len(payload),
                  "nbytes": len(payload)})
    return encode(h) + payload, chunk_key(h)


# Not a data-plane message: the victim records it as a protocol error, after every frame sent before it
# on the same connection was handled (frames are handled in order), whatever it did with them.
SENTINEL = {"t": "HEARTBEAT", "node": 99, "time": 0.0}


async def inject(raw: Raw, victim: Overlay, frames: list[tuple[bytes, tuple]]) -> None:
    """Send frames and wait until the victim dealt with each one: every one acknowledged (taken, held or
    dropped as a duplicate), or the sentinel behind them refused (so they were handled, maybe refused or
    discarded unacknowledged), or the connection cut."""
    before = {id(e) for e in victim.errors}  # a list or a bounded deque: compare by identity
    raw.send_raw(b"".join(f for f, _ in frames) + encode(SENTINEL))
    keys = [k for _, k in frames]

    def handled() -> bool:
        sentinel = any(getattr(e, "msg_type", None) == "HEARTBEAT" and id(e) not in before
                       for e in list(victim.errors))
        return raw.closed or sentinel or all(map(raw.acked, keys))

    await until(handled, what="the victim to handle the forged frames")


# --- rounds, and the sums the tests compute themselves ----------------------------------------------------
def star_plan(root: int, parts: tuple[int, ...] = (0, 1, 2), version: int = 1) -> Plan:
    parent = {n: (None if n == root else root) for n in parts}
    layout = make_layout(PARAMS, CHUNK)
    return Plan(version, "hand", parts, {n: 1.0 for n in parts}, layout,
                (tree_group(range(len(layout)), root, parent),)).validate()


def chain_plan() -> Plan:
    """0 -> 1 -> 2: node 1 sums its child's partial sum with its own and forwards it to the root."""
    layout = make_layout(PARAMS, CHUNK)
    return Plan(1, "hand", (0, 1, 2), {n: 1.0 for n in range(3)}, layout,
                (tree_group(range(len(layout)), 2, {2: None, 1: 2, 0: 1}),)).validate()


def contrib(rnd: int, n: int) -> np.ndarray:
    return contribution(rnd, 0, n, PARAMS)  # an agent reuses its round's gradient in every attempt


def own_sum(rnd: int, nodes: list[int] | tuple[int, ...]) -> np.ndarray:
    """The exact sum, computed here (int64: the contributions are small integers)."""
    return np.sum([contrib(rnd, n).astype(np.int64) for n in nodes], axis=0).astype(np.float32)


def begin(net: LocalNet, n: int, plan: Plan, rnd: int, attempt: int = 0) -> TaskPart:
    """What an agent does at the start of a round (agents/agent.py), then the round begins."""
    net.overlays[n].forget_before(JOB, rnd - 1)
    net.engines[n].drop_stale(JOB, rnd)
    return net.engines[n].begin_task(JOB, rnd, attempt, plan, contrib(rnd, n))


async def outcome(st: TaskPart) -> np.ndarray | BaseException:
    try:
        return await asyncio.wait_for(asyncio.shield(st.done), DEADLINE)
    except (TaskError, TaskAborted) as exc:
        return exc


def per_chunk(plan: Plan, value: np.ndarray) -> list[tuple[int, np.ndarray]]:
    return [(c, value[off:off + n]) for c, (off, n) in enumerate(plan.layout)]


async def judge_victim(st: TaskPart, want: np.ndarray) -> bool:
    """Refused or aborted, never summed: TaskError, or the exact sum. True if the round failed."""
    got = await outcome(st)
    if isinstance(got, BaseException):
        assert isinstance(got, TaskError), f"the victim's round ended with {got!r}, not a TaskError"
        return True
    assert np.array_equal(got, want), "the victim completed the round with a WRONG sum: the forgery was summed"
    return False


async def judge_bystander(net: LocalNet, n: int, st: TaskPart, want: np.ndarray, failed: bool, rnd: int) -> None:
    """A node that did nothing wrong: aborted with the round (the scheduler's ABORT) or exact."""
    if failed:
        net.overlays[n].abort(JOB, rnd, 0)
        net.engines[n].abort(JOB, rnd, 0)
    got = await outcome(st)
    if isinstance(got, BaseException):
        assert failed and isinstance(got, TaskAborted), repr(got)
    else:
        assert np.array_equal(got, want), f"node {n} completed the round with a WRONG sum"


# --- (a) a doubled contribution ---------------------------------------------------------------------------
async def test_a_doubled_contribution_fails_the_round_and_is_never_summed():
    """Star rooted at 2. Node 0's real partial sum has arrived; the insider speaking for node 1 then
    sends, for every chunk, node 0's contribution plus its own under the bitmap {0, 1}: node 0 twice."""
    plan, rnd = star_plan(root=2), 0
    async with LocalNet(uniform(3)) as net:
        net.overlays[1].suspend(2, True)  # node 1's own process stays off the link: the insider has it
        hub = begin(net, 2, plan, rnd)
        leaf = begin(net, 0, plan, rnd)
        await until(lambda: net.overlays[2].meters_in[0].chunks >= len(plan.layout), what="node 0's chunks")
        raw = await authenticated(net.overlays[2].port, node=1, expect=2)
        try:
            doubled = own_sum(rnd, [0, 1])
            await inject(raw, net.overlays[2], [
                chunk_frame(rnd=rnd, attempt=0, version=1, chunk=c, kind="agg", origin=1, contributors=[0, 1],
                            path=[1, 2], hop=0, data=v) for c, v in per_chunk(plan, doubled)])
            # then what node 1 should have sent: if the forgery was refused, the round can still end exact
            await inject(raw, net.overlays[2], [
                chunk_frame(rnd=rnd, attempt=0, version=1, chunk=c, kind="agg", origin=1, contributors=[1],
                            path=[1, 2], hop=0, data=v) for c, v in per_chunk(plan, contrib(rnd, 1))])
            want = own_sum(rnd, [0, 1, 2])
            failed = await judge_victim(hub, want)
            await judge_bystander(net, 0, leaf, want, failed, rnd)
        finally:
            await raw.close()


# --- (b) stale frames -------------------------------------------------------------------------------------
@pytest.mark.parametrize("stale", ["aborted attempt", "round two back", "older version"])
async def test_stale_frames_are_never_summed_and_the_round_stays_exact(stale):
    """Star rooted at 2 over nodes 0-2; the insider is node 3 (a relay: the frames claim to come from
    node 1 through it). Before the real children send anything, it delivers frames for chunks of this
    round's root that belong to an aborted attempt, to a round two back (replayed: the overlay no longer
    remembers its keys) or to an older plan version. They carry a bitmap that is plausible for their own
    key but garbage values: summed into the running round, they would show in the result."""
    plan = star_plan(root=2, version=2)
    async with LocalNet(uniform(4)) as net:
        net.overlays[3].suspend(2, True)
        rnd, attempt, key = 2, 0, {"rnd": 0, "attempt": 0, "version": 2}
        if stale == "round two back":
            for r in (0, 1):  # two real rounds first
                sts = [begin(net, n, plan, r) for n in (0, 1, 2)]
                for n, st in zip((0, 1, 2), sts, strict=True):
                    assert np.array_equal(await outcome(st), own_sum(r, [0, 1, 2]))
                    net.engines[n].end_task(st)
        elif stale == "aborted attempt":
            key = {"rnd": rnd, "attempt": 0, "version": 2}
            attempt = 1
            for n in (0, 1, 2):  # the scheduler's ABORT of attempt 0 reached everyone
                net.overlays[n].abort(JOB, rnd, 0)
                net.engines[n].abort(JOB, rnd, 0)
        else:
            key = {"rnd": rnd, "attempt": 0, "version": 1}
        hub = begin(net, 2, plan, rnd, attempt)
        raw = await authenticated(net.overlays[2].port, node=3, expect=2)
        try:
            garbage = np.full(PARAMS, 1000.0, np.float32)
            await inject(raw, net.overlays[2], [
                chunk_frame(**key, chunk=c, kind="agg", origin=1, contributors=[1], path=[1, 3, 2], hop=1, data=v)
                for c, v in per_chunk(plan, garbage)])
            others = [begin(net, n, plan, rnd, attempt) for n in (0, 1)]
            want = own_sum(rnd, [0, 1, 2])
            assert not await judge_victim(hub, want), "honest children's frames could not complete the round"
            for n, st in zip((0, 1), others, strict=True):
                assert np.array_equal(await outcome(st), want), f"node {n} holds a wrong result"
        finally:
            await raw.close()


# --- (c) a missing contribution ---------------------------------------------------------------------------
async def test_a_partial_sum_missing_a_participant_fails_at_the_root():
    """Chain 0 -> 1 -> 2. The insider speaking for node 1 hands the root its own contribution alone,
    bitmap {1}: node 0's is missing. The root must not publish that as the round's sum."""
    plan, rnd = chain_plan(), 0
    async with LocalNet(uniform(3)) as net:
        net.overlays[1].suspend(2, True)
        root = begin(net, 2, plan, rnd)
        leaf = begin(net, 0, plan, rnd)
        raw = await authenticated(net.overlays[2].port, node=1, expect=2)
        try:
            await inject(raw, net.overlays[2], [
                chunk_frame(rnd=rnd, attempt=0, version=1, chunk=c, kind="agg", origin=1, contributors=[1],
                            path=[1, 2], hop=0, data=v) for c, v in per_chunk(plan, contrib(rnd, 1))])
            await inject(raw, net.overlays[2], [  # the honest partial sum, had the forgery been refused
                chunk_frame(rnd=rnd, attempt=0, version=1, chunk=c, kind="agg", origin=1, contributors=[0, 1],
                            path=[1, 2], hop=0, data=v) for c, v in per_chunk(plan, own_sum(rnd, [0, 1]))])
            want = own_sum(rnd, [0, 1, 2])
            failed = await judge_victim(root, want)
            await judge_bystander(net, 0, leaf, want, failed, rnd)
        finally:
            await raw.close()


async def test_a_final_value_missing_a_participant_fails_where_it_lands():
    """Star rooted at 2, the insider speaks for the root towards node 0: it broadcasts node 0 a final
    value that misses node 1 (bitmap {0, 2}, the matching sum)."""
    plan, rnd = star_plan(root=2), 0
    async with LocalNet(uniform(3)) as net:
        net.overlays[2].suspend(0, True)
        leaf = begin(net, 0, plan, rnd)
        raw = await authenticated(net.overlays[0].port, node=2, expect=0)
        try:
            await inject(raw, net.overlays[0], [
                chunk_frame(rnd=rnd, attempt=0, version=1, chunk=c, kind="bcast", origin=2, contributors=[0, 2],
                            path=[2, 0], hop=0, data=v) for c, v in per_chunk(plan, own_sum(rnd, [0, 2]))])
            want = own_sum(rnd, [0, 1, 2])
            await inject(raw, net.overlays[0], [
                chunk_frame(rnd=rnd, attempt=0, version=1, chunk=c, kind="bcast", origin=2,
                            contributors=[0, 1, 2], path=[2, 0], hop=0, data=v) for c, v in per_chunk(plan, want)])
            await judge_victim(leaf, want)
        finally:
            await raw.close()


# --- a MAC wrong in one byte, against a live overlay ------------------------------------------------------
class _Sink:
    def chunk_buffer(self, h: dict[str, Any]) -> None:
        return None

    def chunk_segment(self, h: dict[str, Any], payload: memoryview) -> None:
        pass


@pytest.mark.parametrize("byte", [-1, 0])
async def test_a_live_overlay_refuses_a_mac_wrong_only_in_one_byte(byte):
    """The dialer's proof is computed with the right secret, then one byte (the last, or the first) is
    flipped: the overlay must hang up without proving itself or attaching the peer, every time."""
    ov = Overlay(1, "mac", _Sink(), neighbors=[0], secret=SECRET)
    port = await ov.listen()
    try:
        raw = await Raw.connect(port)
        hs = Handshake("mac", 0, "agent", dialer=True, secret=SECRET, expect=1, peer_role="agent")
        raw.send(hs.start())
        hello = await raw.recv()
        assert hello is not None and hello["t"] == "HELLO"
        [proof] = hs.receive(hello)
        mac = bytearray(proof["mac"])
        mac[byte] ^= 0x01
        raw.send({"t": "AUTH", "mac": bytes(mac)})
        raw.start_reading()
        await until(lambda: raw.closed or any(h.get("t") == "AUTH" for h in raw.seen), what="a verdict")
        assert raw.closed and not any(h.get("t") == "AUTH" for h in raw.seen), "the forged MAC was accepted"
        assert 0 not in ov._conns and not ov._connected[0].is_set()
        await raw.close()
        good = await authenticated(port, node=0, expect=1, cluster="mac")  # the genuine proof still works
        await ov.wait_connected(DEADLINE)
        await good.close()
    finally:
        await ov.close()
