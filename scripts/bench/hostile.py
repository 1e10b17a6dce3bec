"""Hostile: a bounded attack set against a running cluster while rounds run (issue 12, "Hardening").

A scheduler here (authenticated with a secret this benchmark generates) and one `wansync agent`
process per internet2 node (`--hold-budget-mb 32`, application shaping), jobs of `--schemes` back
to back. After a short attack-free phase (the memory baseline), an attacker in a separate process
(forked first, so nothing it allocates counts as the scheduler's memory, and every liveness
judgement is made from outside) runs four classes of attack, each >= 50 attempts:

 preauth            connections that never authenticate: to the scheduler's control port and to
                    agents' data ports, a 4-byte length prefix announcing an 8 MiB header, then
                    silence; and a burst of 200 idle connections (alone, to count the log lines it
                    causes). One attempt = one connection.
 relay_hold         as an authenticated neighbour (the attacker holds the secret and claims to be
                    a topology neighbour of the victim, with a fresh epoch: it displaces the real
                    neighbour's connection until that one reconnects): CHUNK frames of 4 bytes
                    announcing a 256 MiB chunk of a job that does not exist, routed through the
                    victim; and complete 512 KiB chunks for round current+100000 of the running
                    job. Frames go one at a time, each only while the connection is still open
                    (a victim that refuses by closing gets a new session for the next frame).
                    One attempt = one frame written. On unfixed code every fresh chunk key costs
                    the victim 256 MiB for good: fresh keys stop once a victim grew 200 MiB, all
                    together 2 GiB, or the machine has < 4 GiB left; later relay frames repeat a
                    key the victim holds (counted in relay_reused_keys).
 malformed_control  on a control connection authenticated as an agent that never sends REGISTER:
                    REPORT with one-element samples, COUNTERS with non-numeric link keys,
                    HEARTBEAT with junk `stuck`, STATS with junk, each followed by a burst of
                    heartbeats. One attempt = one malformed message (the bursts are not counted).
 poison_view        same kind of connection: REPORTs about links not its own with NaN, negative or
                    infinite seconds or bytes (and absurd finite rates). One attempt = one REPORT.

Measured (the last stdout line is one JSON object):
 rounds_wrong        rounds recorded not ok, with digests or versions disagreeing, or whose digest
                     differs from the exact sum this benchmark computes itself (whole run)
 rounds_ok_pct       rounds ok among rounds started during the attacks (a round aborted, retried and
                     then exact counts as ok; `rounds_retried` counts those); a round started but
                     never recorded counts as not ok
 max_rss_growth_mib  VmRSS of the scheduler (this process) and of every agent, every 0.2 s: peak
                     during the attacks minus the highest level of the 3 s before them, worst process
 handler_deaths      observed from outside, for every connection an attack left open:
                     - authenticated control connection: after each message, a CLOCK request must
                       be answered within 1 s, or the connection be closed by the scheduler;
                     - idle pre-auth connection: closed by the server within its handshake timeout
                       (overlay.auth.HANDSHAKE_TIMEOUT_S) + 3 s, or, still open then, it answers a
                       HELLO with a HELLO within 1 s;
                     - pre-auth connection left mid-frame (8 MiB announced): closed within the
                       handshake timeout + 3 s (it cannot be probed);
                     - authenticated data connection: closed by the victim within 1 s of a probe
                       (refused, displaced by the real neighbour's reconnect, or after a burst of
                       MAX_INVALID + 8 frames of an unknown type, which a live handler counts as
                       invalid and disconnects); still open and silent = dead.
                     An agent process that exits during the run counts as a death too.
 attacks_by_class    attempts per class
 view_poisoned       any link rate in the scheduler's view non-finite or negative after the attacks
 log_lines_per_burst scheduler-process log records (WARNING and up) while 200 idle connections
                     were open until the last one closed (+0.5 s)
 live_guard_valid    the fidelity guard (wansync.guard.job_guard) on every job that finished;
                     false if any is not "valid" (invalid, unjudged, or the guard failed)

    python scripts/bench/hostile.py [--quick] [--seconds 300] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import multiprocessing as mp
import os
import re
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgpack
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (  # noqa: E402
    commit,
    die_with_parent,
    exit_on_sigterm,
    mem_available_mib,
    result_digest,
    rss_mib,
)
from hostile_logs import LogAttacks, agent_log_records, stop_runs, summarize_phases  # noqa: E402

from agents.workload import chunk_params, expected, model_params  # noqa: E402
from emulation.topology import internet2  # noqa: E402
from overlay import codec  # noqa: E402
from overlay.auth import HANDSHAKE_TIMEOUT_S, SECRET_ENV, AuthError, Handshake, generate_secret  # noqa: E402
from overlay.messages import ProtocolError, acked_keys, bitmap  # noqa: E402
from scheduler.service import JobState, Scheduler  # noqa: E402
from wansync.backend import agent_command  # noqa: E402
from wansync.cluster import agent_options_file  # noqa: E402
from wansync.guard import job_guard  # noqa: E402
from wansync.options import Options  # noqa: E402
from wansync.procs import reap  # noqa: E402
from wansync.runspec import resolve  # noqa: E402

CTX = mp.get_context("fork")  # forked before the parent starts any loop or thread
LEN = struct.Struct("!I")
CLASSES = ("preauth", "relay_hold", "malformed_control", "poison_view", "log_flood")
HUGE_HEADER = 8 << 20  # announced by a pre-auth length prefix (issue 12, item 1)
HUGE_TOTAL = 256 << 20  # announced chunk size of the relay frames (item 2)
FAR_AHEAD = 100_000  # rounds ahead of the running one (item 2)
FAKE_JOB = 2_000_000_000  # a job no scheduler ever runs
ANSWER_S = 1.0  # a live handler answers (or closes) within this
HELD_OPEN_MAX = 50  # dead control connections the attacker keeps open at once
STEP_S = 0.05  # after each hostile data frame: time for the victim to close before the next one goes
PREAUTH_GRACE_S = 3.0  # beyond the handshake timeout, for a pre-auth connection to be closed
HOLD_BUDGET_MB = 32
LOG_ATTACKS_S = 150.0  # at most, for the log attacks (two bursts and their quiet periods, 40,000 connections)
# the leak of item 2 is real on unfixed code (256 MiB per fresh chunk key, never freed): stop
# provoking fresh allocations once a victim grew this much, the agents together that much, or the
# machine runs short; later relay frames then reuse a chunk key the victim already holds
SAFE_VICTIM_GROWTH_MIB = 200.0
SAFE_TOTAL_GROWTH_MIB = 2048.0
SAFE_MEM_AVAILABLE_MIB = 4096.0


def frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """One wire frame, encoded here (not by overlay.codec) so the attacker can send what the codec refuses."""
    body = msgpack.packb(header, use_bin_type=True)
    return LEN.pack(len(body)) + body + payload


async def read_frame(reader: asyncio.StreamReader, max_header: int = 16 << 20) -> dict[str, Any] | None:
    """The next frame's header (its payload read and dropped); None at EOF, reset or garbage."""
    try:
        (n,) = LEN.unpack(await reader.readexactly(4))
        if not 0 < n <= max_header:
            return None
        h = msgpack.unpackb(await reader.readexactly(n), raw=False, strict_map_key=False)
        nbytes = h.get("nbytes", 0) if isinstance(h, dict) else 0
        while isinstance(nbytes, int) and nbytes > 0:
            got = await reader.read(min(nbytes, 1 << 20))
            if not got:
                return None
            nbytes -= len(got)
        return h if isinstance(h, dict) else {"t": "?"}
    except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError, msgpack.UnpackException):
        return None


async def until_eof(reader: asyncio.StreamReader) -> None:
    """Read (and drop) whatever comes until the peer closes."""
    try:
        while await reader.read(1 << 16):
            pass
    except (ConnectionError, OSError):
        pass


def close(writer: asyncio.StreamWriter | None) -> None:
    if writer is not None:
        try:
            writer.transport.abort()
        except Exception:  # already gone
            pass


# =============================================================================================
# The attacker (a forked process; it talks to the benchmark over a pipe)
# =============================================================================================
class Attacker:
    def __init__(self, ctrl: Connection, cfg: dict[str, Any]) -> None:
        self.ctrl = ctrl
        self.cfg = cfg
        self.cluster: str = cfg["cluster"]
        self.secret: bytes = cfg["secret"].encode()
        self.state: dict[str, Any] = cfg["state"]
        self.links: list[tuple[int, int]] = [tuple(x) for x in cfg["links"]]  # type: ignore[misc]
        self.attempts: Counter[str] = Counter({c: 0 for c in CLASSES})
        self.outcomes: dict[str, Counter[str]] = defaultdict(Counter)
        self.deaths: list[dict[str, Any]] = []
        self.bursts: list[dict[str, Any]] = []
        self.far_future_acked = 0
        self.relay_fresh = 0
        self.relay_reused = 0
        self.held_open: list[asyncio.StreamWriter] = []  # dead connections, kept open as an attacker would
        self.stopping = asyncio.Event()
        self._closed_at: list[float] = []  # when pre-auth connections were closed by their peer
        self._fresh_chunk: dict[int, int] = {}  # victim -> fresh relay chunks sent to it
        self._relay_as: dict[int, tuple[int, int]] = {}  # victim -> (neighbour we claim, next hop)
        self._epochs = itertools.count(time.time_ns())
        self.spared: set[int] = set()  # agents the other attacks leave alone (the distinct-reasons victim)

    # --- plumbing -----------------------------------------------------------------------------
    def on_pipe(self) -> None:
        while self.ctrl.poll():
            try:
                kind, data = self.ctrl.recv()
            except EOFError:
                self.stopping.set()
                return
            if kind == "state":
                self.state = data
            elif kind == "stop":
                self.stopping.set()

    def tell(self, kind: str, data: Any) -> None:
        try:
            self.ctrl.send((kind, data))
        except (OSError, EOFError):
            pass

    def death(self, cls: str, target: str, what: str) -> None:
        self.deaths.append({"class": cls, "target": target, "what": what, "t": time.time()})
        self.outcomes[cls]["dead"] += 1

    def agents(self) -> dict[int, tuple[str, int, list[int]]]:
        """The agents to attack (all but those spared for a measurement of their own)."""
        return {int(n): (a[0], int(a[1]), [int(x) for x in a[2]]) for n, a in self.state["agents"].items()
                if int(n) not in self.spared}

    def epoch(self) -> int:
        return next(self._epochs) + 1_000_000  # fresher than any incarnation that exists

    async def pace(self, t_next: float) -> bool:
        """Sleep until t_next (or stop); False once the attack is being stopped."""
        delay = t_next - time.time()
        if delay > 0:
            try:
                await asyncio.wait_for(self.stopping.wait(), delay)
            except TimeoutError:
                pass
        return not self.stopping.is_set()

    # --- class 1: before authentication ---------------------------------------------------------
    async def preauth_conn(self, host: str, port: int, first: bytes, target: str, *,
                           hello_as: int | None = None) -> tuple[str, float | None]:
        """One connection that never authenticates; returns (outcome, seconds until the peer closed)."""
        self.attempts["preauth"] += 1
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
        except (OSError, TimeoutError):
            self.outcomes["preauth"]["refused at connect"] += 1
            return "refused", 0.0
        t0 = time.time()
        try:
            if first:
                writer.write(first)
            try:
                await asyncio.wait_for(until_eof(reader), HANDSHAKE_TIMEOUT_S + PREAUTH_GRACE_S)
                self._closed_at.append(time.time())
                self.outcomes["preauth"]["closed by peer"] += 1
                return "closed", time.time() - t0
            except TimeoutError:
                pass
            if hello_as is None:  # mid-frame: nothing to probe; a live server ends it at its timeout
                self.death("preauth", target, f"still open {time.time() - t0:.0f} s after an unfinished "
                                              f"{len(first)}-byte frame start")
                return "dead", None
            hs = Handshake(self.cluster, hello_as, "agent", dialer=True, secret=self.secret,
                           hello_extra={"epoch": self.epoch()})
            writer.write(frame(hs.start()))
            try:
                h = await asyncio.wait_for(read_frame(reader), ANSWER_S)
            except TimeoutError:
                self.death("preauth", target, "idle connection still open after the handshake timeout and "
                                              "silent to a HELLO")
                return "dead", None
            self.outcomes["preauth"]["answered HELLO" if h is not None else "closed by peer"] += 1
            return "answered" if h is not None else "closed", None
        finally:
            close(writer)

    async def idle_burst(self, n: int) -> None:
        """n idle connections to the scheduler at once (alone: the benchmark counts the log lines)."""
        host, port = self.cfg["sched"]
        t0 = time.time()
        res = await asyncio.gather(*(self.preauth_conn(host, port, b"", "scheduler", hello_as=i % self.cfg["nodes"])
                                     for i in range(n)))
        closes = [s for o, s in res if o in ("closed", "refused") and s is not None]
        t1 = max(self._closed_at, default=t0) if len(closes) == n else time.time()
        rec = {"n": n, "t0": t0, "t1": t1, "closed": len(closes), "first_close_s": min(closes, default=None),
               "last_close_s": max(closes, default=None), "outcomes": dict(Counter(o for o, _ in res))}
        self.bursts.append(rec)
        self.tell("burst", rec)

    async def preauth_waves(self, waves: int, sched_per_wave: int, agent_victims: int, seconds: float) -> None:
        """Waves of 8 MiB length prefixes at the scheduler, and prefixes plus idle connections at agents."""
        host, port = self.cfg["sched"]
        tasks: list[asyncio.Task] = []
        t0 = time.time()
        for w in range(waves):
            if not await self.pace(t0 + w * seconds / waves):
                break
            for _ in range(sched_per_wave):
                tasks.append(asyncio.ensure_future(
                    self.preauth_conn(host, port, LEN.pack(HUGE_HEADER), "scheduler")))
            agents = self.agents()
            for i in range(agent_victims):
                v = sorted(agents)[(w * agent_victims + i) % len(agents)]
                ahost, aport, nbrs = agents[v]
                tasks.append(asyncio.ensure_future(
                    self.preauth_conn(ahost, aport, LEN.pack(HUGE_HEADER), f"agent {v}")))
                tasks.append(asyncio.ensure_future(
                    self.preauth_conn(ahost, aport, b"", f"agent {v}", hello_as=nbrs[w % len(nbrs)])))
        await asyncio.gather(*tasks)

    # --- class 2: relay and hold allocation as an authenticated neighbour ------------------------
    def fresh_allowed(self, victim: int) -> bool:
        growth = {int(k): v for k, v in self.state.get("growth_mib", {}).items()}
        return (growth.get(victim, 0.0) < SAFE_VICTIM_GROWTH_MIB
                and sum(g for g in growth.values() if g > 0) < SAFE_TOTAL_GROWTH_MIB
                and self.state.get("mem_available_mib", math.inf) > SAFE_MEM_AVAILABLE_MIB)

    def relay_chunk(self, victim: int) -> tuple[int, bool]:
        """A fresh chunk index (a new key: on unfixed code a new 256 MiB), or, past the safety limits,
        chunk 0 again: a key the victim already holds (the same claimed neighbour and next hop)."""
        if self.fresh_allowed(victim):
            chunk = self._fresh_chunk.get(victim, 0)
            self._fresh_chunk[victim] = chunk + 1
            self.relay_fresh += 1
            return chunk, True
        self._fresh_chunk.setdefault(victim, 1)
        return 0, False

    def relay_frame(self, victim: int, me: int, nxt: int, chunk: int) -> bytes:
        h = {"t": "CHUNK", "job": FAKE_JOB, "task": 0, "attempt": 0, "version": 1, "chunk": chunk, "kind": "agg",
             "origin": me, "contributors": bitmap([me]), "t_send": time.time(), "path": [me, victim, nxt],
             "hop": 0, "off": 0, "total": HUGE_TOTAL, "nbytes": 4}
        return frame(h, b"\0\0\0\0")

    def future_frame(self, victim: int, me: int, idx: int, size: int, payload: bytes) -> bytes:
        st = self.state
        h = {"t": "CHUNK", "job": st["job"], "task": st["round"] + FAR_AHEAD, "attempt": 0,
             "version": st["version"], "chunk": idx, "kind": "agg", "origin": me, "contributors": bitmap([me]),
             "t_send": time.time(), "path": [me, victim], "hop": 0, "off": 0, "total": size, "nbytes": size}
        return frame(h, payload)

    async def data_session(self, victim: int, me: int, nxt: int, kinds: list[str], idx: int,
                           future_bytes: bytes) -> int:
        """Authenticate to `victim` as its neighbour `me`; send one hostile frame per kind, each only
        while the connection is still open (the victim may refuse, or the real neighbour reconnect
        and displace us); probe what is left open. Returns the frames sent (attempts)."""
        host, port, _ = self.agents()[victim]
        target = f"agent {victim} as {me}"
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
        except (OSError, TimeoutError):
            self.outcomes["relay_hold"]["connect failed"] += 1
            return 0
        acks: list[tuple] = []
        sent = 0
        try:
            hs = Handshake(self.cluster, me, "agent", dialer=True, secret=self.secret, expect=victim,
                           peer_role="agent", hello_extra={"epoch": self.epoch()})
            writer.write(frame(hs.start()))
            try:
                async with asyncio.timeout(5.0):
                    while not hs.done:
                        h = await read_frame(reader)
                        if h is None:
                            raise AuthError("closed during the handshake")
                        for reply in hs.receive(h):
                            writer.write(frame(reply))
            except (AuthError, ProtocolError, KeyError, TimeoutError) as exc:
                self.outcomes["relay_hold"][f"handshake refused ({type(exc).__name__})"] += 1
                return 0
            eof = asyncio.Event()

            async def drain() -> None:  # what the victim sends its "neighbour": data, ACKs
                while (h := await read_frame(reader)) is not None:
                    if h.get("t") in ("ACK", "ACKS"):
                        acks.extend(acked_keys(h))
                eof.set()
            drainer = asyncio.ensure_future(drain())
            chunk: int | None = None
            for kind in kinds:
                if eof.is_set():
                    break
                if kind == "relay":
                    if chunk is None:  # at most one fresh key per session: a second relay frame repeats it
                        chunk, fresh = self.relay_chunk(victim)
                        self.relay_reused += not fresh
                    else:
                        self.relay_reused += 1
                    data = self.relay_frame(victim, me, nxt, chunk)
                else:
                    data = self.future_frame(victim, me, idx + sent, len(future_bytes), future_bytes)
                try:
                    writer.write(data)
                    await asyncio.wait_for(writer.drain(), 5.0)
                except (ConnectionError, OSError, TimeoutError):
                    break
                sent += 1
                self.attempts["relay_hold"] += 1
                self.outcomes["relay_hold"][f"{kind} frames"] += 1
                try:  # the victim's answer to this frame, if it closes: before the next one goes
                    await asyncio.wait_for(eof.wait(), STEP_S)
                except TimeoutError:
                    pass
            if eof.is_set():
                self.outcomes["relay_hold"]["closed by victim"] += 1
            else:
                probe = frame({"t": "HOSTILE_PROBE", "n": 0}) * (codec.MAX_INVALID + 8)
                try:
                    writer.write(probe)
                except (ConnectionError, OSError):
                    pass
                t_probe = time.time()
                try:
                    await asyncio.wait_for(eof.wait(), ANSWER_S)
                    self.outcomes["relay_hold"]["closed after probe"] += 1
                except TimeoutError:
                    try:  # dead all the same; how late (if at all) says whether it was frozen or gone
                        await asyncio.wait_for(eof.wait(), 5.0)
                        late = f"closed only after {time.time() - t_probe:.1f} s"
                    except TimeoutError:
                        late = "still open after 6 s"
                    self.death("relay_hold", target, f"open and silent 1 s after an invalid-frame probe ({late})")
            drainer.cancel()
        finally:
            close(writer)
            far = [k for k in acks if k[1] >= FAR_AHEAD]  # k: a chunk key (job, task, ...)
            self.far_future_acked += len(far)
            if far:
                self.outcomes["relay_hold"]["far-future frames acknowledged"] += len(far)
        return sent

    async def relay_hold(self, target: int, seconds: float, future_size: int) -> None:
        """Sessions until `target` frames went out, paced evenly over `seconds` (per frame)."""
        payload = bytes(future_size)
        t0 = time.time()
        for s in itertools.count():
            if self.attempts["relay_hold"] >= target or time.time() > t0 + seconds + 10:
                break
            if not await self.pace(t0 + self.attempts["relay_hold"] * seconds / target):
                break
            agents = self.agents()
            victims = sorted(agents)
            v = victims[s % len(victims)]
            nbrs = sorted(agents[v][2])
            if v not in self._relay_as:  # always the same claimed neighbour: repeated keys stay the same
                me = nbrs[s % len(nbrs)]
                self._relay_as[v] = (me, next((n for n in nbrs if n != me), me))
            me, nxt = self._relay_as[v]
            kinds = ["relay", "future"] * 2 if s % 2 == 0 else ["future", "relay"] * 2
            self.outcomes["relay_hold"]["sessions"] += 1
            await self.data_session(v, me, nxt, kinds[:target - self.attempts["relay_hold"]], idx=4 * s,
                                    future_bytes=payload)

    # --- classes 3 and 4: authenticated control connections that never register -----------------
    async def ctl_open(self, node: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        host, port = self.cfg["sched"]
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
        except (OSError, TimeoutError):
            return None
        hs = Handshake(self.cluster, node, "agent", dialer=True, secret=self.secret, peer_role="scheduler",
                       hello_extra={"epoch": self.epoch()})
        try:
            writer.write(frame(hs.start()))
            async with asyncio.timeout(5.0):
                while not hs.done:
                    h = await read_frame(reader)
                    if h is None:
                        raise AuthError("closed during the handshake")
                    for reply in hs.receive(h):
                        writer.write(frame(reply))
        except (AuthError, ProtocolError, KeyError, TimeoutError, ConnectionError, OSError):
            close(writer)
            return None
        return reader, writer

    @staticmethod
    async def clock_probe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
        """'answered' (a CLOCK reply within 1 s), 'closed' (by the scheduler) or 'silent'."""
        t0 = time.time() + secrets.randbelow(1 << 20) * 1e-9
        try:
            writer.write(frame({"t": "CLOCK", "t0": t0}))
        except (ConnectionError, OSError):
            return "closed"
        try:
            async with asyncio.timeout(ANSWER_S):
                while True:
                    h = await read_frame(reader)
                    if h is None:
                        return "closed"
                    if h.get("t") == "CLOCK" and h.get("t0") == t0:
                        return "answered"
        except TimeoutError:
            return "silent"

    async def ctl_campaign(self, cls: str, items: list[tuple[int, dict[str, Any]]], seconds: float,
                           heartbeats: int) -> None:
        """Send each (node, message) on a connection authenticated as that node, then probe it."""
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        conn_node = -1
        t0 = time.time()
        bursts: dict[int, bytes] = {}
        for i, (node, msg) in enumerate(items):
            if not await self.pace(t0 + i * seconds / len(items)):
                break
            if conn is None or conn_node != node:
                if conn is not None:
                    close(conn[1])
                conn, conn_node = await self.ctl_open(node), node
                if conn is None:
                    self.outcomes[cls]["handshake refused"] += 1
                    continue
            reader, writer = conn
            if "time" in msg:
                msg["time"] = time.time()
            if msg["t"] == "STATS":  # the running job's stats are what the junk would replace
                msg["job"] = self.state["job"]
            try:
                writer.write(frame(msg))
                self.attempts[cls] += 1
                if heartbeats:
                    if node not in bursts:
                        beat = {"t": "HEARTBEAT", "node": node, "time": time.time(), "rx": 0}
                        bursts[node] = frame(beat) * heartbeats
                    writer.write(bursts[node])
                    await asyncio.wait_for(writer.drain(), 5.0)
            except (ConnectionError, OSError, TimeoutError):
                pass
            verdict = await self.clock_probe(reader, writer)
            self.outcomes[cls][f"{msg['t']} then {verdict}"] += 1
            if verdict == "silent":
                self.death(cls, f"scheduler (as agent {node})", f"{msg['t']} {_short(msg)}: no CLOCK answer in 1 s")
                self.held_open.append(writer)  # an attacker keeps it open: does it cost the scheduler?
                if len(self.held_open) > HELD_OPEN_MAX:  # bounded: the oldest goes
                    close(self.held_open.pop(0))
                conn = None
            elif verdict == "closed":
                close(writer)
                conn = None
        if conn is not None:
            close(conn[1])

    def malformed_items(self, n: int) -> list[tuple[int, dict[str, Any]]]:
        nodes = self.cfg["nodes"]
        out: list[tuple[int, dict[str, Any]]] = []
        samples: list[list[Any]] = [[1], [0, 1], [], ["x"], [2, 3, 4]]
        links: list[dict[Any, Any]] = [{"x": 1}, {"1": "many"}, {None: 1}, {"2": [1]}, {"1.5e3x": 7}]
        stuck: list[list[Any]] = [["junk"], [[1]], [[1, "x"]], [["a", 1.0]], [[1, 2, 3]]]
        stats: list[dict[str, Any]] = [{"links": "junk"}, {"links": {"1": 5}}, {"wall_s": "x", "cpu_s": None},
                                       {"links": [], "loop_lag_p99_s": "slow"}, {}]
        for i in range(n):
            k, v = i // 8 % nodes, i // 4 % 5  # 8 messages per connection (while it lives)
            t = time.time()
            msg: dict[str, Any] = [
                {"t": "REPORT", "node": k, "samples": [samples[v]]},
                {"t": "COUNTERS", "node": k, "time": t, "links": links[v]},
                {"t": "HEARTBEAT", "node": k, "time": t, "rx": 0, "stuck": stuck[v]},
                {"t": "STATS", "node": k, "job": self.state["job"], "stats": stats[v]},
            ][i % 4]
            out.append((k, msg))
        return out

    def poison_items(self, n: int) -> list[tuple[int, dict[str, Any]]]:
        nodes = self.cfg["nodes"]
        nan, inf = float("nan"), float("inf")
        values: list[tuple[Any, Any]] = [(1_000_000, nan), (1_000_000, -1.0), (1_000_000, inf), (-1_000_000, 0.01),
                                         (nan, 0.01), (inf, 0.01), (1e12, 1e-3), (1_000_000, -inf)]
        out: list[tuple[int, dict[str, Any]]] = []
        for i in range(n):
            k = i // 16 % nodes  # 16 per connection: past a tolerance of MAX_INVALID invalid messages
            foreign = [ln for ln in self.links if k not in ln]
            a, b = foreign[i % len(foreign)]
            nbytes, seconds = values[i % len(values)]
            out.append((k, {"t": "REPORT", "node": k, "samples": [[a, b, nbytes, seconds]]}))
        return out

    # --- the run ----------------------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.ctrl.fileno(), self.on_pipe)
        c = self.cfg
        t_start = time.time()
        flood = LogAttacks(self.tell)
        # issue 38: 40,000 connections with distinct reasons to one agent (from a process of its own),
        # alongside the idle and varied bursts, before the other attacks; those spare it, and a control
        # agent (its memory drifts the same way with the rounds, unattacked)
        addrs = {n: (h, p) for n, (h, p, _) in self.agents().items()}
        a, b, victim, control = sorted(addrs)[:4]
        self.spared.update((victim, control))
        distinct = asyncio.ensure_future(flood.distinct(addrs[victim], victim, control))
        try:
            await self.idle_burst(c["burst"])
            await asyncio.sleep(1.0)  # the burst's log lines are counted up to 0.5 s after its last close
            # varied bursts and a second burst after a quiet period, at the scheduler and two agents
            await flood.bursts(tuple(c["sched"]), addrs, a, b)
            await distinct  # alone at the end: together with the rest, the machine (2 cores) cannot keep up
            await asyncio.sleep(2.5)  # the victim's memory is read after the attack
            seconds = c["seconds"]
            per = c["per_class"]
            await asyncio.gather(
                self.preauth_waves(c["waves"], c["sched_per_wave"], c["agent_victims"], seconds * 0.8),
                self.relay_hold(per, seconds, c["future_bytes"]),
                self.ctl_campaign("malformed_control", self.malformed_items(per), seconds, c["heartbeats"]),
                self.ctl_campaign("poison_view", self.poison_items(per), seconds, 0),
            )
        finally:
            distinct.cancel()
            await asyncio.gather(distinct, return_exceptions=True)
            self.attempts["log_flood"] += flood.attempts
            for w in self.held_open:
                close(w)
            loop.remove_reader(self.ctrl.fileno())
        self.tell("result", {
            "attempts": dict(self.attempts), "outcomes": {k: dict(v) for k, v in self.outcomes.items()},
            "deaths": self.deaths, "bursts": self.bursts, "far_future_acked": self.far_future_acked,
            "relay_fresh_keys": self.relay_fresh, "relay_reused_keys": self.relay_reused,
            "held_open": len(self.held_open), "t_start": t_start, "t_end": time.time()})


def _short(msg: dict[str, Any]) -> str:
    body = {k: v for k, v in msg.items() if k not in ("t", "node", "time")}
    return json.dumps(body, default=str)[:60]


def attacker_main(ctrl: Connection) -> None:
    """The forked attacker: waits for its orders, attacks, reports; dies with the benchmark."""
    die_with_parent()
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        msg = ctrl.recv()
    except EOFError:
        return
    if msg[0] != "attack":
        return
    try:
        asyncio.run(Attacker(ctrl, msg[1]).run())
    except Exception as exc:  # say so: the benchmark reports a crashed attacker instead of waiting
        import traceback
        traceback.print_exc()
        try:
            ctrl.send(("crashed", f"{type(exc).__name__}: {exc}"))
        except (OSError, EOFError):
            pass


# =============================================================================================
# The benchmark: scheduler, agents, rounds, measurements
# =============================================================================================
class LogTap(logging.Handler):
    """Every log record of this process (the scheduler's), kept for counting."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[tuple[float, str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:
            msg = str(record.msg)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            msg += f" [{type(exc).__name__}: {str(exc)[:80]}]"
        self.records.append((record.created, record.name, record.levelno, msg))


class Hostile:
    def __init__(self, args: argparse.Namespace, attacker: Connection, secret: str, tap: LogTap) -> None:
        self.args = args
        self.attacker = attacker
        self.tap = tap
        self.t_begin = time.time()
        self.topo = internet2(seed=args.seed).scaled(args.scale)
        self.params, self.chunk = model_params(args.model, args.scale), chunk_params(args.scale)
        self.secret = secret
        self.cluster = "hostile-" + secret[:8]
        self.jobs: list[JobState] = []
        self.sched = Scheduler(self.cluster, self.topo.nodes, secret=secret.encode(), on_event=self.on_event)
        self.procs: dict[int, subprocess.Popen] = {}
        self.logdir = Path(tempfile.mkdtemp(prefix="wansync-hostile-"))
        self.rss: list[tuple[float, dict[str, float]]] = []
        self.base: dict[str, float] = {}
        self.started_seen: dict[tuple[int, int], float] = {}
        self.lag_max = 0.0
        self.attack_window: tuple[float, float] | None = None
        self.attack_started: float | None = None
        self.result: dict[str, Any] | None = None
        self.bursts: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []  # the log attacks' bursts (hostile_logs.py)
        self.crashed: str | None = None
        self.job_errors: list[str] = []
        self.exited: dict[int, int] = {}
        self.stop_jobs = asyncio.Event()
        self.result_in = asyncio.Event()
        self.quiet_before: Callable[[], bool] | None = None  # the attacks wait for it (the stopped runs' end)

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "job" and self.sched.current is not None:
            self.jobs.append(self.sched.current)

    # --- processes ------------------------------------------------------------------------------
    def spawn(self, port: int) -> None:
        cfg = resolve(Options.make(topology="internet2", schemes=self.args.schemes, workload__model=self.args.model,
                                   scale=self.args.scale, rounds=self.args.rounds, seed=self.args.seed,
                                   hold_budget_mb=float(HOLD_BUDGET_MB)))
        options_file = agent_options_file(cfg, self.cluster)
        for n in range(self.topo.nodes):
            err = (self.logdir / f"agent{n}.log").open("w")
            self.procs[n] = subprocess.Popen(agent_command(options_file, n, f"127.0.0.1:{port}"),
                                             env={**os.environ, SECRET_ENV: self.secret},
                                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
            err.close()

    async def wait_agents(self) -> None:
        task = asyncio.ensure_future(self.sched.wait_agents(90))
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead and not task.done():
                task.cancel()
                raise RuntimeError(f"agents {dead} exited before registering (logs: {self.logdir})")
        task.result()

    # --- background: rounds, samples -------------------------------------------------------------
    async def job_loop(self) -> None:
        for i in itertools.count():
            if self.stop_jobs.is_set():
                return
            scheme = self.args.schemes[i % len(self.args.schemes)]
            try:
                await self.sched.run_job(scheme, rounds=self.args.rounds, params=self.params,
                                         chunk_params=self.chunk)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a poisoned view can make planning fail: say so, try again
                self.job_errors.append(f"{scheme}: {type(exc).__name__}: {exc}")
                await asyncio.sleep(0.5)

    def push_state(self) -> None:
        js = self.sched.current
        rnd = 0
        if js is not None:
            rnd = max([*js.started, *(r.round + 1 for r in js.records[-3:])], default=0)
        growth: dict[int, float] = {}
        if self.base and self.rss:
            last = self.rss[-1][1]
            growth = {n: last.get(f"agent {n}", 0.0) - self.base.get(f"agent {n}", 0.0) for n in self.procs}
        state = {"job": js.job if js else 0, "round": rnd, "version": js.plan.version if js else 0,
                 "agents": {n: [a.host, a.port, list(a.neighbors)] for n, a in self.sched.agents.items()},
                 "growth_mib": growth, "mem_available_mib": mem_available_mib()}
        try:
            self.attacker.send(("state", state))
        except (OSError, EOFError):
            pass

    async def sampler(self) -> None:
        tick = 0.2
        last = time.perf_counter()
        while True:
            await asyncio.sleep(tick)
            now = time.perf_counter()
            lag, last = now - last - tick, now
            t = time.time()
            if self.attack_started is not None and self.attack_window is None:
                self.lag_max = max(self.lag_max, lag)
            row: dict[str, float] = {}
            if (r := rss_mib()) is not None:
                row["scheduler"] = r
            for n, p in self.procs.items():
                if p.poll() is not None:
                    self.exited.setdefault(n, p.returncode)
                elif (r := rss_mib(p.pid)) is not None:
                    row[f"agent {n}"] = r
            self.rss.append((t, row))
            js = self.sched.current
            if js is not None:
                for rnd in js.started:
                    self.started_seen.setdefault((js.job, rnd), t)
            if self.attack_started is not None and not self.result_in.is_set():
                self.push_state()

    def on_attacker(self) -> None:
        while self.attacker.poll():
            try:
                kind, data = self.attacker.recv()
            except (EOFError, OSError):
                if self.result is None:
                    self.crashed = self.crashed or "the attacker process went away"
                self.result_in.set()
                asyncio.get_running_loop().remove_reader(self.attacker.fileno())
                return
            if kind == "burst":
                self.bursts.append(data)
            elif kind == "phase":
                self.phases.append(data)
            elif kind == "result":
                self.result = data
                self.result_in.set()
            elif kind == "crashed":
                print(f"hostile: the attacker crashed: {data}", file=sys.stderr)
                self.crashed = data
                self.result_in.set()

    # --- the run ----------------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        a = self.args
        port = await self.sched.start()
        self.spawn(port)
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task] = []
        jobs: asyncio.Task | None = None
        try:
            await self.wait_agents()
            tasks.append(asyncio.ensure_future(self.sampler()))
            jobs = asyncio.ensure_future(self.job_loop())
            # attack-free phase: a few rounds, and the memory level the growth is measured from
            t0 = time.time()
            while (time.time() - t0 < a.baseline_s or sum(len(js.records) for js in self.jobs) < 3
                   or (self.quiet_before is not None and not self.quiet_before() and time.time() - t0 < 90)):
                if time.time() - t0 > 60 and sum(len(js.records) for js in self.jobs) < 3:
                    raise RuntimeError("no rounds completed within 60 s before the attacks")
                if jobs.done():
                    jobs.result()
                await asyncio.sleep(0.2)
            base_rounds = sum(len(js.records) for js in self.jobs)
            base_s = time.time() - t0
            self.attack_started = time.time()
            self.base = self.baseline(self.attack_started)
            loop.add_reader(self.attacker.fileno(), self.on_attacker)
            per = a.per_class
            self.attacker.send(("attack", {
                "cluster": self.cluster, "secret": self.secret, "sched": ["127.0.0.1", port],
                "nodes": self.topo.nodes, "links": sorted(self.topo.links), "state": self.state_now(),
                "burst": a.burst, "seconds": a.seconds, "per_class": per,
                "waves": max(1, math.ceil(per / (a.sched_per_wave + 2 * a.agent_victims))),
                "sched_per_wave": a.sched_per_wave, "agent_victims": a.agent_victims,
                "future_bytes": a.future_kib * 1024, "heartbeats": a.heartbeats}))
            budget = a.burst_s_max + a.seconds * 1.5 + HANDSHAKE_TIMEOUT_S + PREAUTH_GRACE_S + 20 + LOG_ATTACKS_S
            try:
                await asyncio.wait_for(self.result_in.wait(), budget)
            except TimeoutError:
                self.crashed = f"the attacker did not finish within {budget:.0f} s"
                self.attacker.send(("stop", None))
                try:
                    await asyncio.wait_for(self.result_in.wait(), 10)
                except TimeoutError:
                    pass
            await asyncio.sleep(1.0)  # the last samples after the attacks
            self.attack_window = (self.attack_started, time.time())
            view = self.view_check()
            # rounds started during the attacks get the time to end; no new job starts
            self.stop_jobs.set()
            grace = max(5.0, min(a.drain_s, a.deadline_s - (time.time() - self.t_begin) - 15))
            done, _ = await asyncio.wait({jobs}, timeout=grace)
            abandoned = not done
            if abandoned:
                jobs.cancel()
            elif jobs.exception() is not None:
                self.job_errors.append(f"job loop: {jobs.exception()!r}")
            return self.summarize(view, abandoned, base_rounds / base_s if base_s else 0.0)
        finally:
            for t in tasks:
                t.cancel()
            if jobs is not None and not jobs.done():
                jobs.cancel()
            await asyncio.gather(*tasks, *([jobs] if jobs else []), return_exceptions=True)
            try:
                self.attacker.send(("stop", None))
            except (OSError, EOFError):
                pass
            await self.sched.shutdown()
            reap(list(self.procs.values()))
            if not self.args.keep_logs:
                shutil.rmtree(self.logdir, ignore_errors=True)

    def state_now(self) -> dict[str, Any]:
        js = self.sched.current
        return {"job": js.job if js else 0, "round": max(js.started, default=0) if js else 0,
                "version": js.plan.version if js else 0,
                "agents": {n: [x.host, x.port, list(x.neighbors)] for n, x in self.sched.agents.items()},
                "growth_mib": {}, "mem_available_mib": mem_available_mib()}

    def baseline(self, t: float) -> dict[str, float]:
        """Per process: the highest level of the 3 s before the attacks (rounds come and go)."""
        out: dict[str, float] = {}
        for ts, row in self.rss:
            if t - 3.0 <= ts <= t:
                for k, v in row.items():
                    out[k] = max(out.get(k, 0.0), v)
        return out

    def view_check(self) -> dict[str, Any]:
        bad, top = [], 0.0
        for u, v, rate in self.sched.view.g.edges(data="rate"):
            if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 0:
                bad.append(f"{u}->{v} {rate}")
            else:
                top = max(top, rate)
        return {"poisoned": bad, "max_rate_mbps": top}

    # --- results ------------------------------------------------------------------------------------
    def own_digests(self) -> Callable[[Any], str | None]:
        """This benchmark's own exact sum per (round, participants, weights): the digest a round must show."""
        cache: dict[tuple, str] = {}

        def want(rec: Any) -> str | None:
            plan = self.sched.plans.get(rec.version)
            if plan is None:
                return None
            key = (rec.round, tuple(plan.participants), tuple(sorted(plan.weights.items())))
            if key not in cache:
                total = expected(rec.round, 0, plan.participants, self.params, plan.weights)
                cache[key] = result_digest(total)
            return cache[key]
        return want

    def summarize(self, view: dict[str, Any], abandoned: bool, base_rps: float) -> dict[str, Any]:
        assert self.attack_window is not None
        w0, w1 = self.attack_window
        want = self.own_digests()
        recs = [(js, r) for js in self.jobs for r in js.records]
        wrong, mismatch = [], 0
        for _js, r in recs:
            digest = want(r)
            theirs = getattr(r, "digests", None)  # older schedulers keep only digests_agree
            mine = digest is None or not theirs or set(theirs.values()) == {digest}
            mismatch += not mine
            if not (r.ok and r.digests_agree and r.versions_agree and mine):
                wrong.append(r)
        started: dict[tuple[int, int], Any] = {k: None for k, t in self.started_seen.items() if w0 <= t <= w1}
        for js, r in recs:
            if w0 <= r.t_start <= w1 or (js.job, r.round) in started:
                started[(js.job, r.round)] = r
        ok = [r for r in started.values() if r is not None and r not in wrong]
        retried = sum(1 for r in started.values() if r is not None and r.attempt > 0)
        unfinished = sum(1 for r in started.values() if r is None)
        aborts = sum(1 for js in self.jobs for x in js.aborts if w0 <= x["t"] <= w1)
        # memory: peak during the attacks minus the level before, per process
        growth: dict[str, float] = {}
        for ts, row in self.rss:
            if w0 <= ts <= w1:
                for k, v in row.items():
                    growth[k] = max(growth.get(k, -math.inf), v - self.base.get(k, v))
        growth = {k: round(max(0.0, g), 1) for k, g in growth.items()}
        res = self.result or {}
        attempts = res.get("attempts", {c: 0 for c in CLASSES})
        deaths = list(res.get("deaths", []))
        for n, rc in sorted(self.exited.items()):
            deaths.append({"class": "agent process", "target": f"agent {n}", "what": f"exited with code {rc}"})
        burst = self.bursts[0] if self.bursts else None
        burst_lines = None
        if burst is not None:
            burst_lines = sum(1 for t, _, lvl, _ in self.tap.records
                              if burst["t0"] <= t <= burst["t1"] + 0.5 and lvl >= logging.WARNING)
        guard, guard_notes = self.guard()
        agent_lines = refusals = 0
        for f in self.logdir.glob("agent*.log"):
            for line in f.read_text(errors="replace").splitlines():
                if " WARNING " in line or " ERROR " in line:
                    agent_lines += 1
                    refusals += "refus" in line
        lost = sum(1 for e in self.sched.timeline if e["kind"] == "agent_lost" and w0 <= e["t"] <= w1)
        never_retrieved = sum(1 for _, name, _, m in self.tap.records if "never retrieved" in m)
        window_s = w1 - w0
        rps = len(ok) / window_s if window_s > 0 else 0.0
        out = {
            "rounds_wrong": len(wrong), "rounds_ok_pct": round(100.0 * len(ok) / len(started), 1) if started else 0.0,
            "rounds_retried": retried, "rounds_started_during_attacks": len(started), "rounds_ok": len(ok),
            "rounds_unfinished": unfinished, "rounds_digest_mismatch": mismatch, "rounds_total": len(recs),
            "aborts_during_attacks": aborts,
            "throughput_vs_baseline": round(rps / base_rps, 3) if base_rps else None,
            "max_rss_growth_mib": max(growth.values(), default=0.0),
            "rss_growth_mib": growth,
            "handler_deaths": len(deaths),
            "handler_deaths_by_class": dict(Counter(d["class"] for d in deaths)),
            "attacks_by_class": {c: int(attempts.get(c, 0)) for c in CLASSES},
            "view_poisoned": bool(view["poisoned"]), "view_poisoned_links": view["poisoned"][:8],
            "view_max_rate_mbps": round(view["max_rate_mbps"], 1),
            "log_lines_per_burst": burst_lines, "burst_connections": burst["n"] if burst else 0,
            "live_guard_valid": guard,
            "far_future_acked": res.get("far_future_acked"), "relay_fresh_keys": res.get("relay_fresh_keys"),
            "relay_reused_keys": res.get("relay_reused_keys"),
            "agents_lost_during_attacks": lost, "agent_exits": len(self.exited),
            "agent_log_lines": agent_lines, "agent_refusal_lines": refusals,
            **self.log_figures(),
            "task_exceptions_logged": never_retrieved, "sched_loop_lag_max_s": round(self.lag_max, 3),
            "jobs": len(self.jobs), "job_errors": len(self.job_errors), "jobs_abandoned": abandoned,
            "attacker_error": self.crashed, "attack_s": round(window_s, 1),
            "seconds": round(time.time() - self.t_begin, 1), "quick": self.args.quick, "commit": commit(),
        }
        self.print_tables(out, res, deaths, guard_notes)
        return out

    def log_figures(self) -> dict[str, Any]:
        """Issue 38's figures from the log attacks: every process's log records, the agents' memory."""
        records = {"scheduler": [(t, lvl) for t, _, lvl, _ in self.tap.records]}
        for n in self.procs:
            f = self.logdir / f"agent{n}.log"
            if f.exists():
                records[f"agent {n}"] = agent_log_records(f)
        return summarize_phases(self.phases, records, self.rss)

    def guard(self) -> tuple[bool, list[str]]:
        """The fidelity guard on every job that finished (wansync.guard.job_guard)."""
        notes, valid = [], True
        finished = [js for js in self.jobs if js.finished.is_set()]
        if not finished:
            return False, ["no job finished"]
        for js in finished:
            try:
                v = job_guard(js)
            except Exception as exc:  # e.g. junk STATS the scheduler stored
                valid = False
                notes.append(f"job {js.job}: the guard failed ({type(exc).__name__}: {exc})")
                continue
            if v.verdict != "valid":
                valid = False
                notes.append(f"job {js.job}: {v.verdict} {v.reasons[:3]}")
        return valid, notes

    def print_tables(self, out: dict[str, Any], res: dict[str, Any], deaths: list[dict[str, Any]],
                     guard_notes: list[str]) -> None:
        con = Console(width=140)
        t = Table(title="attacks (attempts and what the targets did)")
        for col in ("class", "attempts", "deaths", "outcomes"):
            t.add_column(col)
        by = Counter(d["class"] for d in deaths)
        for c in CLASSES:
            oc = res.get("outcomes", {}).get(c, {})
            t.add_row(c, str(out["attacks_by_class"][c]), str(by.get(c, 0)),
                      "; ".join(f"{k}: {v}" for k, v in sorted(oc.items())))
        con.print(t)
        if deaths:
            d = Table(title=f"handler deaths ({len(deaths)}; first 12)")
            for col in ("class", "target", "what"):
                d.add_column(col)
            for x in deaths[:12]:
                d.add_row(x["class"], x["target"], x["what"])
            con.print(d)
        m = Table(title="memory (VmRSS, MiB)")
        for col in ("process", "before", "growth"):
            m.add_column(col, justify="right")
        for k, g in sorted(out["rss_growth_mib"].items(), key=lambda kv: -kv[1]):
            m.add_row(k, f"{self.base.get(k, 0):.0f}", f"{g:.1f}")
        con.print(m)
        for b in self.bursts:
            con.print(f"burst of {b['n']} idle connections: {b['closed']} closed by the scheduler, last after "
                      f"{b['last_close_s'] or 0:.1f} s; {out['log_lines_per_burst']} log lines", highlight=False)
            said = Counter(re.sub(r"\d+", "N", m)[:100] for t, _, lvl, m in self.tap.records
                           if b["t0"] <= t <= b["t1"] + 0.5 and lvl >= logging.WARNING)
            for m, k in said.most_common(4):
                con.print(f"  {k} x {m}", highlight=False)
        texc = Counter(m.split("[", 1)[-1] for _, _, _, m in self.tap.records if "never retrieved" in m)
        for m, k in texc.most_common(5):
            con.print(f"{k} x 'Task exception was never retrieved' [{m}", highlight=False)
        for n in guard_notes[:5]:
            con.print(f"guard: {n}", highlight=False)
        for e in self.job_errors[:5]:
            con.print(f"job error: {e}", highlight=False)
        s = Table(title="hostile summary")
        s.add_column("figure")
        s.add_column("value", justify="right")
        for k, v in out.items():
            if not isinstance(v, dict):
                s.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
        con.print(s)
        if self.args.keep_logs:
            con.print(f"agent logs: {self.logdir}", highlight=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the check's run: about 1.5 min, >= 50 attempts per class")
    ap.add_argument("--seconds", type=float, default=None, help="length of the concurrent attack phase")
    ap.add_argument("--per-class", type=int, default=None, help="attempts per class (controls and view)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--scale", type=float, default=0.005, help="model bytes and delays (default 0.005)")
    ap.add_argument("--schemes", default="mst", help="comma-separated, jobs in turn (default mst)")
    ap.add_argument("--rounds", type=int, default=20, help="rounds per job")
    ap.add_argument("-v", "--verbose", action="store_true", help="scheduler logs on stderr (WARNING and up)")
    ap.add_argument("--keep-logs", action="store_true", help="keep the agents' logs (their path is printed)")
    args = ap.parse_args(argv)
    args.schemes = [s for s in args.schemes.split(",") if s]
    q = args.quick
    args.seconds = args.seconds or (36.0 if q else 300.0)
    args.per_class = args.per_class or (64 if q else 400)
    args.baseline_s = 6.0 if q else 20.0
    args.burst = 200
    args.burst_s_max = HANDSHAKE_TIMEOUT_S + PREAUTH_GRACE_S + 10
    args.sched_per_wave = 12
    args.agent_victims = 2
    args.future_kib = 512
    args.heartbeats = 2000 if q else 5000
    args.drain_s = 20.0 if q else 60.0
    args.deadline_s = 230.0 if q else 3600.0
    # fork the attacker before any loop or thread exists here
    secret = generate_secret()
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=attacker_main, args=(child,), daemon=True, name="hostile-attacker")
    proc.start()
    child.close()
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    tap = LogTap()
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    root.addHandler(tap)
    if args.verbose:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        root.addHandler(h)
    # issue 38: small runs stopped by signals, during start-up and the attack-free phase (they must be
    # over before the attacks: 2 cores); in a thread, after the attacker was forked
    stopped: dict[str, Any] = {}
    stopper = threading.Thread(target=lambda: stopped.update(stop_runs()), name="stop-runs", daemon=True)
    stopper.start()
    try:
        bench = Hostile(args, parent, secret, tap)
        bench.quiet_before = lambda: not stopper.is_alive()
        res = asyncio.run(bench.run())
    except Exception as exc:  # still one JSON line: the check then names the error, not a missing line
        import traceback
        traceback.print_exc()
        res = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        proc.join(3)
        if proc.is_alive():
            proc.kill()
            proc.join()
    stopper.join(150)
    if "error" not in res:  # issue 38: a run stopped by a signal ends every process without a traceback
        res.update(stopped or {"shutdown_tracebacks": None})
        print_new(res)
    print(json.dumps(res))
    return 0 if "error" not in res else 1


def print_new(res: dict[str, Any]) -> None:
    """The second pass's figures, readable (they are in the JSON line too)."""
    con = Console(width=140)
    t = Table(title="logs an attacker can neither flood nor silence; a stopped run (issue 38)")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k in ("log_lines_varied_burst", "second_burst_logged", "refusal_state_growth_mib",
              "refusal_state_victim_growth_mib", "refusal_state_control_growth_mib", "distinct_connections",
              "distinct_refused", "distinct_per_s", "shutdown_tracebacks"):
        t.add_row(k, str(res.get(k)))
    for name, per in (res.get("log_lines_varied_by_burst") or {}).items():
        t.add_row(f"  lines, {name}", ", ".join(f"{p}: {n}" for p, n in per.items()))
    seen = res.get("second_burst_lines", {})
    t.add_row("  lines at once, second burst", ", ".join(f"{p}: {n}" for p, n in seen.items()))
    for name, r in (res.get("shutdown_runs") or {}).items():
        t.add_row(f"  stopped by {name}", f"exit {r.get('rc')}, {r.get('tracebacks')} tracebacks after "
                                          f"{r.get('rounds_before_stop')} rounds")
    con.print(t)


if __name__ == "__main__":
    sys.exit(main())
