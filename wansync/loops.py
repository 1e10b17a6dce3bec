"""The event loop a process runs on (--loop): chosen before asyncio.run, and named in the environment so
that child processes and the agents' stats report it."""

from __future__ import annotations

import asyncio
import os

# auto: the loop is chosen per backend (resolve_loop)
DEFAULT_LOOP = "auto"
LOOPS = ("auto", "asyncio", "uvloop")


def resolve_loop(loop: str, backend: str) -> str:
    """auto: uvloop on both backends. Its C loop and transport cost less per GB moved: 12 % on the tc
    backend's crew:24 capacity case (12.2 vs 13.9 CPU-s/GB), and where the agents pace every link
    themselves too, now that one wire clock per process coalesces the pacing timers (overlay.delayline):
    crew:16 x 0.05, app backend, 15.0-15.8 vs 16.7-16.8 CPU-s/GB; the default run (8 nodes) 71 vs 81
    CPU-s; 4 nodes unshaped, 100 MB ring rounds ~0.38 vs ~0.49 s (interleaved runs, 2-core machine).
    An earlier measurement favoured asyncio where the agents shape (uvloop's ms-granular timers, one
    per link then); `backend` stays an argument so the choice can be per backend again."""
    if loop not in LOOPS:
        raise ValueError(f"--loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    if loop == "auto":
        return "uvloop"
    return loop


def set_loop(loop: str, backend: str = "app") -> None:
    loop = resolve_loop(loop, backend)
    if loop == "uvloop":
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    os.environ["WANSYNC_LOOP"] = loop
