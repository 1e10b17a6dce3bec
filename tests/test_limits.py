"""Limits: frame and header sizes, invalid messages per peer, the hold budget for future rounds.

Each attack runs on real TCP against a live cluster (or overlay), and each is followed by a check
that the cluster is still consistent: the next round is exact, nothing stranger registered."""

import asyncio
import itertools
import logging
import os
import random
import struct

import numpy as np
import pytest
from helpers.cluster import LocalNet, start_cluster, stop_cluster
from helpers.exact import assert_job_exact
from helpers.frames import FakeTransport, Recorder, chunk, feed
from helpers.secret import SECRET
from helpers.waiting import until
from helpers.wire import Raw, authenticated

from agents.engine import ChunkEngine
from agents.workload import contribution
from core.plan import Job
from emulation.topology import uniform
from overlay.codec import CONTROL_MAX_HEADER, MAX_INVALID, SCRATCH, FrameProtocol, encode
from overlay.control import control_protocol
from overlay.messages import FramingError, acked_keys, bitmap
from overlay.peers import Overlay
from scheduler.planners import star
from scheduler.view import NetworkView


def fake(proto: FrameProtocol, rec: Recorder) -> FrameProtocol:
    proto.handler = rec
    proto.transport = FakeTransport()
    return proto


# --- frame and header sizes --------------------------------------------------------------------------------
@pytest.mark.unit
async def test_header_limit_is_configurable_and_enforced_both_ways():
    rec = Recorder()
    proto = fake(FrameProtocol(max_header=256), rec)
    small = {"t": "HEARTBEAT", "node": 1, "time": 0.0}
    big = {"t": "REPORT", "node": 1, "samples": [[0, 1, 10**6, 0.1]] * 40}
    assert len(encode(big)) - 4 > 256
    feed(proto, encode(small), random.Random(0))
    assert rec.frames and not proto.transport.aborted
    feed(proto, encode(big), random.Random(0))
    assert proto.transport.aborted and isinstance(rec.invalid[-1], FramingError)
    assert "outside 1..256" in str(rec.invalid[-1])
    with pytest.raises(ValueError, match="exceeds 256"):
        encode(big, 256)


@pytest.mark.unit
async def test_payload_limit_is_enforced_on_the_announced_size_before_any_byte_arrives():
    rec = Recorder()
    proto = fake(FrameProtocol(max_payload=4096), rec)
    feed(proto, encode(chunk(4096)) + b"\0" * 4096, random.Random(0))
    assert len(rec.frames) == 1
    feed(proto, encode(chunk(8192)), random.Random(0))  # the header alone is enough to refuse it
    assert proto.transport.aborted and "8192 bytes exceeds 4096" in str(rec.invalid[-1])


@pytest.mark.unit
async def test_control_connections_take_a_large_plan_but_no_payload():
    rec = Recorder()
    proto = fake(control_protocol("sched"), rec)
    proto.authenticated()  # a plan comes only after the handshake
    plan = {"groups": [list(range(200))] * 2000}  # ~0.8 MB: a plan for a large cluster
    reply = {"t": "TASK", "job": 1, "task": 0, "attempt": 0, "version": 3, "round": 0, "members": [0, 1],
             "receivers": [0, 1], "plan": plan}
    data = encode(reply, CONTROL_MAX_HEADER)
    assert len(data) > SCRATCH
    feed(proto, data + encode({"t": "HEARTBEAT", "node": 0, "time": 1.0}), random.Random(3))
    assert [h["t"] for h, _ in rec.frames] == ["TASK", "HEARTBEAT"] and rec.frames[0][0]["plan"] == plan
    assert len(proto._buf) == SCRATCH  # the large header's memory went back
    feed(proto, encode(chunk(8)), random.Random(0))  # a data frame on a control connection
    assert proto.transport.aborted and isinstance(rec.invalid[-1], FramingError)


# --- invalid messages per peer, on real TCP ----------------------------------------------------------------
_marker = itertools.count(1000)


async def answers(raw: Raw, node: int, dst: int = 1) -> None:
    """`node`'s connection is still open and everything sent on it before was read: a whole chunk
    sent now comes back acknowledged (TCP keeps order: the peer read what came before it first)."""
    c = next(_marker)
    raw.send(chunk(8, chunk=c, origin=node, contributors=bitmap([node]), path=[node, dst]))
    raw.send_raw(b"\0" * 8)
    while (reply := await raw.recv()) is not None:
        if reply["t"] in ("ACK", "ACKS") and any(k[4] == c for k in acked_keys(reply)):
            return
    raise AssertionError(f"node {dst} closed node {node}'s connection")


@pytest.mark.loopback
async def test_invalid_messages_are_counted_per_peer_and_the_limit_disconnects():
    ov = Overlay(1, "lim", _Sink(), neighbors=[0, 2], secret=SECRET)
    port = await ov.listen()
    try:
        a = await authenticated(port, 0, "lim", SECRET, expect=1)
        b = await authenticated(port, 2, "lim", SECRET, expect=1)
        bad = encode({"t": "HEARTBEAT", "node": "x", "time": 0})  # well framed, invalid
        half = MAX_INVALID // 2 + 1
        for raw in (a, b):
            raw.send_raw(bad * half)  # together more than MAX_INVALID: each alone is under it
        await answers(a, 0)
        await answers(b, 2)
        assert set(ov._conns) == {0, 2} and len(ov.errors) == 2 * half
        a.send_raw(bad * (MAX_INVALID - half))
        assert await a.closed_by_peer()
        await until(lambda: set(ov._conns) == {2}, "node 1 to let go of node 0's connection")
        b.send({"t": "ACK", "job": 1, "task": 0, "attempt": 0, "version": 1, "chunk": 0, "kind": "agg",
                "origin": 2, "dst": 1})
        await answers(b, 2)  # only the peer that reached the limit is gone
        # reconnecting does not clear the count: the same incarnation is cut at its next invalid message
        a = await authenticated(port, 0, "lim", SECRET, expect=1)
        a.send_raw(bad)
        assert await a.closed_by_peer()
        # a restarted peer (a newer incarnation) starts from zero
        a = await authenticated(port, 0, "lim", SECRET, expect=1, epoch=1)
        a.send_raw(bad * (MAX_INVALID - 1))
        await answers(a, 0)
        a.close()
        b.close()
    finally:
        await ov.close()


@pytest.mark.loopback
async def test_max_invalid_is_configurable():
    ov = Overlay(1, "lim", _Sink(), neighbors=[0], secret=SECRET, max_invalid=3)
    port = await ov.listen()
    try:
        raw = await authenticated(port, 0, "lim", SECRET, expect=1)
        raw.send_raw(encode({"t": "NOPE"}) * 2)
        await answers(raw, 0)
        raw.send_raw(encode({"t": "NOPE"}))
        assert await raw.closed_by_peer()
    finally:
        await ov.close()


class _Sink:
    def chunk_buffer(self, h):
        return None

    def chunk_segment(self, h, payload):
        pass


# --- malformed streams against a live cluster: each leaves it exact ----------------------------------------
ATTACKS = {
    "truncated frame": struct.pack("!I", 200) + b"\x85" + b"\0" * 60,  # then the socket closes
    "huge length prefix": b"\xff\xff\xff\xff" + os.urandom(64),
    "garbage header": struct.pack("!I", 24) + bytes(range(0xc1, 0xc1 + 24)),
}


@pytest.mark.loopback
@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_malformed_streams_from_strangers_and_insiders_leave_the_cluster_exact(attack):
    sched, agents, tasks = await start_cluster(uniform(3), cluster="atk")
    try:
        data = ATTACKS[attack]
        # strangers: the scheduler's port and an agent's data port
        for port in (sched.port, agents[1].overlay.port):
            raw = await Raw.connect(port)
            raw.send_raw(data)
            if attack == "truncated frame":
                raw.close()
            else:
                assert await raw.closed_by_peer(), f"{attack} to port {port} left the connection open"
        # an insider (holds the secret) displaces node 0's link to node 1 mid-job and then misbehaves
        job = asyncio.create_task(sched.run_job("star", rounds=3, params=60_000, chunk_params=5_000,
                                                options={"hub": 1}))
        await until(lambda: sched.current is not None and (sched.current.started or sched.current.records),
                    "the job's first round to start")
        raw = await authenticated(agents[1].overlay.port, 0, "atk", SECRET, expect=1)
        raw.send_raw(data)
        if attack == "truncated frame":
            raw.close()
        js = await asyncio.wait_for(job, 30)
        assert len(js.records) == 3
        assert all(r.ok and r.digests_agree and r.versions_agree for r in js.records)
        assert_job_exact(sched, js)
        assert sorted(sched.agents) == [0, 1, 2]
        assert agents[1].overlay.errors  # the misbehaviour was seen and named, not ignored
    finally:
        await stop_cluster(sched, tasks)


# --- the hold budget ---------------------------------------------------------------------------------------
BUDGET = 128 * 1024  # one peer may use half: one 40 KB chunk each is held, the rest refused


def hub_plan(n: int, params: int, chunk_params: int, hub: int):
    return star.plan(NetworkView(uniform(n).links), Job(params, chunk_params, tuple(range(n)),
                                                        {"hub": hub})).with_version(1)


@pytest.mark.loopback
async def test_future_round_frames_over_budget_are_refused_unacked_and_resent_when_it_begins(caplog):
    caplog.set_level(logging.WARNING, logger="wansync.engine")
    plan = hub_plan(3, 100_000, 10_000, hub=2)  # nodes 0 and 1 push 400 KB each to node 2
    async with LocalNet(uniform(3), hold_budget=BUDGET) as net:
        hub = net.engines[2]
        hub.open_job(1, 0)  # node 2 is still at round 0: round 1 is the future for it
        seen = {}

        def warned() -> set[str]:
            return {r.getMessage().split("from node ")[1][0] for r in caplog.records
                    if "hold budget full" in r.getMessage()}

        async def when_both_refused() -> None:
            """Node 2 begins round 1 once both pushers met the full budget (nothing else releases them)."""
            await until(lambda: warned() == {"0", "1"}, "node 2 to refuse frames from both nodes 0 and 1")
            seen["held"] = hub.held_bytes()
            seen["refused"] = hub.hold_refused
            seen["unacked"] = sum(len(net.overlays[n].senders[2].unacked) for n in (0, 1))

        await net.run_round(plan, rnd=1, starts={2: when_both_refused})  # exact, or it raises
        assert seen["refused"] > 0 and seen["unacked"] > 0
        assert 0 < seen["held"] <= BUDGET
        assert hub.held_peak <= BUDGET + 2 * 40_000  # at most one segment per peer checked at once
        for n in (0, 1):
            assert not net.overlays[n].senders[2].unacked  # the resends completed and were acked
        warnings = [r.getMessage() for r in caplog.records if "hold budget full" in r.getMessage()]
        assert len(warnings) == 2 and {w.split("from node ")[1][0] for w in warnings} == {"0", "1"}
        await net.run_round(plan, rnd=2)  # and the next round is exact too


@pytest.mark.loopback
async def test_current_round_frames_count_too_and_over_budget_are_resent_when_it_begins():
    """Early frames of the round a node has not begun yet are held within the budget like any other:
    a peer announcing bogus versions of the current round cannot grow the stash without end. Over
    budget they are refused unacknowledged and resent once the round begins: nothing is lost."""
    plan = hub_plan(3, 100_000, 10_000, hub=2)
    async with LocalNet(uniform(3), hold_budget=1024) as net:
        hub = net.engines[2]
        hub.open_job(1, 0)  # round 0 is node 2's current round; it only begins late
        await net.run_round(plan, rnd=0, starts={2: lambda: until(lambda: hub.hold_refused > 0,
                                                                   "node 2 to refuse early frames over budget")})
        assert hub.hold_refused > 0 and hub.held_peak <= 1024 + 2 * 40_000 and hub.held_bytes() == 0


@pytest.mark.unit
async def test_a_held_frame_the_plan_does_not_allow_is_dropped_when_the_round_begins(caplog):
    """Held frames were never checked against a plan; replay checks them instead of crashing."""
    plan = hub_plan(2, 1_000, 500, hub=1)
    eng = ChunkEngine(1, uniform(2).routes())
    eng.open_job(1, 0)
    h = chunk(8, task=1, chunk=99, version=1, path=[0, 1], contributors=bitmap([0]))
    eng.chunk_buffer(h)
    eng.chunk_segment(h, memoryview(np.zeros(2, np.float32)).cast("B"))
    assert eng.stashed_frames == 1
    with caplog.at_level(logging.WARNING, logger="wansync.engine"):
        st = eng.begin_task(1, 1, 0, plan, contribution(1, 0, 1, plan.params))
    assert not st.done.done() and any("chunk 99" in r.getMessage() for r in caplog.records)
