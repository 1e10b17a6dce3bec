"""NetStorm on internet2 against the hub star (MXNet PS, hub = paper's node 6 = our 5), mst, ktree,
and its own ablation ladder (lite, std = + awareness, pro = + auxiliary paths), static and dynamic.

Static: interleaved repeats of every scheme, median round time with spread, and the simulator's
blind prediction for each. Dynamic: every scheme replays the same seeded redraw trace from its own
start and is scored by rounds completed per second over the same K whole periods. Full mode also
sweeps roots 1..9. Prints tables; the last line is one JSON object of headline figures.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from emulation.topology import internet2  # noqa: E402
from emulation.trace import redraw  # noqa: E402
from scheduler.service import JobState  # noqa: E402
from wansync.cluster import run  # noqa: E402
from wansync.guard import live_guard  # noqa: E402
from wansync.options import Options  # noqa: E402
from wansync.predict import predict  # noqa: E402
from wansync.runspec import TRACE_HORIZON_S, resolve  # noqa: E402

HUB = 5  # the paper's node 6, the degree-4 hub (MXNet's PS placement)
STATIC = ["star", "mst", "ktree", "netstorm-lite", "netstorm-std", "netstorm"]
DYNAMIC = ["star", "mst", "netstorm-lite", "netstorm-std", "netstorm"]
PAPER = {"static": 9.2, "dynamic": 6.5, "aux_gain_pct": "30-65"}
LIVE_JOBS: list[JobState] = []  # every live run used, for the fidelity guard's verdict


def cluster(schemes: list[str], scale: float, rounds: int | dict[str, int], *, dynamic: bool = False,
            period_s: float = 180.0, options: dict | None = None) -> list[JobState]:
    topo = internet2().scaled(scale)
    trace = redraw(topo.links, period_s, TRACE_HORIZON_S, seed=1).scaled(scale) if dynamic else None
    cfg = resolve(Options.make(topology="internet2", schemes=schemes, workload__model="alexnet", scale=scale,
                               rounds=rounds if isinstance(rounds, int) else max(rounds.values()), warmup=1, hub=HUB,
                               dynamic=dynamic, period_s=period_s, no_http=True,
                               rounds_by_scheme=rounds if isinstance(rounds, dict) else {},
                               **{f"schemes__{k}": v for k, v in (options or {}).items()}))
    cfg.trace = trace  # drawn here, the same draw the prediction used; the agents load it from the run's file
    jobs = asyncio.run(run(cfg, console=Console(file=io.StringIO(), width=150), show_table=False))
    LIVE_JOBS.extend(jobs)
    for js in jobs:
        if not all(r.ok and r.digests_agree and r.versions_agree for r in js.records):
            raise SystemExit(f"{js.scheme}: a round was not exact")
    return jobs


def measured(js: JobState) -> list[float]:
    return [r.round_s for r in js.records if not r.warmup]


def rounds_in_window(js: JobState, window: float) -> float:
    """Rounds finished within [t0, t0 + window], plus the finished fraction of the one in progress
    (a slow scheme completes only a few rounds per window; whole rounds alone would quantize it)."""
    end = js.t0 + window
    total = 0.0
    for r in js.records:
        if r.t_end <= end:
            total += 1
        elif r.t_start < end:
            total += (end - r.t_start) / r.round_s
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="1 static repeat, 1 period, no roots sweep (< 4 min)")
    ap.add_argument("--scale", type=float, default=None, help="model/chunk/delay/period scale")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--periods", type=int, default=None, help="K whole redraw periods for the dynamic runs")
    args = ap.parse_args()
    scale = args.scale or (0.02 if args.quick else 0.05)
    repeats = args.repeats or (1 if args.quick else 3)
    periods = args.periods or (3 if args.quick else 4)
    t0 = time.time()

    # --- static ---------------------------------------------------------------------------------------
    static: dict[str, list[float]] = {s: [] for s in STATIC}
    errs_by: dict[str, list[float]] = {s: [] for s in STATIC}  # per round: live vs that round's prediction
    sim: dict[str, float] = {}
    aux: dict[str, float] = {}
    for rep in range(repeats):
        for js in cluster(STATIC, scale, 3 if args.quick else 5):
            static[js.scheme] += measured(js)
            errs_by[js.scheme] += [100 * (r.round_s - r.prediction_s) / r.prediction_s
                                   for r in js.records if not r.warmup and r.prediction_s]
            sim[js.scheme] = statistics.median(r.prediction_s for r in js.records if r.prediction_s)
            aux[js.scheme] = sum(st.get("aux_bytes", 0) for st in js.stats.values()) / max(
                1, sum(st.get("sent_bytes", 0) for st in js.stats.values()))
        print(f"static repeat {rep + 1}/{repeats} done at {time.time() - t0:.0f} s", file=sys.stderr)
    med = {s: statistics.median(v) for s, v in static.items()}
    print(f"static internet2, alexnet x{scale} ({57.03e6 * scale * 4 / 1e6:.1f} MB), "
          f"{repeats} repeat(s), hub star at node {HUB}")
    print("(err % = median over rounds of live vs that round's blind prediction; plans change between rounds)")
    print(f"{'scheme':<14}{'median s':>9}{'spread s':>9}{'sim s':>8}{'err %':>7}{'x star':>8}{'aux %':>7}")
    errs = []
    for s in STATIC:
        err = statistics.median(errs_by[s])
        errs.append(abs(err))
        print(f"{s:<14}{med[s]:>9.3f}{max(static[s]) - min(static[s]):>9.3f}{sim[s]:>8.3f}{err:>+7.1f}"
              f"{med['star'] / med[s]:>8.2f}{100 * aux[s]:>7.1f}")

    # --- dynamic: the same K periods of the same trace for every scheme ---------------------------------
    window = periods * 180.0 * scale
    guess = {p.scheme: p.prediction.round_s for p in predict(internet2().scaled(scale), None, DYNAMIC,
                                                               round(57.03e6 * scale), max(1024, round(1e6 * scale)),
                                                               {"hub": HUB})}
    rounds = {s: math.ceil(1.6 * window / guess[s]) + 2 for s in DYNAMIC}
    rate: dict[str, float] = {}
    for js in cluster(DYNAMIC, scale, rounds, dynamic=True):
        rate[js.scheme] = rounds_in_window(js, window) / window
    print(f"\ndynamic internet2 (redraw 20-155 Mbit/s every {180 * scale:.1f} s, {periods} period(s) = "
          f"{window:.1f} s from each scheme's start)")
    print(f"{'scheme':<14}{'rounds/s':>9}{'x star':>8}")
    for s in DYNAMIC:
        print(f"{s:<14}{rate[s]:>9.3f}{rate[s] / rate['star'] if rate['star'] else float('nan'):>8.2f}")

    # --- roots sweep (full mode) ---------------------------------------------------------------------------
    if not args.quick:
        print("\nroots sweep (static, netstorm pro)")
        for n in range(1, 10):
            js = cluster(["netstorm"], scale, 2, options={"roots": n})[0]
            print(f"  N={n}: median {statistics.median(measured(js)):.3f} s")

    aux_gain = 100 * (rate["netstorm"] / rate["netstorm-std"] - 1) if rate.get("netstorm-std") else 0.0
    dyn = rate["netstorm"] / rate["star"] if rate["star"] else float("nan")
    print(f"\npaper (Klonet, 9 DCs, AlexNet): {PAPER['static']}x static, {PAPER['dynamic']}x dynamic over MXNet PS; "
          f"auxiliary paths +{PAPER['aux_gain_pct']} %. Ours: {med['star'] / med['netstorm']:.2f}x static, "
          f"{dyn:.2f}x dynamic; wall {time.time() - t0:.0f} s")
    print(json.dumps({
        "speedup_vs_star_static": round(med["star"] / med["netstorm"], 3),
        "speedup_vs_star_dynamic": round(rate["netstorm"] / rate["star"], 3) if rate["star"] else None,
        "speedup_vs_mst_static": round(med["mst"] / med["netstorm"], 3),
        "aux_gain_pct": round(aux_gain, 2),
        "sim_vs_live_max_err_pct": round(max(errs), 2),
        "scale": scale, "repeats": repeats, "periods": periods,
        **live_guard(LIVE_JOBS),
    }))


if __name__ == "__main__":
    main()
