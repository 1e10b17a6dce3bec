"""Find the `wansync agent` processes a test's launcher started: the test tags its launcher's environment,
which the agents inherit, so other tests' clusters running meanwhile on this machine are not counted."""

from __future__ import annotations

import os
from pathlib import Path

TAG = "WANSYNC_TEST_TAG"


def tagged(tag: str) -> dict[str, str]:
    """An environment that marks this test's launcher and, through inheritance, its agents."""
    return {**os.environ, TAG: tag}


def agents_of(tag: str) -> list[int]:
    """Pids of live `wansync agent` processes carrying this test's tag: other tests' clusters, which
    may run at the same time on this machine, are not counted."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if b"wansync.cli" in cmd and b"agent" in cmd and f"{TAG}={tag}".encode() in env:
            pids.append(int(proc.name))
    return pids

