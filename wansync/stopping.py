"""SIGTERM and Ctrl-C end a process the way a finished run does: the work is cancelled at an await,
its `finally` blocks run (tasks awaited, sockets closed, agents reaped), and the process exits with
128 + the signal's number and no traceback. A signal handler that raises wherever the interpreter
happens to be (an import, a callback, the middle of a shutdown) cannot promise that."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """The run was stopped by a signal; `code` is the exit status to leave with (128 + its number)."""

    def __init__(self, signum: int) -> None:
        super().__init__("interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}")
        self.code = 128 + signum


async def until_signal(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro`; SIGTERM or SIGINT cancels it (a second one is ignored while it unwinds) and raises
    Stopped once it has."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    got: list[int] = []

    def stop(signum: int) -> None:
        if not got:
            got.append(signum)
            task.cancel()

    for s in SIGNALS:
        loop.add_signal_handler(s, stop, s)
    try:
        result = await task  # cancelled from outside: so is the work, and that propagates
    except asyncio.CancelledError:
        if got and task.cancelled():
            raise Stopped(got[0]) from None
        raise
    finally:
        for s in SIGNALS:
            loop.remove_signal_handler(s)
    if got:  # the work caught its cancellation and ended by itself: stopped all the same
        raise Stopped(got[0])
    return result
