"""What made a result: the commit (and whether the tree differed from it) and the machine."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def git(*args: str, root: Path = ROOT) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def commit(root: Path = ROOT) -> str:
    return git("rev-parse", "--short=12", "HEAD", root=root)


def dirty(paths: list[str], root: Path = ROOT) -> bool:
    """Whether any of `paths` differs from the commit in the working tree."""
    return bool(paths) and bool(git("status", "--porcelain", "--", *paths, root=root))


def machine() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores{' ' + cpu if cpu else ''}, {platform.system()} {platform.machine()}, " \
           f"Python {platform.python_version()}"


def changed_since(rev: str, paths: list[str], root: Path = ROOT) -> list[str]:
    """Files among `paths` changed in git after `rev` (every path when `rev` is not a known commit)."""
    if not rev or not git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", root=root):
        return list(paths)
    out = git("diff", "--name-only", f"{rev}..HEAD", "--", *paths, root=root)
    return [line for line in out.splitlines() if line]
