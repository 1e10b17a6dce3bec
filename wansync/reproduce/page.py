"""A paper's results page (DIR/index.md): headed by the command, commit and machine that made it and the
files it depends on, then the manifest's rows beside our medians, then per experiment its table and figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .manifest import Row
from .registry import Experiment
from .summary import fmt, markdown

HEADER = "<!-- wansync-results paper={paper} commit={commit} -->"


def quoted(summary: dict[str, Any] | None, key: str, row: Row | None = None) -> str:
    """An experiment's figure over its cells (those the row names): `cell: median [lo, hi]`."""
    if not summary or not key:
        return "-"
    parts = []
    for c in summary["cells"]:
        if row is not None and not row.matches(c["cell"]):
            continue
        f = c["figures"].get(key)
        if f is None:
            continue
        where = ", ".join(f"{k}={v}" for k, v in c["cell"].items()) or "-"
        parts.append(f"{where}: {fmt(f['median'])}" + (f" [{fmt(f['lo'])}, {fmt(f['hi'])}]" if f["n"] > 1 else ""))
    return "; ".join(parts[:8]) + (" …" if len(parts) > 8 else "") if parts else "no valid run"


def render(paper: str, meta: dict[str, Any], exps: dict[str, Experiment], summaries: dict[str, dict[str, Any]],
           rows: list[Row], figures: dict[str, str]) -> str:
    lines = [HEADER.format(paper=paper, commit=meta["commit"]), f"# Results: {meta.get('title', paper)}", "",
             "- command: " + "; then ".join(f"`{c}`" for c in meta.get("commands", [meta["command"]])),
             f"- commit: `{meta['commit']}`" + (
                 " (the working tree differed from it in a file these results depend on)" if meta.get("dirty") else ""),
             f"- machine: {meta['machine']}",
             "- depends on: " + ", ".join(f"`{s}`" for s in meta["sources"]),
             f"- runs: `runs.jsonl` ({meta['runs']} lines), summaries: `summary.json`",
             "", "Median across seeds; the interval is a pair of order statistics with its exact binomial "
             "coverage of the median ([Reproducing](../../reproduce.md) says how). Ratios are divided per seed, "
             "then summarized. Invalid runs are listed under their table and never summarized.", ""]
    if rows:
        lines += ["## The paper's rows", "", "| id | paper | paper's value | paper's setting | our setting | status "
                  "| ours |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            ours = (quoted(summaries.get(r.experiment), r.key, r) if r.status == "reproduced"
                    else f"declined: {r.reason}")
            cells = [r.id, r.figure, r.paper_value, r.paper_setting, r.our_setting,
                     r.status + (f" (`{r.experiment}`)" if r.experiment else ""), ours]
            lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
        lines.append("")
    lines += ["## Experiments", ""]
    for eid, exp in exps.items():
        s = summaries.get(eid)
        if not s or not s["runs"]:
            continue
        lines += [f"### {eid}", "", exp.title + ("" if not exp.shape else f". Paper: {exp.shape}"), "",
                  markdown(s, exp.columns(), title=f"{eid} ({'live' if exp.live else 'simulated'})")]
        if eid in figures:
            lines += [f"![{eid}]({figures[eid]})", ""]
    return "\n".join(lines).rstrip() + "\n"


def header_of(path: Path) -> dict[str, str]:
    """The paper and commit in a page's first line ({} when it has none)."""
    try:
        first = path.read_text().splitlines()[0]
    except (OSError, IndexError):
        return {}
    if not first.startswith("<!-- wansync-results "):
        return {}
    return dict(kv.split("=", 1) for kv in first.removeprefix("<!-- wansync-results ").removesuffix(" -->").split())
