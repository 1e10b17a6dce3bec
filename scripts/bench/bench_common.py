"""What the benchmarks share: child-process reaping, SIGTERM as an exit, the measured commit."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from typing import Any


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
