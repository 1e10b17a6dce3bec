"""The `auto` figure of `wansync plot`: what each auto decision expected of every candidate, against
what the rounds took live. One panel per auto job: a step line per candidate (its expected round time
at each decision: the simulator's prediction times the live ratio auto learned), a dot per live round
in the colour of the scheme it ran, and the switches marked."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def auto_figure(target: Path, title: str, rounds: list[dict[str, Any]], by_type: dict) -> str | None:
    decisions: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in by_type.get("event", []):
        if e.get("kind") == "auto" and isinstance(e.get("data"), dict) and "job" in e["data"]:
            decisions[int(e["data"]["job"])].append({"at": float(e["at"]), **e["data"]})
    if not decisions:
        return "no auto decisions (a run with --schemes auto records them)"
    plans = {int(p["version"]): str(p["scheme"]) for p in by_type.get("plan", [])}
    every = by_type.get("round", []) + by_type.get("task", [])
    jobs = sorted(decisions)
    fig, axes = plt.subplots(len(jobs), 1, figsize=(10, 3.6 * len(jobs)), squeeze=False)
    for ax, job in zip(axes[:, 0], jobs, strict=True):
        ds = sorted(decisions[job], key=lambda d: d["at"])
        mine = sorted((r for r in every if r.get("job") == job), key=lambda r: r["t_end"])
        t0 = min([ds[0]["at"], *(r["t_start"] for r in mine)])
        lines: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
        for d in ds:
            for c in d["candidates"]:
                expect = c.get("expected_s") or c.get("round_s")
                if expect:
                    xs, ys = lines[c["scheme"]]
                    xs.append(d["at"] - t0)
                    ys.append(expect)
        end = max([ds[-1]["at"], *(r["t_end"] for r in mine)]) - t0
        colors = {}
        for scheme, (xs, ys) in sorted(lines.items()):
            (ln,) = ax.step([*xs, end], [*ys, ys[-1]], where="post", lw=1.2, alpha=0.8, label=f"{scheme} expected")
            colors[scheme] = ln.get_color()
        for r in mine:
            ran = plans.get(int(r.get("version", -1)), "?")
            ax.scatter(r["t_end"] - t0, r["round_s"], s=14, color=colors.get(ran, "black"), zorder=3)
        for d in ds:
            if d.get("switched"):
                ax.axvline(d["at"] - t0, color="grey", ls=":", lw=1)
                ax.annotate(f"-> {d['chosen']}", (d["at"] - t0, ax.get_ylim()[1]), fontsize=8, va="top")
        ax.set_yscale("log")
        ax.set_xlabel("seconds since the job began")
        ax.set_ylabel("round time (s)")
        ax.set_title(f"job {job}: auto's expectations (lines) and live rounds (dots, coloured by the scheme run)",
                     fontsize=9)
        ax.legend(fontsize=7, ncol=3)
    fig.suptitle(f"auto decisions — {title}")
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return None
