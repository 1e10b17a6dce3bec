"""A results directory checked against itself: every committed summary against the one recomputed from the
raw run lines (with the registry's ratio definitions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import runlog
from .registry import experiments
from .summary import same, summarize


def recomputed(paper: str, d: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(committed summaries, summaries recomputed from d/runs.jsonl), per experiment id."""
    runs = runlog.read(d / runlog.RUNS)
    committed = json.loads((d / "summary.json").read_text()).get("experiments", {}) \
        if (d / "summary.json").exists() else {}
    exps = experiments(paper)
    fresh = {}
    for eid in sorted(set(committed) | {r["experiment"] for r in runs}):
        exp = exps.get(eid)
        fresh[eid] = summarize(paper, eid, exp.ratios if exp else (), runs)
    return committed, fresh


def mismatched(paper: str, d: Path) -> list[str]:
    """Experiments whose committed summary differs from the recomputation (or is missing)."""
    committed, fresh = recomputed(paper, d)
    return [eid for eid, s in fresh.items() if eid not in committed or not same(s, committed[eid])]
