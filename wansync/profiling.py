"""Where an agent's CPU goes, for whoever works on the data plane: with WANSYNC_PROFILE=DIR in the
environment of a local run, every agent writes DIR/agent-N.prof (cProfile, timed by the event loop
thread's CPU time, so waiting for a core is not counted) when it stops; read them with pstats. Off
by default: a profiled agent runs about twice as slow."""

from __future__ import annotations

import contextlib
import cProfile
import os
import time
from collections.abc import Iterator
from pathlib import Path

PROFILE_ENV = "WANSYNC_PROFILE"


@contextlib.contextmanager
def profiled(name: str) -> Iterator[None]:
    """Profile the block into $WANSYNC_PROFILE/NAME.prof when that is set; otherwise do nothing."""
    where = os.environ.get(PROFILE_ENV)
    if not where:
        yield
        return
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        prof.dump_stats(str(Path(where) / f"{name}.prof"))
