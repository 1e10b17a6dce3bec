"""Refusal logs an attacker can neither flood nor silence, refusal state that stays bounded (issue 38).

Each attack varies what it sends from one connection to the next (the announced header length, the
cluster name, the node id, the reason) over real TCP on loopback, against a scheduler's control port
and an agent's data port. What must hold: a bounded number of log lines per burst (one at once, one
summary with the count and the first and last reasons), bounded tables, and a second burst after a
quiet period logged again. The burst logs' clocks are fakes the tests advance: no test sleeps.
"""

import asyncio
import logging
import os
import signal
import struct
from collections import deque

import aiohttp
import pytest
from helpers.secret import SECRET
from helpers.waiting import until
from helpers.wire import Raw, authenticated

from agents.engine import ChunkEngine
from emulation.topology import uniform
from overlay.auth import AuthError, Handshake, NonceMemory
from overlay.budget import MemoryBudget
from overlay.burstlog import REASON_CHARS, BurstLog
from overlay.codec import encode
from overlay.messages import bitmap
from overlay.peers import HoldRefused, Overlay
from scheduler import http, service
from wansync.stopping import Stopped, until_signal

N = 120  # connections per burst: each one different from the last


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _NullSink:
    def __init__(self, budget: MemoryBudget | None = None) -> None:
        self.budget = budget or MemoryBudget(1 << 20)

    def chunk_buffer(self, h):
        return None

    def chunk_segment(self, h, payload):
        pass


def _lines(caplog, text: str, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage() and r.levelno >= level]


def _hello(node: int, cluster: str) -> dict:
    return {"t": "HELLO", "node": node, "cluster": cluster, "role": "agent", "nonce": os.urandom(32), "epoch": 1}


async def _burst(port: int, first: list[bytes]) -> None:
    """One connection per item: send it, and wait (for the event, not for time) until the target hung up."""
    async def one(data: bytes) -> None:
        raw = await Raw.connect(port)
        try:
            raw.send_raw(data)
            assert await raw.closed_by_peer(timeout=30), "the target never refused the connection"
        finally:
            raw.close()
    for i in range(0, len(first), 30):  # below the half-open limit: every one reaches the handshake
        await asyncio.gather(*(one(d) for d in first[i:i + 30]))


def _varied_lengths(n: int) -> list[bytes]:
    return [struct.pack("!I", 2000 + i) + b"\x81" * 64 for i in range(n)]  # oversized before authentication


def _varied_clusters(n: int) -> list[bytes]:
    return [encode(_hello(10 + i, f"evil-{i}")) for i in range(n)]  # a new cluster name and node id each time


async def _scheduler(clock: FakeClock) -> service.Scheduler:
    sched = service.Scheduler("c-burst", 3, secret=SECRET)
    sched.server.burst = BurstLog(logging.getLogger("wansync.scheduler"), clock=clock)
    await sched.start()
    return sched


async def _overlay(clock: FakeClock, **kw) -> Overlay:
    ov = Overlay(0, "c-burst", _NullSink(kw.pop("budget", None)), neighbors=kw.pop("neighbors", [1]),
                 secret=SECRET, **kw)
    ov.burst = BurstLog(logging.getLogger("wansync.overlay"), clock=clock)
    await ov.listen()
    return ov


def _table_sizes(obj: object) -> int:
    """Entries in every table an object keeps that is not bounded by construction (a deque with a
    maxlen, the nonce memory: tested on their own): sets, dicts, deques, burst logs."""
    n = 0
    for v in vars(obj).values():
        if isinstance(v, deque) and v.maxlen is not None:
            continue
        if isinstance(v, (set, dict, deque, BurstLog)):
            n += len(v)
    return n


# --- 1. varied lengths and cluster names: a bounded number of lines per burst --------------------------------
@pytest.mark.loopback
@pytest.mark.parametrize("attack", [_varied_lengths, _varied_clusters], ids=["lengths", "cluster-names"])
async def test_varied_attacks_cost_two_lines_per_burst_on_the_scheduler(caplog, attack):
    caplog.set_level(logging.WARNING, logger="wansync")
    clock = FakeClock()
    sched = await _scheduler(clock)
    try:
        await _burst(sched.port, attack(N))
        await until(lambda: sched.server.half_open == 0, "every handshake to end")
        assert len(_lines(caplog, "refused a control connection")) == 1  # the first, at once
        assert len(sched.server.burst) <= 2
        clock.t += sched.server.burst.every_s
        sched.server.burst.flush()
        said = _lines(caplog, "refused")
        assert len(said) == 2, said  # and one summary line for the other N - 1
        assert f"{N - 1} more" in said[-1] and "first:" in said[-1] and "last:" in said[-1]
    finally:
        await sched.shutdown()


@pytest.mark.loopback
@pytest.mark.parametrize("attack", [_varied_lengths, _varied_clusters], ids=["lengths", "cluster-names"])
async def test_varied_attacks_cost_two_lines_per_burst_on_an_agent(caplog, attack):
    caplog.set_level(logging.WARNING, logger="wansync")
    clock = FakeClock()
    ov = await _overlay(clock)
    try:
        await _burst(ov.port, attack(N))
        await until(lambda: ov._half_open == 0, "every handshake to end")
        assert len(_lines(caplog, "refused a connection")) == 1
        clock.t += ov.burst.every_s
        ov.burst.flush()
        said = _lines(caplog, "refused")
        assert len(said) == 2, said
        assert f"{N - 1} more" in said[-1]
    finally:
        await ov.close()


# --- 2. refusal state: bounded in size and age -----------------------------------------------------------------
@pytest.mark.loopback
async def test_an_agents_refusal_state_does_not_grow_with_distinct_reasons(caplog):
    caplog.set_level(logging.WARNING, logger="wansync")
    clock = FakeClock()
    ov = await _overlay(clock)
    try:
        await _burst(ov.port, _varied_clusters(30))
        before = _table_sizes(ov)
        await _burst(ov.port, _varied_clusters(300))
        after = _table_sizes(ov)
        assert after <= before + 2, f"tables grew from {before} to {after} entries with 300 distinct reasons"
        assert len(ov.nonces) <= ov.nonces.size
        clock.t += 2 * ov.burst.every_s  # a quiet period: the burst is over and forgotten
        ov.burst.flush()
        assert len(ov.burst) == 0
    finally:
        await ov.close()


@pytest.mark.unit
def test_a_burst_log_is_bounded_in_size_and_age_whatever_the_keys():
    clock = FakeClock()
    burst = BurstLog(logging.getLogger("wansync.test"), every_s=10.0, max_keys=16, clock=clock)
    for i in range(5000):
        burst.log(logging.WARNING, "refused", f"reason {i}", peer=f"10.0.{i // 256}.{i % 256}")
    assert len(burst) <= 17  # 16 peers, then one shared key for every other peer of the kind
    assert burst.lines <= 17
    clock.t += 10.0
    burst.flush()
    clock.t += 10.0
    burst.flush()
    assert len(burst) == 0


@pytest.mark.unit
def test_an_engine_remembers_whom_to_ask_for_a_resend_not_every_job_and_task_a_peer_named(caplog):
    caplog.set_level(logging.WARNING, logger="wansync")
    eng = ChunkEngine(0, uniform(3).routes())
    eng._burst = BurstLog(logging.getLogger("wansync.engine"), clock=FakeClock())
    for i in range(500):  # frames of jobs that do not run here, a new job number each time
        with pytest.raises(HoldRefused):
            eng.admit_relay({"job": 10_000 + i, "task": i}, peer=1)
    assert sum(len(v) for v in eng._refused_from.values()) <= 1 and list(eng._refused_from) == [1]
    assert len(_lines(caplog, "refused frames from node 1")) == 1


@pytest.mark.unit
def test_a_burst_log_stays_bounded_even_if_a_caller_made_many_kinds():
    burst = BurstLog(logging.getLogger("wansync.test"), max_keys=4, clock=FakeClock())
    for i in range(1000):  # kinds are the code's constants; a bug that made them up must not grow the table
        burst.log(logging.WARNING, f"kind {i}", "x", peer=i)
    assert len(burst) <= 4 + 64


@pytest.mark.unit
def test_a_burst_quiet_for_a_whole_window_is_over_even_in_the_middle_of_a_window():
    clock = FakeClock()
    burst = BurstLog(logging.getLogger("wansync.test"), every_s=10.0, clock=clock)
    burst.log(logging.WARNING, "refused", "one", peer="10.0.0.1")
    clock.t += 9.9
    burst.log(logging.WARNING, "refused", "two", peer="10.0.0.1")  # held
    clock.t += 0.1
    burst.flush()  # the window's summary; the burst may go on in the next window
    assert burst.lines == 2
    clock.t += 9.95  # 10.05 s after its last event, though only 9.95 s into the new window
    burst.log(logging.WARNING, "refused", "three", peer="10.0.0.1")
    assert burst.lines == 3  # a new burst: logged at once


@pytest.mark.unit
def test_a_burst_remembers_a_bounded_share_of_a_long_reason():
    burst = BurstLog(logging.getLogger("wansync.test"), clock=FakeClock())
    for _ in range(3):
        burst.log(logging.WARNING, "refused", "x" * 100_000, peer="10.0.0.1")
    (b,) = burst._bursts.values()
    assert len(b.first) <= REASON_CHARS and len(b.last) <= REASON_CHARS


@pytest.mark.unit
def test_the_nonce_memory_is_bounded_in_size_and_age():
    clock = FakeClock()
    mem = NonceMemory(size=100, age_s=60.0, clock=clock)
    assert all(mem.first_use(os.urandom(32)) for _ in range(1000))
    assert len(mem) <= 100
    n = os.urandom(32)
    assert mem.first_use(n) and not mem.first_use(n)
    clock.t += 61.0
    assert mem.first_use(os.urandom(32)) and len(mem) == 1


# --- 3. a second burst after a quiet period is logged again, at the normal level -------------------------------
@pytest.mark.loopback
async def test_a_second_burst_of_the_same_reason_is_logged_again_by_an_agent_and_the_scheduler(caplog):
    caplog.set_level(logging.WARNING, logger="wansync")
    clock = FakeClock()
    ov = await _overlay(clock)
    sched = await _scheduler(clock)
    same = [encode(_hello(7, "the-wrong-cluster"))] * 20  # the same reason every time
    try:
        for port in (ov.port, sched.port):
            await _burst(port, same)
        assert len(_lines(caplog, "the-wrong-cluster")) == 2  # one line each
        clock.t += 3 * ov.burst.every_s  # quiet
        for port in (ov.port, sched.port):
            await _burst(port, same)
        agent = [m for m in _lines(caplog, "") if m.startswith("node 0 refused a connection")]
        scheduler = [m for m in _lines(caplog, "") if m.startswith("scheduler refused a control connection")]
        assert len(agent) == 2 and len(scheduler) == 2, (agent, scheduler)  # the second burst is seen too
        assert len(_lines(caplog, "19 more")) == 2  # and the first one's summary, on each
    finally:
        await sched.shutdown()
        await ov.close()


# --- 4. the dashboard's refusals, and the messages that misled -------------------------------------------------
@pytest.mark.loopback
async def test_the_dashboard_logs_its_refusals_one_line_per_burst(caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="wansync")
    clock = FakeClock()
    monkeypatch.setattr(http, "REFUSALS", BurstLog(logging.getLogger("wansync.http"), clock=clock), raising=False)
    monkeypatch.setattr(http, "MAX_WS_CLIENTS", 1)
    sched = service.Scheduler("c-dash", 2)
    dash = http.DashboardServer(sched, push_every_s=60)
    await dash.start()
    try:
        async with aiohttp.ClientSession() as s, s.ws_connect(dash.url + "ws") as ws:
            await ws.receive_json()  # the snapshot: the one page allowed is open
            for _ in range(5):
                async with s.get(dash.url + "ws", headers={"Connection": "Upgrade", "Upgrade": "websocket",
                                                           "Sec-WebSocket-Version": "13",
                                                           "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}) as r:
                    assert r.status == 503
        for i in range(20):  # an unknown method each time
            reader, writer = await asyncio.open_connection("127.0.0.1", dash.port)
            writer.write(f"X{i}Y / HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert b" 400 " in await reader.readline()
            writer.close()
        assert len(_lines(caplog, "with 503")) == 1
        assert len(_lines(caplog, "with 400")) == 1
        clock.t += 10.0
        http.REFUSALS.flush()
        assert any("4 more" in m for m in _lines(caplog, "too many live pages"))
        assert any("19 more" in m for m in _lines(caplog, "bad HTTP request"))
    finally:
        await dash.stop()


@pytest.mark.loopback
async def test_a_replayed_handshake_is_named_as_a_replay(caplog):
    caplog.set_level(logging.WARNING, logger="wansync")
    ov = await _overlay(FakeClock())
    try:
        hs = Handshake("c-burst", 1, "agent", dialer=True, secret=SECRET, expect=0, peer_role="agent",
                       hello_extra={"epoch": 1})
        hello = hs.start()
        raw = await Raw.connect(ov.port)
        raw.send(hello)
        for reply in hs.receive(await raw.recv()):
            raw.send(reply)  # the AUTH: a recorded handshake, as an eavesdropper would keep it
        await until(lambda: 1 in ov._conns, "node 1 to be attached")
        raw.close()
        again = await Raw.connect(ov.port)
        again.send(hello)
        assert await again.closed_by_peer()
        said = _lines(caplog, "replayed a handshake")
        assert said and not _lines(caplog, "(a different cluster secret?)")
    finally:
        await ov.close()


@pytest.mark.loopback
async def test_a_refusal_raised_in_a_scheduler_handler_names_the_agent(caplog):
    caplog.set_level(logging.WARNING, logger="wansync")
    sched = service.Scheduler("c-none", 2, secret=SECRET)
    port = await sched.start()
    try:
        raw = await authenticated(port, 1, "c-none", SECRET, expect=-1, peer_role="scheduler", epoch=1)
        raw.send({"t": "HEARTBEAT", "node": 1, "time": 1.0})  # never registered: refused by its handler
        await until(lambda: _lines(caplog, "has not registered"), "the refusal to be logged")
        said = _lines(caplog, "has not registered")
        assert "peer None" not in said[0] and "agent 1" in said[0], said
        raw.close()
    finally:
        await sched.shutdown()


@pytest.mark.unit
def test_a_wrong_role_is_said_in_plain_words():
    acceptor = Handshake("c", 1, "agent", dialer=False, secret=None, peer_role="agent")
    with pytest.raises(AuthError) as err:
        acceptor.receive({"t": "HELLO", "node": 2, "cluster": "c", "role": "scheduler"})
    assert "a 'agent'" not in str(err.value) and "expected 'agent'" in str(err.value)


@pytest.mark.loopback
async def test_a_budget_refusal_after_an_oversized_relay_from_the_same_peer_is_logged(caplog):
    caplog.set_level(logging.WARNING, logger="wansync")
    budget = MemoryBudget(4000)  # a peer may hold 2000 bytes
    ov = await _overlay(FakeClock(), neighbors=[1, 2], budget=budget)
    try:
        raw = await authenticated(ov.port, 1, "c-burst", SECRET, expect=0)

        def relay(chunk: int, total: int) -> bytes:
            h = {"t": "CHUNK", "job": 1, "task": 0, "attempt": 0, "version": 1, "chunk": chunk, "kind": "agg",
                 "origin": 1, "contributors": bitmap([1]), "t_send": 1.0, "path": [1, 0, 2], "hop": 0, "off": 0,
                 "total": total, "nbytes": 4}
            return encode(h) + b"\0" * 4
        raw.send_raw(relay(0, 4096))  # can never be relayed here
        await until(lambda: _lines(caplog, "can never be relayed"), "the oversized chunk's line")
        raw.send_raw(relay(1, 1600) + relay(2, 1600))  # the second finds no room: budget full
        await until(lambda: budget.refused >= 2, "the budget to refuse the second chunk")
        assert _lines(caplog, "memory budget full")
        raw.close()
    finally:
        await ov.close()


# --- shutdown: a signal unwinds the work, no traceback ------------------------------------------------------------
@pytest.mark.loopback
def test_sigterm_cancels_the_work_runs_its_finally_and_exits_with_143():
    done: list[str] = []

    async def work() -> None:
        child = asyncio.create_task(asyncio.sleep(3600))
        started = asyncio.Event()
        asyncio.get_running_loop().call_soon(started.set)
        try:
            await started.wait()
            os.kill(os.getpid(), signal.SIGTERM)
            await child
        finally:
            child.cancel()
            await asyncio.gather(child, return_exceptions=True)
            done.append("finally")

    with pytest.raises(Stopped) as stopped:
        asyncio.run(until_signal(work()))
    assert stopped.value.code == 128 + signal.SIGTERM and done == ["finally"]
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)  # nothing of ours left installed
