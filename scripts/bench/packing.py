"""Tree packing (seed 001) against the LP bound and the other schemes: simulated on internet2 seeds
0-4 and GPU meshes, live on internet2 and on a dense measured mesh, and the LP's solve times.

Every figure against T_LP = S / sum chi, the packing LP's round time on the configured rates (issue
18's definitions), and lambda, the smallest directed cut. Prints tables; the last line is one JSON
object of headline figures (../shared/checks/packing judges it).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agents.workload import model_params  # noqa: E402
from emulation.topology import Topology, build, internet2  # noqa: E402
from scheduler.planners.packing_lp import pack  # noqa: E402
from scheduler.service import JobState  # noqa: E402
from wansync.cluster import RunConfig, run  # noqa: E402
from wansync.guard import live_guard  # noqa: E402
from wansync.predict import predict  # noqa: E402

SEEDS = range(5)
MODEL, SCALE = "resnet50", 0.05  # the size: ResNet-50 x 0.05 (5.1 MB)
SIM_SCHEMES = ["packing", "netstorm", "mst", "ring", "star", "shardps", "blink"]
GPU_INTER_GBPS = (10, 25, 40, 100)
GPU_BASELINES = ["shardps", "ring", "blink", "dbtree", "plink"]
GPU_MB = 64  # the GPU-mesh size: fluid times scale with S / b, so the ratios do not depend on it
LIVE_JOBS: list[JobState] = []
console = Console(width=150)


def sim_internet2(quick: bool) -> dict[str, Any]:
    """Seeds 0-4: every scheme simulated blind (the data plane's measured costs), against T_LP."""
    params = model_params(MODEL, SCALE)
    t = Table(title=f"internet2, {MODEL} x{SCALE} = {params * 4 / 1e6:.1f} MB, simulated (round s; x T_LP)")
    for col in ("seed", "lambda Mbit/s", "sum chi", "T_LP s", "S/lambda s", *SIM_SCHEMES, "packing x T_LP",
                "netstorm / packing", "solve s", "trees"):
        t.add_column(col, justify="right")
    ratios, speedups, solves = [], [], []
    for seed in SEEDS:
        topo = internet2(seed=seed).scaled(SCALE)
        preds = {p.scheme: p for p in predict(topo, None, SIM_SCHEMES, params, max(1024, round(1e6 * SCALE)))}
        info = preds["packing"].plan.info
        rounds = {s: p.prediction.round_s for s, p in preds.items()}
        ratios.append(rounds["packing"] / info["t_lp_s"])
        speedups.append(rounds["netstorm"] / rounds["packing"])
        solves.append(info["solve_s"])
        t.add_row(str(seed), f"{info['lambda']:.1f}", f"{info['sum_chi']:.1f}", f"{info['t_lp_s']:.3f}",
                  f"{info['s_over_lambda_s']:.3f}", *(f"{rounds[s]:.3f}" for s in SIM_SCHEMES),
                  f"{ratios[-1]:.3f}", f"{speedups[-1]:.2f}", f"{info['solve_s']:.3f}", str(info["trees"]))
    console.print(t)
    return {"packing_vs_lp_max": max(ratios), "packing_vs_lp_median": statistics.median(ratios),
            "speedup_vs_netstorm_min": min(speedups), "speedup_vs_netstorm_median": statistics.median(speedups),
            "solve_s_internet2": max(solves)}


def solve_times(quick: bool) -> dict[str, Any]:
    """The LP alone on dense meshes: solve seconds and the remaining LP gap."""
    out: dict[str, Any] = {}
    sizes = (16,) if quick else (16, 30)
    t = Table(title="packing LP on heterogeneous full meshes (hetero:N, 20-155 Mbit/s)")
    for col in ("nodes", "links", "sum chi", "lambda", "trees", "iterations", "LP gap %", "solve s"):
        t.add_column(col, justify="right")
    for n in sizes:
        topo = build("hetero", nodes=n, seed=1)
        pk = pack({k: v.rate_mbps for k, v in topo.links.items()}, range(n))
        t.add_row(str(n), str(len(topo.links)), f"{pk.sum_chi:.1f}", f"{pk.lam:.1f}", str(pk.trees),
                  str(pk.iterations), f"{pk.gap_pct:.3f}", f"{pk.solve_s:.2f}")
        out[f"solve_s_mesh{n}"] = pk.solve_s
        out[f"lp_gap_mesh{n}_pct"] = pk.gap_pct
    console.print(t)
    return out


def gpu_mesh() -> dict[str, Any]:
    """The paper's Fig. 4 shape on a 4x4 GPU mesh: packing against the best of its baselines."""
    params = GPU_MB * 250_000
    t = Table(title=f"4x4 GPU mesh (PCIe 100 Gbps inside a machine), {GPU_MB} MB, simulated round ms")
    for col in ("inter Gbps", "packing", *GPU_BASELINES, "best baseline", "speedup", "T_LP ms"):
        t.add_column(col, justify="right")
    speedups = []
    for g in GPU_INTER_GBPS:
        topo = build(f"gpumesh:4x4:inter={g}")
        preds = {p.scheme: p for p in predict(topo, None, ["packing", *GPU_BASELINES], params, params // 64)}
        r = {s: p.prediction.round_s for s, p in preds.items()}
        best = min(GPU_BASELINES, key=lambda s: r[s])
        speedups.append(r[best] / r["packing"])
        t.add_row(str(g), f"{1e3 * r['packing']:.2f}", *(f"{1e3 * r[s]:.2f}" for s in GPU_BASELINES), best,
                  f"{speedups[-1]:.2f}", f"{1e3 * preds['packing'].plan.info['t_lp_s']:.2f}")
    console.print(t)
    return {"gpu_mesh_speedup": [round(x, 3) for x in speedups]}


def live(topo: Topology, name: str, schemes: list[str], rounds: int, scale: float) -> dict[str, JobState]:
    cfg = RunConfig(topology=name, topo=topo.scaled(scale), schemes=schemes, model=MODEL, scale=scale,
                    rounds=rounds, warmup=1)
    jobs = asyncio.run(run(cfg, console=Console(file=io.StringIO(), width=150), show_table=False))
    LIVE_JOBS.extend(jobs)
    for js in jobs:
        if not all(r.ok and r.digests_agree and r.versions_agree for r in js.records):
            raise SystemExit(f"{name} {js.scheme}: a round was not exact")
    return {js.scheme: js for js in jobs}


def t_lp(topo: Topology, params: int) -> float:
    pk = pack({k: v.rate_mbps for k, v in topo.links.items()}, range(topo.nodes))
    return params * 32 / (pk.sum_chi * 1e6)


def live_runs(quick: bool) -> dict[str, Any]:
    rounds = 4 if quick else 10
    params = model_params(MODEL, SCALE)
    out: dict[str, Any] = {}
    t = Table(title="live (application backend): median round s [min-max], blind prediction")
    for col in ("topology", "scheme", "median s", "spread s", "sim s", "sim err %", "x T_LP"):
        t.add_column(col, justify="right")
    errs = []
    for name, topo, schemes, key in (("internet2", internet2(seed=1), ["packing", "netstorm"], "live_vs_lp"),
                                     ("geo:aws10:x=0.02", build("geo:aws10:x=0.02"), ["packing"], "aws10_live_vs_lp")):
        bound = t_lp(topo, params)
        jobs = live(topo, name, schemes, rounds, SCALE)
        med = {}
        for s, js in jobs.items():
            xs = [r.round_s for r in js.records if not r.warmup]
            preds = [r.prediction_s for r in js.records if not r.warmup and r.prediction_s]
            med[s] = statistics.median(xs)
            sim = statistics.median(preds) if preds else None
            err = None if sim is None else 100 * (sim - med[s]) / med[s]
            if err is not None:
                errs.append(abs(err))
            t.add_row(name, s, f"{med[s]:.3f}", f"{max(xs) - min(xs):.3f}", "-" if sim is None else f"{sim:.3f}",
                      "-" if err is None else f"{err:+.1f}", f"{med[s] / bound:.2f}")
        out[key] = med["packing"] / bound
        if "netstorm" in med:
            out["live_speedup_vs_netstorm"] = med["netstorm"] / med["packing"]
    console.print(t)
    out["sim_vs_live_max_err_pct"] = max(errs) if errs else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the check's run (<= 5 min)")
    ap.add_argument("--no-live", action="store_true", help="simulated figures and solve times only")
    args = ap.parse_args()
    t0 = time.time()
    res: dict[str, Any] = {}
    res |= sim_internet2(args.quick)
    res |= solve_times(args.quick)
    res |= gpu_mesh()
    if not args.no_live:
        res |= live_runs(args.quick)
        res |= live_guard(LIVE_JOBS)
    res["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}))


if __name__ == "__main__":
    main()
