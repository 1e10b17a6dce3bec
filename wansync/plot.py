"""`wansync plot results.jsonl`: PNG figures from a run's results file (matplotlib, Agg backend).

Figures: round time per scheme (box plot and CDF of measured rounds), throughput per link over time
(from `throughput` records; schema 1 files fall back to passive `link_sample`s), speedup over the
star baseline (skipped, with the reason, when the file has no star rounds), and task timelines of
tasks jobs (one bar per task, and each node's parts; not drawn when every job ran BSP rounds), and
held-out accuracy against time per scheme for training runs (`accuracy` records; accuracy_plot.py),
and auto's decisions against the live rounds (`auto` events; auto_plot.py).

Schema 3 records every task (`task`); a BSP job's tasks are its rounds, a tasks job's (partial
reduces the scheduler formed, told by its `job` event's mode) are drawn as tasks only. Schema 1
and 2 files have `round` records and BSP jobs only.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display, safe in CI and over SSH
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .accuracy_plot import accuracy_figure  # noqa: E402
from .auto_plot import auto_figure  # noqa: E402

SUPPORTED_SCHEMAS = (1, 2, 3)
TOP_LINKS = 10  # more lines than this are unreadable; the rest are drawn thin and grey
BASELINE = "star"
TIMELINE_TASKS_MAX = 3000  # bars per job in the task timeline; beyond that the first ones are drawn
OUTCOME_COLOR = {"exact": "#59a14f", "failed": "#e15759", "aborted": "#9c9c9c"}


class PlotError(Exception):
    """The results file cannot be plotted (missing, empty, not JSON lines, unknown schema)."""


def load(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise PlotError(f"cannot read {path}: {exc.strerror}") from None
    recs = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines):  # a run killed mid-write leaves a torn last line: plot what is there
                break
            raise PlotError(f"{path}:{i}: not JSON ({exc.msg})") from None
        if not isinstance(rec, dict) or "type" not in rec:
            raise PlotError(f"{path}:{i}: not a results record (no 'type')")
        if rec.get("schema") not in SUPPORTED_SCHEMAS:
            raise PlotError(f"{path}:{i}: schema {rec.get('schema')!r}, this wansync reads {SUPPORTED_SCHEMAS}")
        recs.append(rec)
    if not recs:
        raise PlotError(f"{path}: no records")
    return recs


def plot(path: Path, out_dir: Path | None = None) -> tuple[list[Path], list[str]]:
    """Write every figure the file has data for; return (PNG paths written, reasons for skipped figures)."""
    recs = load(path)
    out_dir = out_dir or path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = path.stem
    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by_type[r["type"]].append(r)
    run = by_type["run"][0] if by_type["run"] else {}
    # schema 3 records every task; a BSP job's are its rounds (older files: `round` records, BSP only)
    modes = {e["data"]["job"]: e["data"].get("mode", "rounds") for e in by_type["event"]
             if e.get("kind") == "job" and isinstance(e.get("data"), dict) and "job" in e["data"]}
    every = by_type["round"] + by_type.pop("task", [])
    by_type["task"] = [r for r in every if modes.get(r.get("job"), run.get("mode", "rounds")) == "tasks"]
    by_type["round"] = [r for r in every if modes.get(r.get("job"), run.get("mode", "rounds")) != "tasks"]
    title = (f"{run.get('topology', '?')}, {run.get('nodes', '?')} nodes, {run.get('model', '?')} "
             f"x{run.get('scale', '?')}") if run else path.name
    rounds = [r for r in by_type["round"] if not r.get("warmup")] or by_type["round"]
    written, skipped = [], []
    figures = [("round_times", _round_times), ("link_throughput", _link_throughput), ("speedup", _speedup)]
    if by_type["task"]:  # a file of BSP jobs only has no task timeline to skip
        figures.append(("task_timelines", _task_timelines))
    if by_type["accuracy"]:  # a real-training run (agents.training): held-out accuracy against time
        figures.append(("accuracy", accuracy_figure))
    if any(e.get("kind") == "auto" for e in by_type["event"]):  # --schemes auto: its decisions
        figures.append(("auto", auto_figure))
    for name, fn in figures:
        target = out_dir / f"{stem}_{name}.png"
        why = fn(target, title, rounds, by_type)
        if why:
            skipped.append(f"{target.name}: {why}")
        else:
            written.append(target)
    if not written:
        raise PlotError(f"{path}: nothing to plot ({'; '.join(skipped)})")
    return written, skipped


def _schemes(rounds: list[dict[str, Any]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in rounds:
        out.setdefault(r["scheme"], []).append(float(r["round_s"]))
    return out


def _round_times(target: Path, title: str, rounds: list[dict[str, Any]], by_type: dict) -> str | None:
    times = _schemes(rounds)
    if not times:
        return "no round records"
    fig, (box, cdf) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = list(times)
    box.boxplot([times[n] for n in names], tick_labels=names, showmeans=True)
    for i, n in enumerate(names, 1):
        box.scatter([i] * len(times[n]), times[n], s=12, alpha=0.6, zorder=3)
    box.set_ylabel("round time (s)")
    box.set_title("round time per scheme")
    box.set_ylim(bottom=0)
    for n in names:
        xs = sorted(times[n])
        cdf.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"{n} (n={len(xs)})")
    cdf.set_xlabel("round time (s)")
    cdf.set_ylabel("fraction of rounds")
    cdf.set_ylim(0, 1.02)
    cdf.set_title("CDF")
    cdf.grid(alpha=0.3)
    cdf.legend(fontsize="small")
    fig.suptitle(f"Round time (measured rounds) — {title}")
    _save(fig, target)
    return None


def _link_throughput(target: Path, title: str, rounds: list[dict[str, Any]], by_type: dict) -> str | None:
    series: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    source = "agents' byte counters"
    for r in by_type["throughput"]:
        series[(r["src"], r["dst"])].append((float(r["at"]), float(r["mbps"])))
    if max((len(p) for p in series.values()), default=0) < 3:  # schema 1, or a run shorter than a few points
        series.clear()
        source = "passive chunk samples"
        for r in by_type["link_sample"]:
            if r["seconds"] > 0:
                series[(r["src"], r["dst"])].append((float(r["t"]), r["bytes"] * 8 / r["seconds"] / 1e6))
    if not series:
        return "no throughput or link_sample records"
    t0 = min(t for pts in series.values() for t, _ in pts)
    if by_type["round"] or by_type["task"]:
        t0 = min(t0, min(float(r["t_start"]) for r in by_type["round"] + by_type["task"]))
    # counters are a continuous series (lines); passive samples are discrete chunk measurements (dots)
    style = {"lw": 1.4} if source.startswith("agents") else {"ls": "none", "marker": "o", "ms": 3}
    volume = {k: sum(m for _, m in pts) for k, pts in series.items()}
    top = sorted(series, key=lambda k: -volume[k])[:TOP_LINKS]
    fig, ax = plt.subplots(figsize=(11, 4.8))
    for k, pts in series.items():
        if k not in top:
            ax.plot([t - t0 for t, _ in pts], [m for _, m in pts], color="0.8", zorder=1, **style)
    for k in top:
        pts = sorted(series[k])
        ax.plot([t - t0 for t, _ in pts], [m for _, m in pts], label=f"{k[0]}→{k[1]}", zorder=2, **style)
    _shade_jobs(ax, rounds, by_type, t0)
    ax.set_xlabel("time since the run started (s)")
    ax.set_ylabel("throughput (Mbit/s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    others = len(series) - len(top)
    ax.legend(fontsize="small", ncol=2, loc="upper right",
              title=f"busiest {len(top)} links" + (f" (+{others} in grey)" if others else ""))
    ax.set_title(f"Throughput per link over time ({source}) — {title}")
    _save(fig, target)
    return None


def _shade_jobs(ax: Any, rounds: list[dict[str, Any]], by_type: dict, t0: float) -> None:
    """Each scheme's span as a band with its name: throughput reads against the scheme that made it."""
    spans: dict[tuple[int, str], list[float]] = {}
    for r in by_type["round"] + by_type["task"]:
        s = spans.setdefault((r["job"], r["scheme"]), [float(r["t_start"]), float(r["t_end"])])
        s[0], s[1] = min(s[0], float(r["t_start"])), max(s[1], float(r["t_end"]))
    for i, ((_, scheme), (a, b)) in enumerate(sorted(spans.items(), key=lambda kv: kv[1][0])):
        ax.axvspan(a - t0, b - t0, color=f"C{i % 10}", alpha=0.07, zorder=0)
        ax.text((a + b) / 2 - t0, 0.98, scheme, transform=ax.get_xaxis_transform(), ha="center", va="top",
                fontsize="small", color="0.3")


def _speedup(target: Path, title: str, rounds: list[dict[str, Any]], by_type: dict) -> str | None:
    times = _schemes(rounds)
    if BASELINE not in times:
        return f"no {BASELINE} rounds in the file (run with --schemes {BASELINE},...)"
    base = statistics.median(times[BASELINE])
    names = list(times)
    speed = [base / statistics.median(times[n]) for n in names]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(names) + 2), 4.2))
    bars = ax.bar(names, speed, color=[f"C{i % 10}" for i in range(len(names))])
    ax.axhline(1.0, color="0.3", lw=1, ls="--")
    for b, s in zip(bars, speed, strict=True):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{s:.2f}×", ha="center", va="bottom")
    ax.set_ylabel(f"speedup over {BASELINE} (median round time)")
    ax.set_title(f"Speedup over the {BASELINE} baseline (median {base:.3f} s)\n{title}", fontsize="medium")
    ax.set_ylim(0, max(speed) * 1.18)
    _save(fig, target)
    return None


def task_outcome(r: dict[str, Any]) -> str:
    """exact, failed (ended, not exact) or aborted (no attempt could end exact), as the dashboard says."""
    if r.get("aborted"):
        return "aborted"
    return "exact" if r.get("ok") and r.get("digests_agree") else "failed"


def overlap_max(spans: list[tuple[float, float]]) -> int:
    """The most intervals sharing one moment (one ending as another starts does not count)."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def _task_timelines(target: Path, title: str, rounds: list[dict[str, Any]], by_type: dict) -> str | None:
    """Per tasks job: one bar per task from its start to its end (coloured by outcome), and per node
    the parts it ran (agents' own clocks; overlapping parts darken: tasks that shared the agent)."""
    jobs: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in by_type["task"]:
        jobs[(r["job"], r["scheme"])].append(r)
    if not jobs:
        return "no tasks job in the file (BSP jobs' rounds are in the round-time figure)"
    fig, axes = plt.subplots(len(jobs), 2, figsize=(13, 3.6 * len(jobs)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    for (bars, nodes), ((job, scheme), recs) in zip(axes, sorted(jobs.items()), strict=True):
        recs = sorted(recs, key=lambda r: (float(r["t_start"]), r["task"]))[:TIMELINE_TASKS_MAX]
        t0 = min(float(r["t_start"]) for r in recs)
        colors = [OUTCOME_COLOR[task_outcome(r)] for r in recs]
        starts = [float(r["t_start"]) - t0 for r in recs]
        widths = [max(float(r["t_end"]) - float(r["t_start"]), 0.0) for r in recs]
        ys = [r["task"] for r in recs]
        bars.barh(ys, widths, left=starts, height=0.8, color=colors, linewidth=0)
        aborted = [(s, y) for s, y, r in zip(starts, ys, recs, strict=True) if r.get("aborted")]
        if aborted:  # an abandoned task has no span of its own: a mark where it was given up
            bars.scatter([s for s, _ in aborted], [y for _, y in aborted], marker="x", color=OUTCOME_COLOR["aborted"])
        bars.yaxis.set_major_locator(MaxNLocator(integer=True))
        bars.margins(x=0.03)
        bars.invert_yaxis()
        bars.set_xlabel("time since the job's first task started (s)")
        bars.set_ylabel("task")
        counts = {k: sum(1 for r in recs if task_outcome(r) == k) for k in OUTCOME_COLOR}
        bars.set_title(f"job {job} ({scheme}): {len(recs)} tasks, "
                       + ", ".join(f"{n} {k}" for k, n in counts.items() if n), fontsize="medium")
        bars.legend(handles=[Patch(color=c, label=k) for k, c in OUTCOME_COLOR.items()], fontsize="small",
                    loc="lower right")
        bars.grid(axis="x", alpha=0.3)
        per_node: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for r in recs:
            for n, (a, b) in (r.get("spans") or {}).items():
                per_node[int(n)].append((float(a) - t0, float(b) - t0))
        for n, sp in per_node.items():
            nodes.broken_barh([(a, max(b - a, 0.0)) for a, b in sp], (n - 0.4, 0.8), color="C0", alpha=0.25,
                              linewidth=0)
            nodes.text(1.01, n, f"max {overlap_max(sp)} at once", transform=nodes.get_yaxis_transform(), va="center",
                       fontsize="x-small", color="0.3")
        nodes.set_xlim(bars.get_xlim())  # the same clock as the tasks beside it
        nodes.set_yticks(sorted(per_node))
        nodes.invert_yaxis()
        nodes.set_xlabel("time (s)")
        nodes.set_ylabel("node")
        nodes.set_title("each node's parts (darker: tasks sharing the agent)", fontsize="medium")
        nodes.grid(axis="x", alpha=0.3)
    fig.suptitle(f"Task timelines — {title}")
    _save(fig, target)
    return None


def _save(fig: Any, target: Path) -> None:
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)
