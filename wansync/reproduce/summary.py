"""Per experiment, from the raw run lines alone: per cell the median and order-statistic interval of every
figure across its valid seeds, ratios between schemes divided per run (paired per seed) before they are
summarized; invalid runs listed, never summarized. Pure functions: the check recomputes them from the
committed lines and compares."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from .intervals import interval
from .runlog import cell_key


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def per_run_values(figures: dict[str, Any], ratios: Sequence[tuple[str, str, str]]) -> dict[str, float]:
    """A run's numbers, and its ratios (numerator / denominator of the same run, so the same seed)."""
    out = {k: x for k, v in figures.items() if k not in ("valid", "live") and (x := _number(v)) is not None}
    for name, num, den in ratios:
        a, b = out.get(num), out.get(den)
        if a is not None and b:
            out[name] = a / b
    return out


def summarize(paper: str, experiment: str, ratios: Sequence[tuple[str, str, str]],
              runs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The summary of one experiment's runs (lines of other experiments are ignored)."""
    mine = [r for r in runs if r.get("paper") == paper and r.get("experiment") == experiment]
    invalid = [{"cell": r["cell"], "seed": r["seed"], "reason": r["figures"].get("reason", "not valid")}
               for r in mine if not r["figures"].get("valid")]
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for r in mine:
        if r["figures"].get("valid"):
            by_cell.setdefault(cell_key(r["cell"]), []).append(r)
    cells = []
    for key in sorted(by_cell):
        rs = sorted(by_cell[key], key=lambda r: r["seed"])
        values: dict[str, list[float]] = {}
        for r in rs:
            for k, v in per_run_values(r["figures"], ratios).items():
                values.setdefault(k, []).append(v)
        cells.append({"cell": rs[0]["cell"], "seeds": [r["seed"] for r in rs],
                      "live": any(r["figures"].get("live") for r in rs),
                      "figures": {k: interval(v).as_dict() for k, v in sorted(values.items())}})
    return {"paper": paper, "experiment": experiment, "runs": len(mine), "valid_runs": len(mine) - len(invalid),
            "invalid": sorted(invalid, key=lambda d: (cell_key(d["cell"]), d["seed"])), "cells": cells}


def same(a: Any, b: Any, rel: float = 1e-9) -> bool:
    """Two summaries equal up to float rounding (what JSON keeps of a float is exact; this allows for
    another machine's last bit)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, rel) for x, y in zip(a, b, strict=True))
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)
    return a == b


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def markdown(summary: dict[str, Any], columns: Sequence[str], title: str = "") -> str:
    """One experiment's table: a row per cell, `median [lo, hi]` per column, the interval in words."""
    cells = summary["cells"]
    settings = list(dict.fromkeys(k for c in cells for k in c["cell"]))
    head = [*settings, "seeds", *columns, "interval"]
    lines = [f"**{title or summary['experiment']}**", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for c in cells:
        row = [str(c["cell"].get(k, "")) for k in settings] + [str(len(c["seeds"]))]
        label = ""
        for col in columns:
            f = c["figures"].get(col)
            row.append("-" if f is None else f"{fmt(f['median'])} [{fmt(f['lo'])}, {fmt(f['hi'])}]"
                       if f["n"] > 1 else fmt(f["median"]))
            label = label or ("" if f is None else f["interval"])
        lines.append("| " + " | ".join([*row, label]) + " |")
    if summary["invalid"]:
        lines += ["", f"Invalid runs (not summarized): {len(summary['invalid'])}: " + "; ".join(
            f"{d['cell']} seed {d['seed']}: {d['reason']}" for d in summary["invalid"][:10])]
    return "\n".join(lines) + "\n"
