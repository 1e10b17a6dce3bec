"""`wansync reproduce PAPER`: run every (experiment, cell, seed) not yet in DIR/runs.jsonl, one line each,
with a progress bar on stderr; then per experiment the summary, its table and its figure, and the page."""

from __future__ import annotations

import json
import shlex
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import provenance, runlog
from .figure import draw
from .manifest import load
from .page import render
from .registry import Experiment, experiments, sources
from .summary import summarize

DEFAULT_SEEDS = {True: 3, False: 10}  # --quick, full
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def plan(exps: dict[str, Experiment], quick: bool, seeds: int) -> list[tuple[Experiment, dict[str, Any], int]]:
    """Every run of the campaign: seeded experiments over seeds 1..K, the others once (seed 1)."""
    return [(e, cell, s) for e in exps.values() for cell in e.cells_for(quick)
            for s in (range(1, seeds + 1) if e.seeded else (1,))]


def run_one(exp: Experiment, cell: dict[str, Any], seed: int) -> dict[str, Any]:
    """One run's figures; an exception is an invalid run with its reason (the campaign goes on)."""
    try:
        figures = dict(exp.fn(dict(cell), seed))
    except Exception as exc:  # noqa: BLE001 - recorded as an invalid run, shown on the page
        figures = {"valid": False, "reason": f"{type(exc).__name__}: {exc}"[:300],
                   "traceback": traceback.format_exc(limit=3)[-600:]}
    figures.setdefault("valid", True)
    figures["live"] = bool(figures.get("live", exp.live))
    return figures


def reproduce(paper: str, *, quick: bool = False, seeds: int | None = None, out: Path | None = None,
              only: list[str] | None = None, console: Console | None = None, argv: list[str] | None = None) -> int:
    con = console or Console(stderr=True)
    exps = experiments(paper)
    if only:
        unknown = [e for e in only if e not in exps]
        if unknown:
            raise KeyError(f"{paper} has no experiment {', '.join(unknown)} (it has {', '.join(exps)})")
        exps = {k: v for k, v in exps.items() if k in only}
    seeds = seeds or DEFAULT_SEEDS[quick]
    out = out or Path(f"wansync-reproduce-{paper}")
    path = out / runlog.RUNS
    done = runlog.done(path)
    todo = [(e, c, s) for e, c, s in plan(exps, quick, seeds) if runlog.run_key(e.id, c, s) not in done]
    srcs = sources(paper)
    head = {"paper": paper, "commit": provenance.commit(), "dirty": provenance.dirty(srcs),
            "machine": provenance.machine(), "quick": quick}
    con.print(f"{paper}: {len(todo)} runs to do, {len(done)} already in {path}")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=con, transient=False) as bar:
        task = bar.add_task(paper, total=len(todo))
        for exp, cell, seed in todo:
            bar.update(task, description=f"{exp.id} {runlog.cell_key(cell)} seed {seed}")
            t0 = time.time()
            figures = run_one(exp, cell, seed)
            runlog.append(path, {**head, "experiment": exp.id, "cell": cell, "seed": seed, "figures": figures,
                                 "wall_s": round(time.time() - t0, 3), "at": round(t0, 1)})
            bar.advance(task)
    write_results(paper, out, argv)
    bad = [r for r in runlog.read(path) if not r["figures"].get("valid")]
    con.print(f"{paper}: results in {out} ({len(bad)} invalid run(s))")
    return 0


def write_results(paper: str, out: Path, argv: list[str] | None = None) -> dict[str, Any]:
    """summary.json, a PNG per experiment and index.md, from what runs.jsonl holds."""
    runs = runlog.read(out / runlog.RUNS)
    exps = experiments(paper)
    summaries = {e.id: summarize(paper, e.id, e.ratios, runs) for e in exps.values()}
    summaries = {k: v for k, v in summaries.items() if v["runs"]}
    commits = sorted({r["commit"] for r in runs if r.get("commit")}, key=lambda c: min(
        r["at"] for r in runs if r.get("commit") == c))
    meta = {"paper": paper, "title": paper, "command": "wansync reproduce " + shlex.join(argv or [paper]),
            "commit": commits[0] if commits else "", "commits": commits,
            "dirty": any(r.get("dirty") for r in runs), "machine": runs[-1]["machine"] if runs else "",
            "sources": sources(paper), "runs": len(runs)}
    old = out / "summary.json"
    before = json.loads(old.read_text()).get("meta", {}) if old.exists() else {}
    commands = before.get("commands") or ([before["command"]] if before.get("command") else [])
    if argv is not None and meta["command"] not in commands:  # every invocation that added runs, in order
        commands.append(meta["command"])
    meta["commands"] = commands or [meta["command"]]
    meta["command"] = meta["commands"][-1]
    (out / "summary.json").write_text(json.dumps({"meta": meta, "experiments": summaries}, indent=1,
                                                 sort_keys=True) + "\n")
    figures = {}
    for eid, s in summaries.items():
        if draw(exps[eid], s, out / f"{eid}.png") is not None:
            figures[eid] = f"{eid}.png"
    manifest = out / "manifest.toml"
    if not manifest.exists():
        manifest = RESULTS / paper / "manifest.toml"
    rows = load(manifest) if manifest.exists() else []
    meta["title"] = {"netstorm": "NetStorm (seed 002)", "packing": "Tree packing (seed 001)",
                     "selmcast": "SelMcast (seed 000)", "selective": "Selective reduce (seed 003)",
                     "crew": "CREW (seed 004)"}.get(paper, paper)
    (out / "index.md").write_text(render(paper, meta, exps, summaries, rows, figures))
    return summaries


def main(args: Any) -> int:
    """The CLI verb (wansync/cli.py parses, this runs)."""
    only = [x for x in (args.only or "").split(",") if x] or None
    argv = [args.paper] + (["--quick"] if args.quick else []) + ([f"--seeds={args.seeds}"] if args.seeds else []) \
        + ([f"--only={args.only}"] if args.only else []) + ([f"--out={args.out}"] if args.out else [])
    try:
        return reproduce(args.paper, quick=args.quick, seeds=args.seeds, out=args.out, only=only, argv=argv)
    except KeyError as exc:
        print(f"wansync reproduce: {exc.args[0]}", file=sys.stderr)
        return 2
