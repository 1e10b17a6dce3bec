"""Selective reduce (seed 003): scripts/bench/selreduce.py's simulated run (`run_sim`, the paper's scale)
swept as the paper's figures, and its live SR-vs-P-Reduce run (`LiveBench`, 16 agents) at the quick
setting."""

from __future__ import annotations

import argparse
import asyncio
import io
from dataclasses import replace
from typing import Any

from rich.console import Console

from ..benches import bench
from ..registry import Experiment, register

# sim/ runs the simulated experiments, agents/ (the chunk engine) the live one; P-Reduce is the queue model
SOURCES = ["scripts/bench/selreduce.py", "core/selective.py", "scheduler/progress/selective.py",
           "scheduler/progress/queue.py", "scheduler/planners/ring.py", "sim/", "agents/"]
PAPER = "selective"
SWEEP_N = 120  # selreduce.SWEEP_N (A19: the sweeps' n is not stated)
KEYS = {"sync_s": "mean_sync_s", "scale": "mean_scale", "iterations": "iterations_per_worker", "syncs": "syncs",
        "wasted_wait_pct": "wasted_wait_pct", "starvation_s": "starvation_s"}


def sim(schemes: tuple[str, ...]) -> Any:
    """A run of the simulated setting: every scheme on the same seed's bandwidths and compute draws."""
    def run(cell: dict[str, Any], seed: int) -> dict[str, Any]:
        sr = bench("selreduce")
        over = {k: v for k, v in cell.items() if k != "n"}
        out: dict[str, Any] = {"valid": True, "live": False}
        for sch in schemes:
            s = sr.run_sim(replace(sr.SimCase(cell["n"], seed, sch), **over))
            out |= {f"{sch}_{k}": s[v] for k, v in KEYS.items()}
        if "sr" in schemes and out.get("sr_scale") is not None:
            out["sr_scale_over_p"] = out["sr_scale"] / sr.p_of(cell["n"], cell.get("p_frac", sr.P_FRACTION))
        return out
    return run


RATIOS = (("pr_over_sr_sync", "pr_sync_s", "sr_sync_s"), ("ar_over_sr_sync", "ar_sync_s", "sr_sync_s"),
          ("sr_over_pr_iterations", "sr_iterations", "pr_iterations"))
PAIR = RATIOS[:1] + RATIOS[2:]

register(Experiment(PAPER, "sync_vs_n", "Fig. 5 (CNN-like): avg sync time, scale, iterations vs n",
                    sim(("sr", "pr", "ar")),
                    [{"n": n} for n in (40, 80, 120, 160, 200)], "n", ("sr_sync_s+pr_sync_s+ar_sync_s",
                                                                        "pr_over_sr_sync"),
                    quick_cells=[{"n": 40}, {"n": 80}], ratios=RATIOS,
                    table=("sr_sync_s", "pr_sync_s", "ar_sync_s", "pr_over_sr_sync", "sr_scale_over_p",
                           "sr_over_pr_iterations", "sr_wasted_wait_pct"),
                    shape="AR and PR rise with n, SR flat or falling, SR < PR < AR; SR scale up to 1.25 p"))
register(Experiment(PAPER, "transformer_vs_n", "Fig. 6 (Transformer-like stand-in): avg sync time vs n",
                    sim(("sr", "pr", "ar")),
                    [{"n": n, "compute": "transformer:mean=0.5"} for n in (40, 80, 120, 160, 200)], "n",
                    ("sr_sync_s+pr_sync_s+ar_sync_s", "pr_over_sr_sync"),
                    quick_cells=[{"n": 40, "compute": "transformer:mean=0.5"}], ratios=RATIOS,
                    table=("sr_sync_s", "pr_sync_s", "ar_sync_s", "pr_over_sr_sync", "sr_scale_over_p"),
                    shape="as Fig. 5: SR < PR < AR"))


def sweep(eid: str, title: str, attr: str, values: list[Any], quick: list[Any], shape: str,
          schemes: tuple[str, ...] = ("sr", "pr")) -> None:
    ratios = RATIOS if "ar" in schemes else PAIR
    register(Experiment(PAPER, eid, title, sim(schemes), [{"n": SWEEP_N, attr: v} for v in values], attr,
                        ("+".join(f"{s}_sync_s" for s in schemes), "sr_scale_over_p", "pr_over_sr_sync"),
                        quick_cells=[{"n": SWEEP_N, attr: v} for v in quick], ratios=ratios,
                        table=(*(f"{s}_sync_s" for s in schemes), "pr_over_sr_sync", "sr_scale_over_p",
                               "sr_over_pr_iterations", "sr_syncs", "sr_wasted_wait_pct"), shape=shape))


sweep("p_sweep", "Fig. 8: p/n at n = 120", "p_frac", [0.1, 0.2, 0.3, 0.4, 0.5], [0.1, 0.3, 0.5],
      "at p = 0.5 n total sync and iterations collapse")
sweep("eta_sweep", "Fig. 9: eta at n = 120", "eta", [0.0, 0.1, 0.3, 0.5, 0.8], [0.0, 0.8],
      "scale rises with eta; SR beats PR at every eta")
sweep("theta_sweep", "Fig. 10: theta at n = 120", "theta", [1.0, 5.0, 10.0, 20.0], [1.0, 20.0],
      "not very sensitive")
sweep("warm_cold", "Fig. 11: warm vs cold start at n = 120", "warm", [True, False], [True, False], "no visible gap")
sweep("bw_error", "Fig. 12: bandwidth error e at n = 120", "bw_error", [0.0, 0.1, 0.2, 0.3, 0.5], [0.0, 0.5],
      "sync time rises slightly, scale falls marginally")
sweep("lambda_sweep", "Fig. 13: skew lambda at n = 120", "lam", [0.05, 0.1, 0.2], [0.05, 0.2],
      "SR beats PR at every lambda; the gain grows as lambda falls")
sweep("alpha_sweep", "Fig. 14: latency alpha at n = 120", "alpha", [0.0, 0.001, 0.005, 0.05], [0.0, 0.05],
      "scale unaffected; sync time rises with alpha, fastest for AR", schemes=("sr", "pr", "ar"))


def live_quick(cell: dict[str, Any], seed: int) -> dict[str, Any]:
    """selreduce.py's live run (16 agents, MLP on digits) for SR and P-Reduce alone, `budget` s each."""
    sr = bench("selreduce")
    args = argparse.Namespace(quick=True, seed=seed, budget=float(cell["budget"]), compute_mean=0.2, live_p=None,
                              eval_s=2.0, out=None, agent_logs=None, verbose=False,
                              schemes=tuple(cell["schemes"].split(",")))
    b = sr.LiveBench(args)
    asyncio.run(b.run())
    res = sr.live_figures(b, Console(file=io.StringIO(), width=160))
    sync, its = res["live_avg_sync_s"], res["live_iterations_per_worker"]
    acc, err = res["live_accuracy_at_budget"], res["sim_vs_live_err_pct"]
    valid = res["syncs_wrong"] == 0 and bool(res.get("live_guard_valid"))
    return {"valid": valid, "live": True, "reason": "" if valid else (
                f"syncs wrong {res['syncs_wrong']}, guard {res.get('live_guard_reason', res.get('live_guard_valid'))}"),
            "sr_sync_s": sync.get("sr-iid"), "pr_sync_s": sync.get("pr-iid"), "sr_iterations": its.get("sr-iid"),
            "pr_iterations": its.get("pr-iid"), "sr_accuracy": acc.get("sr"), "pr_accuracy": acc.get("pr"),
            "sr_sim_err_pct": err.get("sr"), "pr_sim_err_pct": err.get("pr"), "syncs": res["live_syncs"],
            "syncs_wrong": res["syncs_wrong"], "guard_valid": bool(res.get("live_guard_valid"))}


LIVE_CELL = {"budget": 35.0, "schemes": "sr,pr"}  # selreduce.py --quick's budget (QUICK_BUDGET_S)
register(Experiment(PAPER, "live_quick", "live: SR vs P-Reduce, 16 agents, MLP on digits, 35 s each (selreduce.py "
                    "--quick's setting)", live_quick, [LIVE_CELL], "schemes",
                    ("sr_over_pr_sync", "sr_sync_s+pr_sync_s"),
                    ratios=(("sr_over_pr_sync", "sr_sync_s", "pr_sync_s"),
                            ("sr_over_pr_iterations", "sr_iterations", "pr_iterations")),
                    live=True, table=("sr_over_pr_sync", "sr_sync_s", "pr_sync_s", "sr_over_pr_iterations",
                                      "sr_accuracy", "pr_accuracy", "syncs"),
                    shape="SR's sync time below P-Reduce's (abstract: up to 2.55x lower)"))
