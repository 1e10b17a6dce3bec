"""The local hand-off channel is not a way in: for every check the channel makes (overlay.handoff,
agents.handoff), a hostile peer that the check alone stops. Each hostile input gets a clear refusal
(a `refused` frame with its reason where the channel sends one, then the connection closes), costs
one log line and nothing else (no script attached, nothing allocated from a size the peer announced,
an attached script unaffected), and afterwards a proper training script attaches and syncs the right
sum, checked against a float64 reference computed here.

The hostile peers are raw sockets driven from threads of this process (the agents run on this event
loop); the stranger of another uid is a child process that drops to uid 65534; the proper scripts are
real `wansync.torch.channel.Channel` processes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from helpers.cluster import Cluster
from helpers.exact import assert_float_sum
from helpers.waiting import until

import agents.handoff as agent_handoff
from agents.handoff import Handoff, socket_path
from core.sketch import trailer_len
from emulation.topology import uniform
from overlay.handoff import CHANNEL_ENV, HEADER, MAX_FRAME, MAX_METRICS, MAX_PARAMS, MAX_TENSORS, TOKEN_ENV

pytestmark = [pytest.mark.loopback, pytest.mark.torch, pytest.mark.timeout(240)]
torch = pytest.importorskip("torch")

TOKEN = "test-run-token"
NODES = 2
P = 4096
STEPS = 2
LAYOUT = {"names": ["w", "b"], "shapes": [[P - 10], [10]], "dtypes": ["float32", "float32"]}
READ_S = 20.0  # a hostile peer's deadline for the agent's answer: reaching it means no answer came

SCRIPT = r"""
import json, os, sys
import numpy as np
from wansync.torch.channel import Channel
rank, P, steps, out = int(os.environ["RANK"]), int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ch = Channel.from_env({"names": ["w", "b"], "shapes": [[P - 10], [10]], "dtypes": ["float32", "float32"]})
sys.stdin.readline()  # go: the test has tried what it tries while this script is attached
results = []
for k in range(steps):
    ch.buffer().numpy()[:] = np.random.default_rng([rank, k]).standard_normal(P).astype(np.float32) * (rank + 1)
    red = ch.allreduce()
    results.append(red.result.numpy().copy())
ch.close()
np.save(out, np.stack(results))
print(json.dumps({"done": len(results), "weight": red.weight}), flush=True)
"""

# a stranger: starts as root, drops to nobody before it touches the socket, says a perfect hello
STRANGER = r"""
import os, socket, sys
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(float(sys.argv[3]))
s.connect(sys.argv[1])
print("uid", os.getuid(), "connected", flush=True)
buf = b""
try:
    s.sendall(bytes.fromhex(sys.argv[2]))
except (ConnectionResetError, BrokenPipeError):
    pass  # the agent refused us at once, before our hello was all out: its answer waits to be read
try:
    while got := s.recv(65536):
        buf += got
    print("eof", flush=True)
except (ConnectionResetError, BrokenPipeError):
    print("eof", flush=True)
except TimeoutError:
    print("timeout", flush=True)
print("reply", buf.hex(), flush=True)
"""


# --- a hostile peer: a raw socket, blocking, driven from a thread (the agents run on this event loop) ------
def frame(msg: Any) -> bytes:
    """A frame as the channel frames it, but of anything (no checks on this side)."""
    body = msgpack.packb(msg, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def hello(**over: Any) -> dict[str, Any]:
    """A hello the agent of rank 0 accepts, but for `over`."""
    return {"t": "hello", "token": TOKEN, "rank": 0, "pid": os.getpid(), "layout": LAYOUT, **over}


class Peer:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(READ_S)
        self.sock.connect(str(path))
        self.fds: list[int] = []

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the agent answered before it read this (a refusal at connect): `read` gets the answer

    def read(self) -> dict[str, Any] | None:
        """The agent's next frame; None once the connection is closed (a TimeoutError if neither came)."""
        buf = b""
        try:
            while len(buf) < HEADER.size:
                got, fds, _, _ = socket.recv_fds(self.sock, HEADER.size - len(buf), 1)
                self.fds += fds
                if not got:
                    return None
                buf += got
            (n,) = HEADER.unpack(buf)
            body = b""
            while len(body) < n:
                got = self.sock.recv(n - len(body))
                assert got, "the agent closed the channel in the middle of a frame"
                body += got
        except ConnectionResetError:  # it closed with bytes of ours unread
            return None
        return msgpack.unpackb(body, raw=False)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.sock.close()


async def connect(path: Path) -> Peer:
    return await asyncio.to_thread(Peer, path)


def handoff_lines(caplog: pytest.LogCaptureFixture, since: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records[since:] if r.name == "wansync.handoff"]


async def refused(c: Cluster, caplog: pytest.LogCaptureFixture, node: int, data: bytes | None,
                  why: str, peer: Peer | None = None) -> None:
    """`data` (None: nothing) sent to node's agent by a peer that is not attached: a `refused` frame whose
    error contains `why`, then the connection closes; one log line; counted refused; the agents' scripts
    are what they were (none, or the attached ones, untouched)."""
    h = c.agents[node].handoff
    before, count = len(caplog.records), h.refused
    scripts = [a.handoff.script for a in c.agents]
    peer = peer or await connect(socket_path(h.path.parent, node))
    try:
        if data is not None:
            await asyncio.to_thread(peer.send, data)
        reply = await asyncio.to_thread(peer.read)
        assert reply is not None and reply["t"] == "refused", f"{why!r}: no refusal but {reply!r}"
        assert why in reply["error"], f"refused for {reply['error']!r}, expected {why!r}"
        assert await asyncio.to_thread(peer.read) is None, f"{why!r}: the connection stayed open"
        assert not peer.fds, "a refused peer got a file descriptor"
    finally:
        peer.close()
    lines = handoff_lines(caplog, before)
    assert len(lines) == 1 and why in lines[0].getMessage(), [r.getMessage() for r in lines]
    assert h.refused == count + 1
    assert all(a.handoff.script is s for a, s in zip(c.agents, scripts, strict=True))


async def attach_raw(c: Cluster, **over: Any) -> list[Peer]:
    """A raw script attached to every agent (a hello each, the scheduler's verdict, the memfd)."""
    peers = [await connect(socket_path(a.handoff.path.parent, a.node)) for a in c.agents]

    def one(r: int) -> dict[str, Any] | None:
        peers[r].send(frame(hello(rank=r, **over)))
        return peers[r].read()
    welcomes = await asyncio.gather(*(asyncio.to_thread(one, r) for r in range(NODES)),
                                    c.sched.attached(60))
    assert all(w is not None and w["t"] == "welcome" for w in welcomes[:NODES]), welcomes
    assert all(len(p.fds) == 1 for p in peers)
    await until(lambda: all(a.handoff.script is not None for a in c.agents), "the raw scripts to attach")
    return peers


async def bye(c: Cluster, peer: Peer, node: int) -> None:
    await asyncio.to_thread(peer.send, frame({"t": "bye", "steps": 0}))
    assert await asyncio.to_thread(peer.read) is None
    peer.close()
    await until(lambda: c.agents[node].handoff.script is None, f"rank {node}'s raw script to detach")


async def misbehaves(c: Cluster, caplog: pytest.LogCaptureFixture, data: list[bytes], why: str) -> None:
    """An attached script (rank 0) sends `data`: its connection closes (one warning naming `why`, one line
    saying it detached), the agent detaches it cleanly; the other rank's script says bye."""
    peers = await attach_raw(c)
    h = c.agents[0].handoff
    script, count, before = h.script, h.refused, len(caplog.records)
    for d in data:
        await asyncio.to_thread(peers[0].send, d)
    assert await asyncio.to_thread(peers[0].read) is None, f"{why!r}: the connection stayed open"
    peers[0].close()
    await until(lambda: h.script is None, "the agent to detach the misbehaving script")
    assert h.last is script and h.refused == count + 1 and not h._attached.is_set()
    assert all(np.isfinite(v) for m in script.metrics for v in m.values()), script.metrics
    lines = handoff_lines(caplog, before)
    warnings = [r.getMessage() for r in lines if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and why in warnings[0], warnings
    assert [r.getMessage() for r in lines if r.levelno < logging.WARNING] == ["node 0: the script detached after "
                                                                              f"{script.next_step} steps"]
    await bye(c, peers[1], 1)


# --- the proper scripts ---------------------------------------------------------------------------------
def contribution(rank: int, k: int) -> np.ndarray:
    return np.random.default_rng([rank, k]).standard_normal(P).astype(np.float32) * (rank + 1)


async def sync_works(c: Cluster, d: Path, tmp: Path,
                     while_attached: Callable[[list[subprocess.Popen]], Awaitable[None]] | None = None) -> None:
    """Proper scripts attach on every rank (and `while_attached` runs while they are), sync STEPS times and
    each gets the sum: max_i |r_i - ref_i| / sum_j |x_ji| <= (m + 1) 2^-24 against a float64 reference."""
    procs = []
    for r in range(NODES):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(NODES), LOCAL_RANK=str(r),
                   **{CHANNEL_ENV: str(socket_path(d, r)), TOKEN_ENV: TOKEN})
        procs.append(subprocess.Popen([sys.executable, "-c", SCRIPT, str(P), str(STEPS), str(tmp / f"r{r}.npy")],
                                      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    try:
        layout = await c.sched.attached(90)
        assert layout["params"] == P
        await until(lambda: all(a.handoff.script is not None for a in c.agents), "the scripts to attach")
        if while_attached is not None:
            await while_attached(procs)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.close()
        job = asyncio.create_task(c.sched.run_job("ring", rounds=1_000_000, params=P + trailer_len(NODES),
                                                  chunk_params=1024, workload="handoff"))
        await until(lambda: all(p.poll() is not None for p in procs), "the scripts to exit", 90)
        await c.sched.close_job(c.sched.current, timeout=30)
        await job
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outs = [json.loads(p.stdout.read().strip().splitlines()[-1]) for p in procs]
    assert [p.returncode for p in procs] == [0] * NODES
    assert all(o == {"done": STEPS, "weight": NODES} for o in outs), outs
    for k in range(STEPS):
        for r in range(NODES):
            assert_float_sum(np.load(tmp / f"r{r}.npy")[k], [contribution(q, k) for q in range(NODES)])


@pytest.fixture
def private_dir():
    with tempfile.TemporaryDirectory(prefix="wansync-hostile-") as d:
        os.chmod(d, 0o700)
        yield Path(d)


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="wansync.handoff")
    return caplog


def cluster(name: str, d: Path) -> Cluster:
    return Cluster(name, uniform(NODES, 200.0, 0.0), handoff=(str(d), TOKEN))


# --- who may attach ----------------------------------------------------------------------------------
async def test_a_wrong_token_is_refused(private_dir, tmp_path, logs):
    async with cluster("hx1", private_dir) as c:
        for token in ("another-run-token", TOKEN[:-1], TOKEN + "x", "", TOKEN.upper()):
            await refused(c, logs, 0, frame(hello(token=token)), "wrong token")
        for token in (12345, None, [TOKEN], {"t": TOKEN}):  # not even a string
            await refused(c, logs, 0, frame(hello(token=token)), "wrong token")
        await refused(c, logs, 0, frame({k: v for k, v in hello().items() if k != "token"}), "wrong token")
        await sync_works(c, private_dir, tmp_path)


async def test_the_right_token_for_another_rank_is_refused(private_dir, tmp_path, logs):
    async with cluster("hx2", private_dir) as c:
        await refused(c, logs, 0, frame(hello(rank=1)), "rank 1 attached to the agent of rank 0")
        await refused(c, logs, 1, frame(hello(rank=0)), "rank 0 attached to the agent of rank 1")
        await refused(c, logs, 1, frame(hello(rank=True)), "hello.rank must be an integer")  # True == 1
        for rank in (-1, 1 << 17, "0", 0.0, None):
            await refused(c, logs, 0, frame(hello(rank=rank)), "hello.rank must be an integer")
        for pid in (0, -5, True, "1", None):  # a pid of at least 1 (True == 1)
            await refused(c, logs, 0, frame(hello(pid=pid)), "hello.pid must be an integer")
        await sync_works(c, private_dir, tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="a stranger of another uid needs root to become one")
async def test_a_stranger_of_another_uid_is_refused_by_its_credentials(private_dir, tmp_path, logs):
    """A process of uid 65534 with this run's token, this rank and a perfect hello is refused by the
    peer-credential check (SO_PEERCRED) alone: for this test only, the socket is chmod 0666 and its
    directory 0711, so the filesystem lets the stranger connect (the run's directory is 0700 and the
    socket 0600, which would stop it before the agent saw it)."""
    async with cluster("hx3", private_dir) as c:
        h = c.agents[0].handoff
        os.chmod(private_dir, 0o711)
        os.chmod(h.path, 0o666)
        before, count = len(logs.records), h.refused
        child = subprocess.Popen([sys.executable, "-c", STRANGER, str(h.path), frame(hello()).hex(), str(READ_S)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        await until(lambda: child.poll() is not None, "the stranger to exit", READ_S + 30)
        out, err = child.communicate()
        said = out.strip().splitlines()
        assert said[:2] == ["uid 65534 connected", "eof"], (out, err)  # it could connect; it was cut off
        assert said[2].startswith("reply "), (out, err)
        reply = bytes.fromhex(said[2].removeprefix("reply "))
        assert reply, f"the stranger got no answer: {out}"
        (n,) = HEADER.unpack(reply[:HEADER.size])
        msg = msgpack.unpackb(reply[HEADER.size:HEADER.size + n], raw=False)
        assert len(reply) == HEADER.size + n, "the stranger got more than a refusal"
        assert msg["t"] == "refused" and "runs as uid 65534, this run as uid 0" in msg["error"], msg
        assert [r.getMessage() for r in handoff_lines(logs, before)] == [
            f"node 0: hand-off channel: {msg['error']}; connection closed"]
        assert h.refused == count + 1 and h.script is None
        os.chmod(h.path, 0o600)
        os.chmod(private_dir, 0o700)
        await sync_works(c, private_dir, tmp_path)


async def test_the_socket_is_private_and_a_directory_open_to_others_is_refused():
    """The socket is 0600; the agent will not start in a directory open to others (or not its own)."""
    async def never(_layout: dict[str, Any]) -> tuple[bool, str, int]:
        raise AssertionError("nobody attaches here")

    with tempfile.TemporaryDirectory(prefix="wansync-hostile-") as d:
        os.chmod(d, 0o700)
        h = Handoff(socket_path(d, 0), TOKEN, 0, never)
        h.start()
        try:
            st = os.stat(h.path)
            assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        finally:
            h.close()
        if os.geteuid() == 0:  # private, but someone else's: its owner could swap the socket for its own
            os.chown(d, 65534, 65534)
            with pytest.raises(PermissionError, match="belongs to uid 65534"):
                Handoff(socket_path(d, 0), TOKEN, 0, never).start()
            assert not socket_path(d, 0).exists()
            os.chown(d, 0, 0)
        for mode in (0o755, 0o750, 0o705, 0o701, 0o710):
            os.chmod(d, mode)
            h = Handoff(socket_path(d, 0), TOKEN, 0, never)
            with pytest.raises(PermissionError, match=f"open to others \\(mode {mode:o}\\)"):
                h.start()
            assert not h.path.exists()
        os.chmod(d, 0o700)


# --- what arrives ----------------------------------------------------------------------------------------
async def test_garbage_is_refused(private_dir, tmp_path, logs):
    async with cluster("hx4", private_dir) as c:
        body = msgpack.packb(hello())
        for junk in (b"\xc1" * 10, b"\xa2\xff\xfe", body + b"\x00", body[:-1], b"GET / HTTP/1.1\r\n\r\n"):
            await refused(c, logs, 0, HEADER.pack(len(junk)) + junk, "not msgpack")
        for extra in (b"bytes", msgpack.ExtType(1, b"x"), {1: 2}):  # bin, ext, a map key that is not a string
            await refused(c, logs, 0, frame(hello(extra=extra)), "not msgpack")
        for msg in ([hello()], 7, "hello", {"token": TOKEN}, {"t": 1, **{k: v for k, v in hello().items()
                                                                          if k != "t"}}):
            await refused(c, logs, 0, frame(msg), "a message must be a map with a string 't'")
        peer = await connect(socket_path(private_dir, 0))  # a frame that ends early, the peer half-closed
        await asyncio.to_thread(peer.send, HEADER.pack(100) + b"\x00" * 10)
        peer.sock.shutdown(socket.SHUT_WR)
        await refused(c, logs, 0, None, "in the middle of a message", peer)
        await sync_works(c, private_dir, tmp_path)


async def test_a_frame_announcing_too_much_is_refused_before_it_is_read(private_dir, tmp_path, logs, monkeypatch):
    """Only the 4-byte header is sent: the refusal comes without the body (nothing read or allocated for
    it), and not from the hello timeout (made long here)."""
    monkeypatch.setattr(agent_handoff, "HELLO_TIMEOUT_S", 600.0)
    async with cluster("hx5", private_dir) as c:
        for n in (1 << 31, MAX_FRAME + 1, (1 << 32) - 1, 0):
            await refused(c, logs, 0, HEADER.pack(n), f"a frame announces {n} bytes")
        monkeypatch.undo()
        await sync_works(c, private_dir, tmp_path)


async def test_a_first_message_that_is_not_hello_is_refused(private_dir, tmp_path, logs):
    async with cluster("hx6", private_dir) as c:
        for t in ("step", "log", "bye", "welcome", "Hello"):  # all else a perfect hello
            await refused(c, logs, 0, frame(hello(t=t, k=0, metrics={}, steps=0)), "the first message must be hello")
        await sync_works(c, private_dir, tmp_path)


BAD_LAYOUTS = [  # (what is wrong, layout, the reason named)
    ("dtype int64", {**LAYOUT, "dtypes": ["float32", "int64"]}, "has dtype 'int64'"),
    ("dtype float64", {**LAYOUT, "dtypes": ["float64", "float32"]}, "has dtype 'float64'"),
    ("negative size", {**LAYOUT, "shapes": [[-1], [P + 1]]}, "has a shape that is not a list of sizes"),
    ("bool size", {**LAYOUT, "shapes": [[True], [P - 1]]}, "has a shape that is not a list of sizes"),
    ("float size", {**LAYOUT, "shapes": [[float(P - 10)], [10]]}, "has a shape that is not a list of sizes"),
    ("a size of 2^40", {**LAYOUT, "shapes": [[1 << 40], [10]]}, "has a shape that is not a list of sizes"),
    ("17 dimensions", {**LAYOUT, "shapes": [[1] * 17, [P]]}, "has a shape that is not a list of sizes"),
    ("a shape not a list", {**LAYOUT, "shapes": [P - 10, [10]]}, "has a shape that is not a list of sizes"),
    ("fewer shapes", {**LAYOUT, "shapes": [[P]]}, "must have the same length"),
    ("more dtypes", {**LAYOUT, "dtypes": ["float32"] * 3}, "must have the same length"),
    ("fewer names", {**LAYOUT, "names": ["w"]}, "must have the same length"),
    ("no tensors", {"names": [], "shapes": [], "dtypes": []}, "must have the same length"),
    ("too many tensors", {"names": ["a"] * (MAX_TENSORS + 1), "shapes": [[1]] * (MAX_TENSORS + 1),
                          "dtypes": ["float32"] * (MAX_TENSORS + 1)}, "must have the same length"),
    ("too many values", {**LAYOUT, "shapes": [[MAX_PARAMS], [1]]}, f"more than {MAX_PARAMS} values"),
    ("no values", {**LAYOUT, "shapes": [[0], [0]]}, "the model has no values"),
    ("a name not a string", {**LAYOUT, "names": ["w", 7]}, "a name must be a string"),
    ("a long name", {**LAYOUT, "names": ["w", "b" * 257]}, "a name must be a string"),
    ("lists missing", {"names": LAYOUT["names"], "shapes": LAYOUT["shapes"]}, "needs lists names, shapes, dtypes"),
    ("a tuple of lists", [LAYOUT["names"], LAYOUT["shapes"], LAYOUT["dtypes"]], "hello.layout must be a map"),
]


async def test_a_hello_with_a_bad_layout_is_refused(private_dir, tmp_path, logs):
    async with cluster("hx7", private_dir) as c:
        for what, layout, why in BAD_LAYOUTS:
            assert len(frame(hello(layout=layout))) < MAX_FRAME, what  # refused for its layout, not its size
            await refused(c, logs, 0, frame(hello(layout=layout)), why)
        await sync_works(c, private_dir, tmp_path)


# --- one script at a time -----------------------------------------------------------------------------------
async def test_a_second_script_is_refused_while_one_is_attached(private_dir, tmp_path, logs, monkeypatch):
    """One peer connects before the scripts attach and says its (perfect) hello only once they have:
    refused then (the check after the hello); another connects while they are attached: refused at once,
    naming the attached script's pid. The attached scripts go on and sync."""
    monkeypatch.setattr(agent_handoff, "HELLO_TIMEOUT_S", 600.0)
    async with cluster("hx8", private_dir) as c:
        h = c.agents[0].handoff
        peers = await attach_raw(c, pid=1)  # a script that says it is pid 1 is named by its real pid
        assert h.script.pid == os.getpid()
        await refused(c, logs, 0, None, f"rank 0 already has a script attached (pid {os.getpid()})")
        for node, peer in enumerate(peers):
            await bye(c, peer, node)
        early = await connect(h.path)
        await until(lambda: len(h._tasks) == 2, "the agent to serve the early peer")  # accept, and the peer

        async def meanwhile(procs: list[subprocess.Popen]) -> None:
            script = h.script
            assert script.pid == procs[0].pid
            await refused(c, logs, 0, frame(hello()), f"rank 0 already has a script attached (pid {procs[0].pid})")
            await refused(c, logs, 0, None, f"rank 0 already has a script attached (pid {procs[0].pid})")
            await refused(c, logs, 0, frame(hello()), "rank 0 already has a script attached", early)
            assert h.script is script and c.agents[1].handoff.script is not None
        await sync_works(c, private_dir, tmp_path, meanwhile)


# --- no hello -------------------------------------------------------------------------------------------------
async def test_a_peer_that_says_no_hello_in_time_is_refused(private_dir, tmp_path, logs, monkeypatch):
    monkeypatch.setattr(agent_handoff, "HELLO_TIMEOUT_S", 0.2)
    async with cluster("hx9", private_dir) as c:
        whole = frame(hello())
        for part in (None, whole[:2], whole[:HEADER.size], whole[:-1]):  # silent; a header, or a body, cut short
            await refused(c, logs, 0, part, "no hello in time")
        monkeypatch.undo()
        await sync_works(c, private_dir, tmp_path)


# --- an attached script that breaks the rules ---------------------------------------------------------------
async def test_a_step_out_of_order_closes_the_scripts_connection(private_dir, tmp_path, logs):
    async with cluster("hx10", private_dir) as c:
        await misbehaves(c, logs, [frame({"t": "step", "k": 1})], "step 1 announced, step 0 expected")
        await misbehaves(c, logs, [frame({"t": "step", "k": -1})], "step.k must be an integer")
        await misbehaves(c, logs, [frame({"t": "step", "k": "0"})], "step.k must be an integer")
        await misbehaves(c, logs, [frame({"t": "step"})], "step.k must be an integer")
        for sealed in (1, "yes", None, [True]):  # whether the script wrote the trailer: true or false only
            await misbehaves(c, logs, [frame({"t": "step", "k": 0, "sealed": sealed})], "step.sealed must be true")
        # a second step before the first is done (no job runs: `done 0` never comes)
        await misbehaves(c, logs, [frame({"t": "step", "k": 0}), frame({"t": "step", "k": 1})],
                         "step 1 announced while step 0 is not done")
        await misbehaves(c, logs, [frame({"t": "step", "k": 0}), frame({"t": "step", "k": 0})],
                         "step 0 announced while step 0 is not done")
        await sync_works(c, private_dir, tmp_path)


async def test_a_log_of_anything_but_finite_numbers_closes_the_scripts_connection(private_dir, tmp_path, logs):
    async with cluster("hx11", private_dir) as c:
        why = "log.metrics: names of at most 64 characters (not 't'), finite numbers as values"
        for metrics in ({"loss": float("nan")}, {"loss": float("inf")}, {"loss": 1.0, "lr": float("-inf")},
                        {"loss": "0.5"}, {"loss": True}, {"loss": None}, {"loss": [1.0]},
                        {"t": 1.0}, {"l" * 65: 1.0}):
            await misbehaves(c, logs, [frame({"t": "log", "metrics": {"ok": 1.0}}), frame({"t": "log",
                                                                                          "metrics": metrics})], why)
        many = {f"m{i}": 1.0 for i in range(MAX_METRICS + 1)}
        for metrics in (many, [1.0], 1.0, None):
            await misbehaves(c, logs, [frame({"t": "log", "metrics": metrics})],
                             f"log.metrics must be a map of at most {MAX_METRICS} numbers")
        for t in ("hello", "welcome", "evil"):  # what an attached script may not say
            await misbehaves(c, logs, [frame(hello(t=t))], f"unknown message {t!r}")
        await sync_works(c, private_dir, tmp_path)
