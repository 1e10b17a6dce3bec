"""Authentication: HMAC challenge-response both ways on both kinds of connection, secrets, TLS.

Connection tests run on real TCP on loopback (in-process scheduler and agents, raw sockets for the
attacker, `wansync agent` processes where the command line is what is tested)."""

import asyncio
import logging
import os
import sys

import pytest
from helpers.cluster import start_cluster, stop_cluster
from helpers.exact import assert_job_exact
from helpers.secret import OTHER_SECRET as OTHER
from helpers.secret import SECRET
from helpers.tls import self_signed as _self_signed
from helpers.waiting import until
from helpers.wire import Raw

from agents.agent import Agent
from emulation.topology import uniform
from overlay import auth
from overlay.auth import AuthError, Handshake, SecretError, load_secret
from overlay.peers import Overlay
from scheduler.service import Scheduler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pair(secret_d: bytes | None, secret_a: bytes | None, **kw) -> tuple[Handshake, Handshake]:
    d = Handshake("c", 0, "agent", dialer=True, secret=secret_d, expect=1, peer_role="agent", **kw)
    a = Handshake("c", 1, "agent", dialer=False, secret=secret_a, peer_role="agent")
    return d, a


def exchange(d: Handshake, a: Handshake) -> None:
    """Run both state machines against each other until done or one refuses (AuthError)."""
    to_a, to_d = [d.start()], []
    while not (d.done and a.done):
        for h in to_a:
            to_d += a.receive(h)
        to_a = []
        for h in to_d:
            to_a += d.receive(h)
        to_d = []
        if not to_a and not to_d and not (d.done and a.done):
            raise AssertionError("handshake stalled")


# --- the state machine and the MAC -------------------------------------------------------------------------
@pytest.mark.unit
def test_same_secret_authenticates_both_ways():
    d, a = pair(SECRET, SECRET)
    exchange(d, a)
    assert d.done and a.done and d.peer == 1 and a.peer == 0


@pytest.mark.unit
@pytest.mark.parametrize("secrets", [(SECRET, OTHER), (OTHER, SECRET)])
def test_wrong_secret_is_refused_by_the_acceptor_before_it_proves_anything(secrets):
    d, a = pair(*secrets)
    with pytest.raises(AuthError, match="MAC does not verify"):
        exchange(d, a)
    assert not a.done and not d.done


@pytest.mark.unit
@pytest.mark.parametrize(("sd", "sa", "why"), [
    (None, SECRET, "has no cluster secret"),  # a node without a secret meets one with
    (SECRET, None, "requires authentication"),  # and the other way round
])
def test_a_missing_secret_is_refused_with_a_clear_reason(sd, sa, why):
    d, a = pair(sd, sa)
    with pytest.raises(AuthError, match=why):
        exchange(d, a)


@pytest.mark.unit
def test_insecure_on_both_ends_is_a_plain_hello_exchange():
    d, a = pair(None, None)
    exchange(d, a)
    assert d.done and a.done and "nonce" not in (d.peer_hello or {})


@pytest.mark.unit
def test_mac_binds_cluster_roles_ids_and_both_nonces():
    base = dict(cluster="c", prover="agent/dialer", dialer=0, acceptor=1, dialer_nonce=b"n" * 32,
                acceptor_nonce=b"m" * 32)
    ref = auth.mac(SECRET, **base)
    for field, other in [("cluster", "d"), ("prover", "agent/acceptor"), ("dialer", 2), ("acceptor", 0),
                         ("dialer_nonce", b"x" * 32), ("acceptor_nonce", b"x" * 32)]:
        assert auth.mac(SECRET, **{**base, field: other}) != ref, field
    # swapping the two nonces (a reflection of the same exchange) changes it too
    swapped = {**base, "dialer_nonce": base["acceptor_nonce"], "acceptor_nonce": base["dialer_nonce"]}
    assert auth.mac(SECRET, **swapped) != ref


@pytest.mark.unit
def test_a_dialers_proof_reflected_as_the_acceptors_fails():
    """The fake acceptor has no secret: it answers with a fresh nonce and echoes the dialer's AUTH."""
    d = Handshake("c", 0, "agent", dialer=True, secret=SECRET, expect=1, peer_role="agent")
    d.start()
    [proof] = d.receive({"t": "HELLO", "node": 1, "cluster": "c", "role": "agent", "nonce": os.urandom(32)})
    with pytest.raises(AuthError, match="node 1 failed authentication"):
        d.receive({"t": "AUTH", "mac": proof["mac"]})
    assert not d.done


@pytest.mark.unit
def test_an_echoed_nonce_is_refused():
    d = Handshake("c", 0, "agent", dialer=True, secret=SECRET, expect=1)
    hello = d.start()
    with pytest.raises(AuthError, match="reflected our own challenge"):
        d.receive({"t": "HELLO", "node": 1, "cluster": "c", "role": "agent", "nonce": hello["nonce"]})


@pytest.mark.unit
def test_secret_from_file_or_environment(tmp_path):
    f = tmp_path / "s"
    f.write_bytes(b"  file-secret-0123456789abcdef\n")
    f.chmod(0o600)
    assert load_secret(f, env={}) == b"file-secret-0123456789abcdef"
    assert load_secret(None, env={"WANSYNC_SECRET": "env-secret-0123456789ab"}) == b"env-secret-0123456789ab"
    assert load_secret(f, env={"WANSYNC_SECRET": "env-secret-0123456789ab"}).startswith(b"file")  # file wins
    assert load_secret(None, env={}) is None
    f.write_bytes(b"short")
    with pytest.raises(SecretError, match="at least 16"):
        load_secret(f, env={})
    with pytest.raises(SecretError, match="cannot read"):
        load_secret(tmp_path / "missing", env={})
    assert len(bytes.fromhex(auth.generate_secret())) == 32


# --- agent <-> scheduler on real TCP -----------------------------------------------------------------------
@pytest.mark.loopback
@pytest.mark.parametrize(("agent_secret", "sched_secret", "sched_says"), [
    (OTHER, SECRET, "MAC does not verify"),
    (None, SECRET, "has no cluster secret"),
    (SECRET, None, "requires authentication"),
])
async def test_agent_with_wrong_or_missing_secret_is_not_registered(caplog, agent_secret, sched_secret, sched_says):
    caplog.set_level(logging.WARNING)
    sched = Scheduler("c", 2, secret=sched_secret)
    port = await sched.start()
    agent = Agent(0, "c", ("127.0.0.1", port), uniform(2), shaped=False, secret=agent_secret)
    try:
        with pytest.raises(ConnectionError, match="refused us or failed authentication"):
            await asyncio.wait_for(agent.run(), 30)

        def refusals() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if r.name == "wansync.scheduler" and "refused a control connection" in r.getMessage()]
        await until(refusals, "the scheduler's line about the refused connection")
        assert not sched.agents
        assert len(refusals()) == 1 and sched_says in refusals()[0], refusals()
    finally:
        await agent.overlay.close()
        await sched.shutdown()


@pytest.mark.loopback
async def test_fake_scheduler_reflecting_the_agents_challenge_is_refused():
    """A raw socket plays scheduler without the secret: it echoes the agent's own AUTH back."""
    got: list[dict] = []

    async def fake(reader, writer):
        raw = Raw(reader, writer)
        hello = await raw.recv()
        got.append(hello)
        raw.send({"t": "HELLO", "node": -1, "cluster": "c", "role": "scheduler", "nonce": os.urandom(32)})
        proof = await raw.recv()
        got.append(proof)
        raw.send({"t": "AUTH", "mac": proof["mac"]})  # reflected
        got.append(await raw.recv())  # the agent must not go on to REGISTER: it hangs up

    server = await asyncio.start_server(fake, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    agent = Agent(0, "c", ("127.0.0.1", port), uniform(2), shaped=False, secret=SECRET)
    try:
        with pytest.raises(ConnectionError, match="failed authentication"):
            await asyncio.wait_for(agent.run(), 30)
        await until(lambda: len(got) >= 3, "the fake scheduler to see the agent's last word")
        assert got[0]["t"] == "HELLO" and got[1]["t"] == "AUTH" and got[2] is None
    finally:
        await agent.overlay.close()
        server.close()


@pytest.mark.loopback
async def test_a_stranger_gets_no_mac_from_the_scheduler_and_no_second_chance():
    sched = Scheduler("c", 2, secret=SECRET)
    port = await sched.start()
    try:
        raw = await Raw.connect(port)
        raw.send({"t": "HELLO", "node": 0, "cluster": "c", "role": "agent", "nonce": os.urandom(32)})
        reply = await raw.recv()
        assert reply["t"] == "HELLO" and "mac" not in reply
        raw.send({"t": "AUTH", "mac": os.urandom(32)})
        assert await raw.closed_by_peer()
        assert not sched.agents
    finally:
        await sched.shutdown()


# --- agent <-> agent ---------------------------------------------------------------------------------------
@pytest.mark.loopback
async def test_neighbours_with_different_secrets_never_attach_and_say_so_once(caplog):
    caplog.set_level(logging.DEBUG, logger="wansync.overlay")
    sink = _NullSink()
    a = Overlay(0, "c", sink, neighbors=[1], secret=SECRET)
    b = Overlay(1, "c", sink, neighbors=[0], secret=OTHER)
    try:
        port_b = await b.listen()
        await a.listen()
        a.connect({1: ("127.0.0.1", port_b)})
        # several redials (50, 100, 200 ms backoff), each refused
        await until(lambda: sum("refused" in r.getMessage() for r in caplog.records) > 2,
                    "the dialer's redials to be refused again")
        assert not a._conns and not b._conns
        assert not a._connected[1].is_set() and not b._connected[0].is_set()
        warn = [r for r in caplog.records if r.levelno >= logging.WARNING]
        acceptor = [r for r in warn if "node 1 refused" in r.getMessage()]
        dialer = [r for r in warn if "node 0 refused" in r.getMessage()]
        assert len(acceptor) == 1 and "MAC does not verify" in acceptor[0].getMessage()
        assert len(dialer) == 1 and "refused our MAC" in dialer[0].getMessage()
        assert sum("refused" in r.getMessage() for r in caplog.records) > 2  # the retries went to DEBUG
    finally:
        await a.close()
        await b.close()


@pytest.mark.loopback
async def test_fake_neighbour_reflecting_the_dialers_proof_is_not_attached():
    sink = _NullSink()
    ov = Overlay(0, "c", sink, neighbors=[1], secret=SECRET)
    seen: list[str] = []

    async def fake(reader, writer):
        raw = Raw(reader, writer)
        await raw.recv()
        raw.send({"t": "HELLO", "node": 1, "cluster": "c", "role": "agent", "nonce": os.urandom(32)})
        proof = await raw.recv()
        if proof is not None:
            seen.append(proof["t"])
            raw.send({"t": "AUTH", "mac": proof["mac"]})
        await raw.closed_by_peer(2)
        raw.close()

    server = await asyncio.start_server(fake, "127.0.0.1", 0)
    try:
        await ov.listen()
        ov.connect({1: ("127.0.0.1", server.sockets[0].getsockname()[1])})
        await until(lambda: seen and any("node 1 failed authentication" in str(e) for e in ov.errors),
                    "the reflected proof to be refused")
        assert seen and not ov._conns and not ov._connected[1].is_set()
        assert any("node 1 failed authentication" in str(e) for e in ov.errors)
    finally:
        await ov.close()
        server.close()


@pytest.mark.loopback
async def test_intruders_leave_a_running_cluster_exact():
    """Wrong-secret neighbour, stranger and reflected proof against a live cluster; the next job is exact."""
    sched, agents, tasks = await start_cluster(uniform(3), cluster="intr")
    try:
        port = agents[1].overlay.port
        intruder = Overlay(0, "intr", _NullSink(), neighbors=[1], secret=OTHER)
        await intruder.listen()
        intruder.connect({1: ("127.0.0.1", port)})
        raw = await Raw.connect(port)  # claims to be node 2 and replays node 1's own proof material
        raw.send({"t": "HELLO", "node": 2, "cluster": "intr", "role": "agent", "nonce": os.urandom(32)})
        assert (await raw.recv())["t"] == "HELLO"
        raw.send({"t": "AUTH", "mac": b"\0" * 32})
        assert await raw.closed_by_peer()
        errors = agents[1].overlay.errors  # the stranger claimed node 2, the wrong-secret neighbour node 0
        assert any("node 2 failed authentication" in str(e) for e in errors)
        await until(lambda: any("node 0 failed authentication" in str(e) for e in errors),
                    "node 1 to refuse the wrong-secret neighbour")
        await intruder.close()
        js = await asyncio.wait_for(sched.run_job("ring", rounds=2, params=30_000, chunk_params=4_000), 30)
        assert all(r.ok and r.digests_agree and r.versions_agree for r in js.records)
        assert_job_exact(sched, js)
        assert sorted(sched.agents) == [0, 1, 2]
    finally:
        await stop_cluster(sched, tasks)


class _NullSink:
    def chunk_buffer(self, h):
        return None

    def chunk_segment(self, h, payload):
        pass


# --- the command line: secrets through the environment, refusal without one --------------------------------
def _agent_cmd(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "wansync.cli", "agent", "--node", "0", "--scheduler", f"127.0.0.1:{port}",
            "--cluster", "cli", "--topology", "uniform", "--nodes", "2", "--no-shaping", *extra]


def _env(**kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WANSYNC_SECRET"}
    return {**env, **kw}


async def _run_proc(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(*cmd, env=env, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, err.decode()


@pytest.mark.loopback
async def test_agent_process_refuses_to_start_without_a_secret():
    rc, err = await _run_proc(_agent_cmd(1), _env())
    assert rc != 0 and "no cluster secret" in err and "--insecure" in err


@pytest.mark.loopback
async def test_agent_process_with_the_wrong_secret_is_refused_with_one_line(caplog):
    caplog.set_level(logging.WARNING)
    sched = Scheduler("cli", 2, secret=SECRET)
    port = await sched.start()
    try:
        rc, err = await _run_proc(_agent_cmd(port), _env(WANSYNC_SECRET=OTHER.decode()))
        assert rc == 1
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1 and "refused our MAC" in lines[0], err
        assert not sched.agents
        ours = [r.getMessage() for r in caplog.records if "refused a control connection" in r.getMessage()]
        assert len(ours) == 1 and "MAC does not verify" in ours[0]
    finally:
        await sched.shutdown()


@pytest.mark.loopback
async def test_run_hands_its_agents_the_secret_by_environment_not_argv(tmp_path):
    import json as _json

    from wansync.backend import AppBackend, agent_command
    from wansync.cluster import LocalAgents, agent_options_file, run_secret
    from wansync.options import Options
    from wansync.runspec import resolve

    cfg = resolve(Options.make(topology="internet2", schemes=["star"], scale=0.01, rounds=1))
    path = agent_options_file(cfg, "run-x")
    cmd = agent_command(path, 0, "127.0.0.1:1234")
    assert not any("secret" in c.lower() for c in cmd)
    assert Options.read(path).security["secret_file"] is None  # a fresh secret: in the environment only
    # the processes `wansync run` starts: each sees the secret in its environment, none in its argv or options
    cfg = resolve(Options.make(topology="uniform", nodes=2, schemes=["star"], scale=0.01, rounds=1))
    secret, env = run_secret(cfg)

    class Echo(AppBackend):  # the agent's command line, run by a stand-in that reports what it got
        def agent_command(self, options_file, node, port):
            cmd = agent_command(options_file, node, f"127.0.0.1:{port}")
            return [sys.executable, "-c", "import json, os, sys; open(sys.argv[1], 'w').write(json.dumps("
                    "[os.environ.get('WANSYNC_SECRET'), sys.argv, open(sys.argv[sys.argv.index('--options') + 1])"
                    ".read()]))", str(tmp_path / f"n{node}")] + cmd[1:]

    agents = LocalAgents(cfg, "run-x", env, Echo())
    await agents.start(1234)
    await agents.stop()
    for n in range(2):
        got_secret, argv, options = _json.loads((tmp_path / f"n{n}").read_text())
        assert got_secret == secret.decode()
        assert not any(secret.decode() in a for a in argv)
        assert secret.decode() not in options and _json.loads(options)["cluster"]["name"] == "run-x"


# --- TLS ---------------------------------------------------------------------------------------------------
@pytest.mark.loopback
async def test_tls_cluster_is_exact_and_refuses_plaintext(tmp_path):
    tls = _self_signed(tmp_path)
    sched, agents, tasks = await start_cluster(uniform(3), cluster="tls", tls=tls)
    try:
        assert sched.server.server is not None
        js = await asyncio.wait_for(sched.run_job("ring", rounds=2, params=30_000, chunk_params=4_000), 30)
        assert all(r.ok and r.digests_agree for r in js.records)
        assert_job_exact(sched, js)
        assert agents[0].ctl.proto.transport.get_extra_info("ssl_object") is not None
        conn = agents[0].overlay._conns[1]
        assert conn.transport.get_extra_info("ssl_object") is not None  # the data plane too
        # a plaintext client gets nowhere: its HELLO is not TLS
        port = agents[1].overlay.port
        raw = await Raw.connect(port)
        raw.send({"t": "HELLO", "node": 0, "cluster": "tls", "role": "agent", "nonce": os.urandom(32)})
        assert await raw.recv() is None
    finally:
        await stop_cluster(sched, tasks)
