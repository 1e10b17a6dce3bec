"""The event loop a process runs on (--loop): chosen before asyncio.run, and named in the environment so
that child processes and the agents' stats report it."""

from __future__ import annotations

import asyncio
import os

# asyncio, not uvloop: both carry an unshaped link at ~0.85x a raw socket here (transport bench), but
# with the shaper uvloop's ms-granular timers cost about twice the CPU for the same fidelity
DEFAULT_LOOP = "asyncio"


def set_loop(loop: str) -> None:
    if loop == "uvloop":
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    elif loop != "asyncio":
        raise ValueError(f"--loop must be uvloop or asyncio, got {loop!r}")
    os.environ["WANSYNC_LOOP"] = loop
