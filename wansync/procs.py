"""The agent processes of a local run: started with the secret in their environment, watched while
the scheduler waits (a death fails the wait at once instead of a hang), reaped on every way out."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console


async def wait_or_die(aw: Any, dead: Callable[[], list[tuple[int, str]]] | list[subprocess.Popen], *,
                      survive: bool = False, console: Console | None = None, total: int | None = None) -> Any:
    """Await `aw`; if agent processes die, fail at once instead of hanging, unless `survive` (a
    running job: the scheduler aborts the round and goes on without them, as long as two remain).
    `dead` lists the nodes whose process ended, with why (or is the list of local processes)."""
    if isinstance(dead, list):
        procs = dead
        total = len(procs) if total is None else total

        def dead() -> list[tuple[int, str]]:
            return [(i, f"exit {p.returncode}") for i, p in enumerate(procs) if p.poll() is not None]
    task = asyncio.ensure_future(aw)
    told: set[int] = set()
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if done:
            return task.result()
        gone = dead()
        if gone and (not survive or (total is not None and total - len(gone) < 2)):
            task.cancel()
            raise RuntimeError(f"agent process(es) exited: {', '.join(f'node {i} ({why})' for i, why in gone)}")
        for i, why in gone:
            if i not in told and console is not None:
                told.add(i)
                console.print(f"[yellow]agent {i} exited ({why}); the scheduler goes on without it[/]")


def reap(procs: list[subprocess.Popen], grace_s: float = 3.0) -> None:
    """Give agents `grace_s` to leave by themselves (after SHUTDOWN), then SIGTERM, then SIGKILL."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)  # a frozen agent (a fault) cannot leave otherwise
    deadline = time.time() + grace_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(1.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
