"""The end of a run: each job summarized (one record of the results file) and the table printed."""

from __future__ import annotations

import statistics
from typing import Any

from rich.console import Console
from rich.table import Table

from scheduler.service import JobState

from .guard import fidelity_cell, job_guard
from .planinfo import info_line
from .runspec import RunConfig


def summarize(js: JobState, cfg: RunConfig) -> dict[str, Any]:
    recs = [r for r in js.records if not r.warmup] or js.records
    times = [r.round_s for r in recs]
    med = statistics.median(times)
    links = []
    for node, st in js.stats.items():
        for dst, link in st["links"].items():
            links.append((link["bytes"], f"{node}->{dst}", link.get("busy_s", 0.0)))
    links.sort(reverse=True)
    g = job_guard(js)
    lag = max((st["loop_lag_p99_s"] for st in js.stats.values()), default=0.0)
    lag_busy = max((st.get("loop_lag_busy_p99_s", 0.0) for st in js.stats.values()), default=0.0)
    cpu = {n: st["cpu_s"] / st["wall_s"] if st["wall_s"] else 0.0 for n, st in js.stats.items()}
    preds = [r.prediction_s for r in recs if r.prediction_s is not None]
    return {"job": js.job, "scheme": js.scheme, "progress": cfg.options.progress["model"], "rounds": len(recs),
            "round_s_median": med,
            "prediction_s_median": statistics.median(preds) if preds else None, "round_s_min": min(times),
            "round_s_max": max(times), "algbw_MBps": cfg.params * 4 / med / 1e6,
            "all_exact": all(r.ok and r.digests_agree and r.versions_agree for r in js.records),
            "versions": sorted({r.version for r in js.records}), "policy_s": js.policy_s,
            "busiest_links": [{"link": n, "bytes": b, "busy_s": s} for b, n, s in links[:3]],
            # guard_valid: true only if judged valid; false if invalid; null if unjudged
            "guard_valid": g.valid, "guard_verdict": g.verdict, "guard_reasons": g.reasons,
            "guard_worst_ratio": g.worst_ratio, "guard_bad_links": g.bad, "guard_judged": g.judged,
            "loop_lag_p99_s": lag, "loop_lag_busy_p99_s": lag_busy, "cpu_share": cpu,
            "loop_cpu_share": {n: st.get("loop_cpu_share") for n, st in js.stats.items()},
            # overheads (NetStorm §6): topology-request wait, policy compute and bytes, held frames, aux share
            "trp_wait_s_median": statistics.median(r.trp_wait_s for r in recs), "replans": js.replans,
            "aux_updates": js.aux_updates,
            "stashed_frames": sum(st.get("stashed_frames", 0) for st in js.stats.values()),
            "aux_share": (sum(st.get("aux_bytes", 0) for st in js.stats.values())
                          / max(1, sum(st.get("sent_bytes", 0) for st in js.stats.values()))),
            "view_coverage": recs[-1].coverage, "plan_info": dict(js.plan.info)}


def print_table(console: Console, jobs: list[JobState], cfg: RunConfig) -> None:
    mb = cfg.params * 4 / 1e6
    o = cfg.options
    t = Table(title=f"{cfg.topo.name}, {cfg.topo.nodes} nodes, {o.workload['model']} x{o.wan['scale']} = {mb:.1f} "
                    f"MB, {o.workload['rounds']} rounds (+{o.workload['warmup']} warm-up) per scheme")
    for col in ("scheme", "median s", "min s", "max s", "sim s", "algbw MB/s", "exact", "busiest links (MB)",
                "fidelity"):
        t.add_column(col, justify="right" if col.endswith(("s", "MB/s")) else "left")
    for js in jobs:
        s = summarize(js, cfg)
        busiest = ", ".join(f"{x['link']} {x['bytes'] / 1e6:.1f}" for x in s["busiest_links"])
        fid = fidelity_cell(s)
        sim = "-" if s["prediction_s_median"] is None else f"{s['prediction_s_median']:.3f}"
        t.add_row(js.scheme, f"{s['round_s_median']:.3f}", f"{s['round_s_min']:.3f}", f"{s['round_s_max']:.3f}", sim,
                  f"{s['algbw_MBps']:.2f}", "yes" if s["all_exact"] else "[bold red]NO[/]", busiest, fid)
    Console(width=max(console.width, 150)).print(t)
    for js in jobs:
        if line := info_line(js.scheme, js.plan.info):
            console.print(line, highlight=False, soft_wrap=True)
