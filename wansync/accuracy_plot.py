"""The accuracy figure of `wansync plot`: held-out accuracy against time, per scheme, from a training
run's `accuracy` records (each worker's evaluations of its own model; scripts/bench/selreduce.py
writes them). The line is the mean over workers of each one's latest accuracy; dots are the
evaluations themselves."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def mean_curve(points: list[tuple[float, int, float]]) -> tuple[list[float], list[float]]:
    """(t, mean over workers of each one's latest accuracy at t), from the moment every worker that
    evaluated at all has done so once."""
    workers = {n for _, n, _ in points}
    latest: dict[int, float] = {}
    ts, ys = [], []
    for t, n, acc in sorted(points):
        latest[n] = acc
        if len(latest) == len(workers):
            ts.append(t)
            ys.append(statistics.fmean(latest.values()))
    return ts, ys


def accuracy_figure(target: Path, title: str, rounds: list[dict[str, Any]], by_type: dict) -> str | None:
    recs = by_type.get("accuracy", [])
    if not recs:
        return "no accuracy records (a real-training run writes them)"
    per: dict[str, list[tuple[float, int, float]]] = defaultdict(list)
    for r in recs:
        t = r.get("t_rel", r.get("at", 0.0))
        per[str(r.get("scheme", "?"))].append((float(t), int(r.get("node", 0)), float(r["accuracy"])))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (scheme, pts) in enumerate(sorted(per.items())):
        color = f"C{i}"
        ax.scatter([t for t, _, _ in pts], [a for _, _, a in pts], s=4, alpha=0.25, color=color)
        ts, ys = mean_curve(pts)
        ax.step(ts, ys, where="post", color=color, label=scheme, linewidth=1.8)
    ax.axhline(0.9, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("seconds since the job started")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"accuracy vs time: {title}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return None
