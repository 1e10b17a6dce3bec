"""Hostile, second pass (issue 38): attacks on the logs and the refusal state, and a stopped run.

Used by scripts/bench/hostile.py. The attacker side (`LogAttacks`) varies what every connection
sends, so that a log keyed by what the peer says would write a line (and keep an entry) per
connection; the benchmark side counts what each process logged (`lines_by_process`) and stops
small `wansync run`s with signals (`stop_runs`), counting the tracebacks every process printed.

 varied_lengths   300 connections to the scheduler and to one agent, each announcing another
                  oversized header length before authenticating (2000, 2001, ... bytes)
 varied_names     then, after a quiet period, 300 more each claiming another wrong cluster name
                  and node id: the second burst of the same kind on both targets
 same_reason      to a second agent, twice (with the phases above): 50 connections refused for
                  the same reason each time, a second burst after a quiet period
 distinct         40,000 connections to a third agent (from the start, alongside everything else,
                  which spares it), each refused for a reason of its own (another cluster name):
                  its RSS 1-2.5 s after the attack less its RSS before, less the same difference
                  of a fourth agent nobody attacks (the drift rounds and time cause by themselves)
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script too (the distinct flood)
from overlay.burstlog import EVERY_S  # noqa: E402

LEN = struct.Struct("!I")
VARIED = 300  # connections per varied burst
SAME = 50  # connections per same-reason burst
DISTINCT = 40_000  # connections with distinct reasons (refusal state)
WIDTH = 32  # connections at once per target: below the half-open limit, so every one is handshaken
QUIET_S = EVERY_S + 1.5  # between bursts of the same kind: longer than a burst log's window
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
TRACEBACK = re.compile(r"Traceback|CancelledError|exception was never retrieved")


def _frame(header: dict[str, Any]) -> bytes:
    body = msgpack.packb(header, use_bin_type=True)
    return LEN.pack(len(body)) + body


def _hello(node: int, cluster: str) -> bytes:
    return _frame({"t": "HELLO", "node": node, "cluster": cluster, "role": "agent",
                   "nonce": secrets.token_bytes(32), "epoch": 1})


def varied_lengths(n: int) -> Iterator[bytes]:
    return (LEN.pack(2000 + i) + b"\x81" * 64 for i in range(n))


def varied_names(n: int, prefix: str = "evil") -> Iterator[bytes]:
    return (_hello(100 + i % 1000, f"{prefix}-{i}") for i in range(n))


def same_reason(n: int) -> Iterator[bytes]:
    return (_hello(7, "hostile-the-wrong-cluster") for _ in range(n))


class LogAttacks:
    """The attacker's side: bursts of refused connections, each connection saying something new."""

    def __init__(self, tell: Callable[[str, Any], None]) -> None:
        self.tell = tell  # reports to the benchmark: ("phase", {...})
        self.attempts = 0
        self.failed: Counter[str] = Counter()  # connections not refused, by what happened instead

    async def _one(self, host: str, port: int, data: bytes) -> bool:
        """One connection (a bare socket: the attacker's own cost must not set the pace): send `data`,
        then read until the target hangs up, which is a refusal, or 5 s pass."""
        self.attempts += 1
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(5.0):
                await loop.sock_connect(sock, (host, port))
                await loop.sock_sendall(sock, data)
                while await loop.sock_recv(sock, 1 << 16):
                    pass
            return True
        except ConnectionResetError:  # aborted by the target: refused all the same
            return True
        except (OSError, TimeoutError) as exc:
            self.failed[type(exc).__name__] += 1
            return False
        finally:
            sock.close()

    async def spray(self, host: str, port: int, items: Iterator[bytes]) -> int:
        """Each item on a connection of its own, WIDTH at a time; the number refused (closed by the target)."""
        refused = 0

        async def worker() -> None:
            nonlocal refused
            for data in items:  # one iterator shared by every worker
                ok = await self._one(host, port, data)  # (not `refused += await ...`: that reads it before)
                refused += ok
        await asyncio.gather(*(worker() for _ in range(WIDTH)))
        return refused

    async def bursts(self, sched: tuple[str, int], agents: dict[int, tuple[str, int]], a: int, b: int) -> None:
        """Varied bursts at the scheduler and agent `a`, same-reason bursts at agent `b`; twice, with a
        quiet period between (the second burst of the same kind must be logged at once again)."""
        for name, gen, rep in (("varied_lengths", varied_lengths, same_reason),
                               ("varied_names", varied_names, same_reason)):
            t0 = time.time()
            counts = await asyncio.gather(self.spray(*sched, gen(VARIED)), self.spray(*agents[a], gen(VARIED)),
                                          self.spray(*agents[b], rep(SAME)))
            t1 = time.time()
            self.tell("phase", {"name": name, "t0": t0, "t1": t1, "refused": counts, "n": [VARIED, VARIED, SAME],
                                "targets": ["scheduler", f"agent {a}", f"agent {b}"]})
            await asyncio.sleep(max(t0 + QUIET_S, t1 + QUIET_S - 1.0) - time.time())  # quiet: the next burst is new

    async def distinct(self, addr: tuple[str, int], victim: int, control: int, n: int = DISTINCT) -> None:
        """n connections to one agent, each refused for a reason of its own (another cluster name);
        `control`: an agent nobody attacks, whose memory is read over the same time. From a process of
        its own: 32 connections at a time must not slow this attacker's probes of the others."""
        t0 = time.time()
        proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "distinct", addr[0], str(addr[1]),
                                                    str(n), stdout=asyncio.subprocess.PIPE)
        try:
            out, _ = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        got = json.loads(out.decode().strip().splitlines()[-1])
        self.attempts += n
        self.tell("phase", {"name": "distinct", "t0": got["t0"], "t1": got["t1"], "refused": [got["refused"]],
                            "n": [n], "targets": [f"agent {victim}"], "control": f"agent {control}",
                            "failed": got["failed"], "spawned_s": round(got["t0"] - t0, 2)})


async def _distinct_main(host: str, port: int, n: int) -> None:
    flood = LogAttacks(lambda kind, data: None)
    t0 = time.time()
    refused = await flood.spray(host, port, varied_names(n, prefix="distinct"))
    print(json.dumps({"t0": t0, "t1": time.time(), "refused": refused, "failed": dict(flood.failed)}), flush=True)


# --- the benchmark's side ---------------------------------------------------------------------------------
def agent_log_records(path: Path) -> list[tuple[float, int]]:
    """(time, level) of every record in an agent's stderr (the format of wansync's logging)."""
    out = []
    levels = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
    for line in path.read_text(errors="replace").splitlines():
        m = STAMP.match(line)
        if m:
            t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
            out.append((t, levels[m.group(3)]))
    return out


def lines_by_process(records: dict[str, list[tuple[float, int]]], t0: float, t1: float) -> dict[str, int]:
    """WARNING-and-up records per process between t0 and t1."""
    return {k: sum(1 for t, lvl in recs if t0 <= t <= t1 and lvl >= 30) for k, recs in records.items()}


def summarize_phases(phases: list[dict[str, Any]], records: dict[str, list[tuple[float, int]]],
                     rss: list[tuple[float, dict[str, float]]]) -> dict[str, Any]:
    """The new keys: lines per varied burst (worst process), the second burst seen, the state's growth."""
    by = {p["name"]: p for p in phases}
    varied: dict[str, dict[str, int]] = {}
    for name in ("varied_lengths", "varied_names"):
        p = by.get(name)
        if p is not None:  # the summary lines come at the end of the window that the first event opened
            lines = lines_by_process(records, p["t0"], max(p["t0"] + EVERY_S + 1.5, p["t1"] + 1.0))
            varied[name] = {k: lines.get(k, 0) for k in p["targets"]}
    second = by.get("varied_names")
    seen: dict[str, int] = {}
    if second is not None:  # its first events, at once: each target was refusing the same kind before
        lines = lines_by_process(records, second["t0"], second["t1"] + 1.0)
        seen = {k: lines.get(k, 0) for k in second["targets"]}
    growth: dict[str, float | None] = {}
    d = by.get("distinct")
    for who in ("victim", "control"):
        name = (d["targets"][0] if who == "victim" else d.get("control")) if d is not None else None
        before = [row[name] for t, row in rss if d["t0"] - 2.0 <= t <= d["t0"] and name in row] if d else []
        after = [row[name] for t, row in rss if d["t1"] + 1.0 <= t <= d["t1"] + 2.5 and name in row] if d else []
        growth[who] = round(max(0.0, min(after) - max(before)), 1) if before and after else None
    return {
        "log_lines_varied_burst": max((v for ph in varied.values() for v in ph.values()), default=None),
        "log_lines_varied_by_burst": varied,
        "second_burst_logged": bool(seen) and all(v >= 1 for v in seen.values()),
        "second_burst_lines": seen,
        # the victim's growth, measured after the attack (the last 2 s before it to 1-2.5 s after), less
        # the control's over the same time: what rounds and time alone add (both are in the JSON line too)
        "refusal_state_growth_mib": (None if growth["victim"] is None else
                                     round(max(0.0, growth["victim"] - (growth["control"] or 0.0)), 1)),
        "refusal_state_victim_growth_mib": growth["victim"], "refusal_state_control_growth_mib": growth["control"],
        "distinct_connections": d["n"][0] if d else 0, "distinct_refused": d["refused"][0] if d else 0,
        "distinct_per_s": round(d["n"][0] / (d["t1"] - d["t0"]), 0) if d and d["t1"] > d["t0"] else None,
    }


def stop_runs(timeout_s: float = 120.0) -> dict[str, Any]:
    """Two small `wansync run`s (3 agents) stopped mid-run, one by SIGTERM to the launcher, one by
    Ctrl-C (SIGINT to its whole process group, as a terminal sends it); the tracebacks, CancelledErrors
    and "exception was never retrieved" every process printed (the agents share the launcher's stderr)."""
    tmp = Path(tempfile.mkdtemp(prefix="wansync-stop-"))
    stops = {"sigterm": (signal.SIGTERM, False), "ctrl_c": (signal.SIGINT, True)}
    procs: dict[str, tuple[subprocess.Popen, Path, Path]] = {}
    for name in stops:
        out, err = tmp / f"{name}.jsonl", tmp / f"{name}.err"
        with err.open("w") as fh:
            procs[name] = (subprocess.Popen(
                [sys.executable, "-m", "wansync.cli", "run", "--topology", "uniform", "--nodes", "3",
                 "--schemes", "ring", "--rounds", "100000", "--scale", "0.005", "--no-http", "--out", str(out)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=fh, start_new_session=True,
                cwd=str(Path(__file__).resolve().parents[2])), out, err)
    res: dict[str, Any] = {}
    deadline = time.time() + timeout_s
    pending = dict(procs)
    while pending and time.time() < deadline:
        for name, (p, out, _) in list(pending.items()):
            rounds = out.read_text().count('"type": "task"') if out.exists() else 0
            if rounds >= 3 or p.poll() is not None:
                sig, group = stops[name]
                if p.poll() is None:
                    (os.killpg if group else os.kill)(p.pid, sig)
                res[name] = {"rounds_before_stop": rounds}
                del pending[name]
        time.sleep(0.1)
    for name, (p, _, err) in procs.items():
        try:
            rc = p.wait(max(5.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc = p.wait()
        text = err.read_text(errors="replace")
        res.setdefault(name, {}).update(rc=rc, tracebacks=len(TRACEBACK.findall(text)),
                                        first=next((ln for ln in text.splitlines() if TRACEBACK.search(ln)), None))
    total = sum(r["tracebacks"] for r in res.values())
    stopped = all(r.get("rounds_before_stop", 0) >= 3 for r in res.values())
    return {"shutdown_tracebacks": total if stopped else None, "shutdown_runs": res}


if __name__ == "__main__":  # the distinct-reasons flood, in a process of its own (LogAttacks.distinct)
    if len(sys.argv) == 5 and sys.argv[1] == "distinct":
        asyncio.run(_distinct_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
