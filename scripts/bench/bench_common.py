"""What the benchmarks share: their child processes (start, command pipe, CPU, reaping), SIGTERM as
an exit, the commit measured, and a blocking socket's exact read."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import xxhash


def spawn_agent(cmd: list[str], node: int, secret_env: dict[str, str], logs: Path | None = None,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    """One agent process of a benchmark's own cluster: the cluster secret (`secret_env`) and `env`
    over this process's environment, stdin closed, stderr to LOGS/agentN.log when asked (else dropped)."""
    log: Any = subprocess.DEVNULL
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        log = (logs / f"agent{node}.log").open("w")
    try:
        return subprocess.Popen(cmd, env={**os.environ, **secret_env, **(env or {})}, stdin=subprocess.DEVNULL,
                                stderr=log)
    finally:
        if log is not subprocess.DEVNULL:
            log.close()  # the child holds its own descriptor


def commit() -> str:
    """The library version measured (the working tree may differ from it)."""
    with contextlib.suppress(Exception):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip()
    return ""


def reap(procs: list[Any], grace_s: float = 3.0) -> None:
    """Join every child; after `grace_s` in all, terminate, then kill, whatever is still alive."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        with contextlib.suppress(Exception):
            if p.is_alive():
                p.terminate()
                p.join(1)
            if p.is_alive():
                p.kill()
                p.join()


def exit_on_sigterm(signum: int, frame: object) -> None:
    """A SIGTERM unwinds like an exception, so `finally` blocks reap the children."""
    raise SystemExit(128 + signum)


def die_with_parent() -> None:
    """Linux: the kernel kills this child if the benchmark process dies (even by SIGKILL)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)


def idle_priority() -> None:
    """This process runs only on CPU nobody else wants (SCHED_IDLE; else the lowest nice): simulations
    a benchmark computes while its live agents run, which the fidelity guard judges as always."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def recv(ctrl: Connection) -> Any:
    """Await the next command on a pipe without blocking the event loop."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def ready() -> None:
        loop.remove_reader(ctrl.fileno())
        try:
            fut.set_result(ctrl.recv())
        except EOFError:
            fut.set_result(None)

    loop.add_reader(ctrl.fileno(), ready)
    return await fut


def rss_mib(pid: int | None = None) -> float | None:
    """Resident memory of a process (VmRSS, MiB; this one if pid is None); None once it is gone."""
    try:
        with open(f"/proc/{pid or 'self'}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def mem_available_mib() -> float:
    """What the machine can still give (MemAvailable): benchmarks that provoke leaks stop short of it."""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("inf")


def result_digest(values: Any) -> str:
    """What agents report for a result (agents/tasks.py's digest), computed here: hex XXH3-64 of the
    float32 bytes; the benchmarks compare it with their own exact sums."""
    return xxhash.xxh3_64_hexdigest(memoryview(values).cast("B"))


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from a blocking socket (ConnectionError if the peer closes first)."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed")
        got += n
