"""Wait for events, never for time: poll a condition with short pauses until it holds, or fail after a
generous deadline naming what was awaited. A slow machine only makes the wait longer, never the test
wrong; a fast one never makes it miss the event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEADLINE_S = 60.0  # generous: reaching it means the event never came, not that the machine was slow


async def until(cond: Callable[[], T], what: str, timeout: float = DEADLINE_S, every: float = 0.01) -> T:
    """cond()'s first truthy value; AssertionError naming `what` if none came within `timeout` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not (value := cond()):
        if loop.time() > end:
            raise AssertionError(f"waited {timeout:g} s for {what}; it never happened")
        await asyncio.sleep(every)
    return value


def until_sync(cond: Callable[[], T], what: str, timeout: float = DEADLINE_S, every: float = 0.05) -> T:
    """`until` for tests without an event loop (they watch subprocesses)."""
    end = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > end:
            raise AssertionError(f"waited {timeout:g} s for {what}; it never happened")
        time.sleep(every)
    return value
