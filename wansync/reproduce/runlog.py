"""The campaign's raw record: one JSON line per (experiment, cell, seed), appended as each run ends, so an
interrupted campaign resumes where it stopped (what is in the file is not run again)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RUNS = "runs.jsonl"


def cell_key(cell: dict[str, Any]) -> str:
    """A cell's canonical text (sorted keys): the same settings, the same key."""
    return json.dumps(cell, sort_keys=True, separators=(",", ":"))


def run_key(experiment: str, cell: dict[str, Any], seed: int) -> tuple[str, str, int]:
    return experiment, cell_key(cell), int(seed)


def read(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a runs file (a line cut short by an interruption is skipped)."""
    return list(_lines(path))


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open() as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def done(path: Path) -> set[tuple[str, str, int]]:
    """The (experiment, cell, seed) already recorded."""
    return {run_key(r["experiment"], r["cell"], r["seed"]) for r in _lines(path)}


def append(path: Path, record: dict[str, Any]) -> None:
    """One run, as one line, flushed before the next run starts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True, default=_plain) + "\n")
        f.flush()


def _plain(x: Any) -> Any:
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    return str(x)
