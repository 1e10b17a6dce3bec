"""Hostile input against live processes: bounded memory, handlers that cannot die, clear log lines.

Each test plays an attacker over real TCP on loopback (a stranger, or a peer that holds the cluster
secret) against a running scheduler or overlay, then checks from outside that the target is still
whole: memory bounded, the connection either closed or still answering, and a clear reason logged.
"""

import asyncio
import logging
import math
import struct

import numpy as np
import pytest
from helpers.cluster import LocalNet, start_cluster, stop_cluster
from helpers.frames import FakeTransport, Recorder, chunk, feed
from helpers.secret import SECRET
from helpers.secret import SECRET as NET_SECRET
from helpers.waiting import until
from helpers.wire import Raw, authenticated

from agents.engine import EARLY_TASKS
from emulation.topology import Topology, uniform
from overlay import codec
from overlay.budget import MemoryBudget
from overlay.codec import PREAUTH_SCRATCH, SCRATCH, FrameProtocol, encode
from overlay.control import INBOX_MAX, ControlConn, control_protocol
from overlay.link import Blocks
from overlay.messages import FramingError, Heartbeat, ProtocolError, bitmap, validate
from overlay.peers import MAX_HALF_OPEN, Overlay
from scheduler import service


async def _answers_clock(raw: Raw) -> bool:
    """An authenticated control connection is alive if the scheduler still answers CLOCK."""
    raw.send({"t": "CLOCK", "t0": 1.0})
    for _ in range(50):
        h = await raw.recv(timeout=5)
        if h is None:
            return False
        if h["t"] == "CLOCK":
            return True
    return False


def _messages(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


# --- before authentication: a stranger costs a few KiB and gets no second chance ----------------------------
@pytest.mark.unit
async def test_a_preauth_length_prefix_allocates_nothing_and_is_refused_for_what_it_is():
    rec = Recorder()
    proto = control_protocol("stranger")
    proto.handler = rec
    proto.transport = FakeTransport()
    assert len(proto._buf) == PREAUTH_SCRATCH
    feed(proto, struct.pack("!I", 8 << 20) + b"\0" * 64, __import__("random").Random(0))
    assert proto.transport.aborted and isinstance(rec.invalid[-1], FramingError)
    assert "outside 1..1024" in str(rec.invalid[-1])
    assert len(proto._buf) == PREAUTH_SCRATCH  # nothing was sized from the announced 8 MiB


@pytest.mark.unit
async def test_an_authenticated_header_is_buffered_as_it_arrives_not_as_announced():
    rec = Recorder()
    proto = control_protocol("agent 1")
    proto.handler = rec
    proto.transport = FakeTransport()
    proto.authenticated()
    announced = 6 << 20  # within the control limit: legal, but only 100 KB of it ever comes
    feed(proto, struct.pack("!I", announced) + b"\x81" * 100_000, __import__("random").Random(1))
    assert not proto.transport.aborted and not rec.frames
    assert len(proto._buf) <= max(SCRATCH, 2 * 100_004)


@pytest.mark.unit
async def test_a_payload_without_a_buffer_grows_as_its_bytes_arrive():
    rec = Recorder()  # dest None: the codec allocates the payload itself
    proto = FrameProtocol(peer="p", max_payload=8 << 20)
    proto.handler = rec
    proto.transport = FakeTransport()
    data = np.arange(1 << 20, dtype=np.float32).tobytes()  # 4 MiB, of which 100 KB arrive
    feed(proto, encode(chunk(len(data))) + data[:100_000], __import__("random").Random(2))
    assert proto._growing and len(proto._dest) < 4 * 100_000
    feed(proto, data[100_000:], __import__("random").Random(3))
    assert rec.frames and rec.frames[-1][1] == data  # every byte, once, in order


@pytest.mark.loopback
async def test_half_open_control_connections_are_capped_and_logged_once_per_burst(caplog):
    caplog.set_level(logging.WARNING, logger="wansync.scheduler")
    sched = service.Scheduler("c-half", 2, secret=SECRET)
    port = await sched.start()
    conns: list[Raw] = []
    try:
        conns = [await Raw.connect(port) for _ in range(MAX_HALF_OPEN + 60)]
        closed = await asyncio.gather(*(c.closed_by_peer(timeout=2) for c in conns[-60:]))
        assert all(closed)  # the excess is refused at once, not held for the handshake timeout
        assert sched.server.half_open <= MAX_HALF_OPEN
        assert 1 <= len(_messages(caplog, "waiting to authenticate")) <= 2  # one line per burst
    finally:
        for c in conns:
            c.close()
        await sched.shutdown()


@pytest.mark.loopback
async def test_idle_strangers_cost_one_log_line_per_burst_and_agents_still_register(caplog):
    caplog.set_level(logging.WARNING, logger="wansync.scheduler")
    topo = uniform(3)
    sched, agents, tasks = await start_cluster(topo, cluster="c-idle")
    try:
        port = sched.port
        conns = [await Raw.connect(port) for _ in range(40)]
        for c in conns:
            c.send_raw(b"\0\0\0\0")  # a zero length: a framing error before the handshake
        assert all(await asyncio.gather(*(c.closed_by_peer(timeout=10) for c in conns)))
        assert len(_messages(caplog, "refused a control connection")) <= 2
        js = await asyncio.wait_for(sched.run_job("ring", rounds=2, params=20_000, chunk_params=4_000), 60)
        assert all(r.ok and r.digests_agree for r in js.records)
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.loopback
async def test_half_open_data_connections_are_capped():
    ov = Overlay(0, "c-data", _NullSink(), neighbors=[1], secret=SECRET)
    port = await ov.listen()
    conns: list[Raw] = []
    try:
        conns = [await Raw.connect(port) for _ in range(MAX_HALF_OPEN + 20)]
        assert all(await asyncio.gather(*(c.closed_by_peer(timeout=2) for c in conns[-20:])))
        assert ov._half_open <= MAX_HALF_OPEN
    finally:
        for c in conns:
            c.close()
        await ov.close()


class _NullSink:
    budget = MemoryBudget(1 << 20)

    def chunk_buffer(self, h):
        return None

    def chunk_segment(self, h, payload):
        pass


# --- malformed but well-framed control messages: refused, counted, never a dead handler ---------------------
@pytest.mark.unit
@pytest.mark.parametrize("bad", [
    {"t": "REPORT", "node": 0, "samples": [[1]]},  # a one-element sample
    {"t": "COUNTERS", "node": 0, "time": 1.0, "links": {"x": 5}},  # a non-numeric link key
    {"t": "HEARTBEAT", "node": 0, "time": 1.0, "stuck": [["a", 1]]},
    {"t": "STATS", "node": 0, "job": 1, "stats": {"links": {"1": {"bytes": float("nan")}}}},
    {"t": "REGISTER", "node": 0, "host": "h", "port": 1, "neighbors": [10**9]},
])
def test_control_messages_are_validated_inside_not_only_by_field_type(bad):
    with pytest.raises(ProtocolError):
        validate(bad)


@pytest.mark.loopback
async def test_a_malformed_control_message_is_refused_and_the_connection_still_answers(caplog):
    caplog.set_level(logging.WARNING)
    topo = uniform(3)
    sched, agents, tasks = await start_cluster(topo, cluster="c-bad")
    try:
        port = sched.port
        raw = await authenticated(port, 1, "c-bad", SECRET, expect=-1, peer_role="scheduler", epoch=1)
        # registered agents' own connection: the same rules hold for it (schema first)
        raw.send({"t": "REPORT", "node": 1, "samples": [[1]]})
        raw.send({"t": "COUNTERS", "node": 1, "time": 1.0, "links": {"x": 5}})
        assert await _answers_clock(raw)  # refused, counted, and the handler lives on
        assert _messages(caplog, "field 'samples'") and _messages(caplog, "field 'links'")
        for _ in range(200):  # from a connection that never registered, every one is refused...
            raw.send({"t": "HEARTBEAT", "node": 1, "time": 1.0})
        assert await raw.closed_by_peer(timeout=30)  # ...until the limit closes it: never half-alive
        assert _messages(caplog, "invalid messages (the limit): disconnected")
        assert not _messages(caplog, "never retrieved")
        assert 1 in sched.agents and not sched.lost  # the real agent 1 was not touched
        js = await asyncio.wait_for(sched.run_job("ring", rounds=2, params=20_000, chunk_params=4_000), 60)
        assert all(r.ok and r.digests_agree for r in js.records)
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.loopback
async def test_a_handler_bug_ends_that_connection_with_a_clear_line(caplog):
    caplog.set_level(logging.ERROR, logger="wansync.scheduler")
    sched = service.Scheduler("c-bug", 2, secret=SECRET)
    port = await sched.start()
    try:
        def broken(a, msg):
            raise RuntimeError("injected bug")
        sched.server.handlers[Heartbeat] = broken
        raw = await authenticated(port, 0, "c-bug", SECRET, expect=-1, peer_role="scheduler")
        raw.send({"t": "HEARTBEAT", "node": 0, "time": 1.0})
        assert await raw.closed_by_peer(timeout=10)  # not left open and unread
        assert any("RuntimeError: injected bug" in m and "closing its control connection" in m
                   for m in _messages(caplog, "handling its HEARTBEAT failed"))
    finally:
        await sched.shutdown()


@pytest.mark.loopback
async def test_the_invalid_message_limit_on_the_control_port_is_logged(caplog):
    caplog.set_level(logging.WARNING)
    sched = service.Scheduler("c-lim", 2, secret=SECRET)
    port = await sched.start()
    try:
        raw = await authenticated(port, 0, "c-lim", SECRET, expect=-1, peer_role="scheduler")
        for _ in range(codec.MAX_INVALID + 2):
            raw.send({"t": "HEARTBEAT", "node": "x", "time": 0.0})
        assert await raw.closed_by_peer(timeout=10)
        assert _messages(caplog, "invalid messages (the limit): disconnected")
        assert len(_messages(caplog, "field 'node'")) <= 2  # the invalid ones: one line per burst
    finally:
        await sched.shutdown()


@pytest.mark.unit
async def test_a_flood_is_not_read_faster_than_it_is_handled():
    proto = control_protocol("agent 1")
    conn = ControlConn(proto)
    transport = FakeTransport()
    transport.paused = 0
    transport.pause_reading = lambda: setattr(transport, "paused", transport.paused + 1)
    transport.resume_reading = lambda: setattr(transport, "paused", transport.paused - 1)
    proto.transport = transport
    conn.authenticated = True
    proto.authenticated()
    feed(proto, encode({"t": "HEARTBEAT", "node": 1, "time": 1.0}) * (INBOX_MAX + 10), __import__("random").Random(0))
    assert transport.paused == 1  # TCP pushes back on the sender from here
    for _ in range(INBOX_MAX // 2 + 10):
        await conn.recv()
    assert transport.paused == 0


# --- values that would poison the view -------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1.0, 0.0])
def test_non_finite_or_negative_samples_are_protocol_errors(seconds):
    with pytest.raises(ProtocolError):
        validate({"t": "REPORT", "node": 1, "samples": [[0, 1, 1000, seconds]]})


@pytest.mark.loopback
async def test_reports_count_only_from_registered_agents_about_their_own_links(caplog):
    caplog.set_level(logging.WARNING)
    topo = uniform(3)
    sched, agents, tasks = await start_cluster(topo, cluster="c-view")
    try:
        before = sched.view.snapshot()
        port = sched.port
        stranger = await authenticated(port, 2, "c-view", SECRET, expect=-1, peer_role="scheduler", epoch=1)
        stranger.send({"t": "REPORT", "node": 2, "samples": [[0, 2, 10**9, 0.001]]})  # never registered here
        assert await _answers_clock(stranger)
        agent = agents[1]
        agent.ctl.send({"t": "REPORT", "node": 1, "samples": [[0, 2, 10**9, 0.001]]})  # not a link into node 1
        await until(lambda: _messages(caplog, "not a link into node 1"), what="the foreign sample refused")
        assert sched.view.snapshot() == before
        assert all(math.isfinite(r) and r > 0 for r in sched.view.snapshot().values())
        assert _messages(caplog, "has not registered on this connection")
    finally:
        await stop_cluster(sched, tasks)


# --- a peer holding the secret: relayed and held data come from a budget, as bytes arrive ------------------------
def line3() -> Topology:
    from emulation.link import LinkSpec
    links = {}
    for a, b in ((0, 1), (1, 2)):
        links[(a, b)] = links[(b, a)] = LinkSpec(1000.0)
    return Topology("line", 3, links)


def _forged(**kw) -> dict:
    h = {"t": "CHUNK", "job": 1, "task": 0, "attempt": 0, "version": 1, "chunk": 0, "kind": "agg",
         "origin": 0, "contributors": bitmap([0]), "t_send": 0.0, "path": [0, 1, 2], "hop": 0, "off": 0,
         "total": 256 << 20, "nbytes": 4}
    h.update(kw)
    return h


async def _insider(net: LocalNet, victim: int, claim: int) -> Raw:
    """Node `claim`'s identity (it holds the secret) on a fresh connection to `victim`; the real node's
    link is suspended first so it does not take its place back."""
    net.overlays[claim].suspend(victim, True)
    net.overlays[victim].suspend(claim, True)
    net.overlays[victim].suspend(claim, False)  # the victim accepts node `claim` again: the insider
    raw = await authenticated(net.overlays[victim].port, claim, net.cluster, NET_SECRET, expect=victim, epoch=7)
    await until(lambda: net.overlays[victim]._conns.get(claim) is not None, what="the insider attached")
    return raw


async def _marker(raw: Raw, net: LocalNet, victim: int) -> None:
    """Frames on one connection are handled in order: once a marker (an invalid frame) is counted,
    everything sent before it was handled."""
    before = net.overlays[victim].error_count
    raw.send({"t": "HEARTBEAT", "node": 0, "time": 1.0})  # not a data-plane message: one invalid frame
    await until(lambda: net.overlays[victim].error_count > before, what="the marker frame handled")


@pytest.mark.loopback
async def test_relay_frames_for_an_unknown_job_allocate_nothing_and_are_refused_with_a_line(caplog):
    caplog.set_level(logging.WARNING)
    async with LocalNet(line3()) as net:
        raw = await _insider(net, 1, 0)
        for chunk_no in range(4):  # four 4-byte frames announcing a 256 MiB chunk each, for job 999
            raw.send(_forged(job=999, chunk=chunk_no))
            raw.send_raw(b"\0" * 4)
        await _marker(raw, net, 1)
        victim = net.overlays[1]
        assert not victim._rx and not victim.senders[2].unacked and victim.budget.used == 0
        assert _messages(caplog, "job 999 is not running here")
        raw.close()


@pytest.mark.loopback
async def test_relay_frames_of_a_known_job_hold_only_the_bytes_that_came(caplog):
    """A relayed chunk's announced size is reserved in the budget (so admitted chunks always complete)
    but memory is allocated only as bytes arrive; a chunk larger than a peer's share is refused."""
    caplog.set_level(logging.WARNING)
    async with LocalNet(line3()) as net:
        net.engines[1].open_job(1, 0)
        raw = await _insider(net, 1, 0)
        for chunk_no in range(4):
            raw.send(_forged(chunk=chunk_no, total=1 << 20))
            raw.send_raw(b"\0" * 4)
        raw.send(_forged(chunk=9))  # announces 256 MiB: more than node 0 may ever hold here
        raw.send_raw(b"\0" * 4)
        await _marker(raw, net, 1)
        victim = net.overlays[1]
        held = [tr.payload for tr in victim.senders[2].unacked.values()]
        assert len(held) == 4 and all(isinstance(p, Blocks) and p.size == 4 for p in held)  # 4 bytes each came
        assert victim.budget.used == 4 << 20  # reserved for the four admitted chunks, not allocated
        assert _messages(caplog, "can never be relayed here")
        raw.close()
        victim.forget_before(2, 0)  # the job is over: what was relayed for it goes, and its budget
        assert victim.budget.used == 0


@pytest.mark.loopback
async def test_frames_far_ahead_are_held_for_a_few_tasks_then_refused(caplog):
    """Frames beyond the window may be a straggler's next task overtaking its TASK: a few such tasks are
    held; a peer announcing fifty costs this node four tasks' frames, which go when they are over."""
    caplog.set_level(logging.WARNING)
    async with LocalNet(line3()) as net:
        net.engines[2].open_job(1, 0)
        victim = net.engines[1]
        victim.open_job(1, 0)
        raw = await _insider(net, 1, 0)
        for r in range(100_000, 100_050):
            raw.send(_forged(task=r, path=[0, 1], total=4))
            raw.send_raw(b"\0" * 4)
        await _marker(raw, net, 1)
        assert {k[1] for k in victim._stash} == set(range(100_000, 100_000 + EARLY_TASKS))
        assert victim.held_bytes() == 4 * EARLY_TASKS and victim.refused_frames == 50 - EARLY_TASKS
        lines = _messages(caplog, "more than 1 ahead")
        assert 1 <= len(lines) <= 2  # said, once per burst
        victim.note_task(1, 100_003, settled=100_003)  # tasks below 100_002 are over everywhere
        assert {k[1] for k in victim._stash} == {100_002, 100_003} and victim.held_bytes() == 8
        victim.open_job(2, 0)  # another job: job 1's frames are refused from now on, and what was held goes
        assert victim.held_bytes() == 0 and not victim._stash and victim.budget.used == 0
        raw.close()


@pytest.mark.loopback
async def test_a_relay_over_its_budget_refuses_and_the_round_still_ends_exact(caplog):
    """Relayed bytes are charged as they arrive; over the budget (or the sender's share) a relay
    refuses them unacknowledged and asks for them again once it has room: nothing lost."""
    caplog.set_level(logging.WARNING)
    from core.plan import Job
    from scheduler.planners import star
    from scheduler.view import NetworkView

    topo = line3()
    plan = star.plan(NetworkView(topo.links), Job(200_000, 50_000, (0, 1, 2), {"hub": 2})).with_version(1)
    async with LocalNet(topo, hold_budget=600_000) as net:  # node 1 relays 800 KB of node 0's sums, 300 KB at once
        await net.run_round(plan)  # asserts the exact sum on every node
        assert net.engines[1].budget.peak <= 600_000 + 2 * 64 * 1024
        # the round ends when node 2 holds every chunk; node 1 frees the last one when node 2's ack is back
        await until(lambda: net.engines[1].budget.used == 0, "node 1's relay budget to be given back")
        assert _messages(caplog, "memory budget full")


# --- data connections: invalid counts per incarnation; a displaced connection is not an error ------------------
@pytest.mark.loopback
async def test_the_invalid_count_survives_a_connection_claiming_another_incarnation_in_between():
    ov = Overlay(1, "c-inv", _NullSink(), neighbors=[0, 2], secret=SECRET)
    port = await ov.listen()
    try:
        bad = {"t": "ACK", "job": 1, "task": 0, "attempt": 0, "version": 1, "chunk": 0, "kind": "nope",
               "origin": 0, "dst": 1}
        raw = await authenticated(port, 0, "c-inv", SECRET, expect=1, epoch=5)
        for _ in range(10):
            raw.send(bad)
        await until(lambda: ov._invalid.get(0, {}).get(5) == 10, what="ten invalid messages counted")
        other = await authenticated(port, 0, "c-inv", SECRET, expect=1, epoch=6)  # "the real peer"
        await until(lambda: ov._conns.get(0) is not None and ov._conns[0].invalid == 0, what="epoch 6 attached")
        raw = await authenticated(port, 0, "c-inv", SECRET, expect=1, epoch=5)
        await until(lambda: ov._conns.get(0) is not None and ov._conns[0].invalid == 10, what="epoch 5 again")
        for _ in range(codec.MAX_INVALID - 10):
            raw.send(bad)
        assert await raw.closed_by_peer(timeout=10)
        other.close()
    finally:
        await ov.close()


@pytest.mark.loopback
async def test_a_displaced_connection_is_not_reported_as_a_truncated_frame(caplog):
    caplog.set_level(logging.INFO)
    ov = Overlay(1, "c-dis", _NullSink(), neighbors=[0], secret=SECRET)
    port = await ov.listen()
    try:
        first = await authenticated(port, 0, "c-dis", SECRET, expect=1, epoch=3)
        first.send_raw(encode(_forged(path=[0, 1], total=8, nbytes=8))[:10])  # half a frame, then silence
        await until(lambda: ov._conns.get(0) is not None, what="the first connection attached")
        second = await authenticated(port, 0, "c-dis", SECRET, expect=1, epoch=3)
        assert await first.closed_by_peer(timeout=10)
        assert _messages(caplog, "replaces the old one")
        assert not _messages(caplog, "middle of a frame")
        second.close()
    finally:
        await ov.close()


@pytest.mark.unit
async def test_a_bug_in_a_data_handler_ends_that_connection_with_a_clear_line(caplog):
    caplog.set_level(logging.ERROR, logger="wansync.codec")

    class Broken(Recorder):
        def on_frame(self, header, payload):
            raise KeyError("injected")

    proto = FrameProtocol(peer="p")
    rec = Broken()
    proto.handler = rec
    proto.transport = FakeTransport()
    feed(proto, encode({"t": "HEARTBEAT", "node": 1, "time": 1.0}), __import__("random").Random(0))
    assert proto.transport.aborted and _messages(caplog, "KeyError")
