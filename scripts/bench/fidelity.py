"""Live round times vs the simulator's blind predictions, and the simulator at 1,000 nodes.

For each baseline scheme on internet2 (static) and on a 9-node hetero mesh, with the default
event loop, runs real clusters in interleaved repeats and compares each round's measured time
with the prediction the simulator made from the plan and the configured topology alone. Then the
concurrent-task cases of scripts/bench/tasks.py (`--only-cases`: bursts of partial reduces with
aggregators, bursts of multicasts, pairs of multicasts over one route weighted 3:1), each task's
live time against the simulator's replay of the whole burst; each case's median error joins the
scheme cases in the median and max.
Prints a table; the last line is one JSON object of headline figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from emulation.topology import build  # noqa: E402
from scheduler.service import JobState  # noqa: E402
from wansync.cluster import run  # noqa: E402
from wansync.guard import live_guard  # noqa: E402
from wansync.options import Options  # noqa: E402
from wansync.predict import predict  # noqa: E402
from wansync.runspec import resolve  # noqa: E402

SCHEMES = ["star", "ring", "mst", "ktree"]
TIE_PCT = 3.0  # schemes closer than this (live or predicted) are a tie for the ranking


LIVE_JOBS: list[JobState] = []  # every live run used, for the fidelity guard's verdict


def live_vs_sim(topology: str, nodes: int | None, scale: float, rounds: int) -> dict[str, tuple[float, float]]:
    """One cluster run: per scheme, (median measured round time, median prediction)."""
    cfg = resolve(Options.make(topology=topology, nodes=nodes, schemes=SCHEMES, workload__model="resnet50",
                               scale=scale, rounds=rounds, warmup=1, no_http=True))
    quiet = Console(file=io.StringIO(), width=150)
    jobs = asyncio.run(run(cfg, console=quiet, show_table=False))
    LIVE_JOBS.extend(jobs)
    out = {}
    for js in jobs:
        recs = [r for r in js.records if not r.warmup]
        if not all(r.ok and r.digests_agree and r.versions_agree for r in js.records):
            raise SystemExit(f"{topology}/{js.scheme}: a round was not exact")
        out[js.scheme] = (statistics.median(r.round_s for r in recs),
                          statistics.median(r.prediction_s for r in recs if r.prediction_s))
    return out


def ranking_agrees(live: dict[str, float], sim: dict[str, float]) -> tuple[bool, list[str]]:
    """No pair of schemes ordered one way live and the other way predicted, beyond a tie margin."""
    bad = []
    for a, b in itertools.combinations(live, 2):
        dl = 100 * (live[a] - live[b]) / min(live[a], live[b])
        ds = 100 * (sim[a] - sim[b]) / min(sim[a], sim[b])
        if (dl > TIE_PCT and ds < -TIE_PCT) or (dl < -TIE_PCT and ds > TIE_PCT):
            bad.append(f"{a}/{b}: live {dl:+.1f}% sim {ds:+.1f}%")
    return not bad, bad


def task_cases(seed: int) -> dict[str, Any]:
    """scripts/bench/tasks.py's simulator cases on internet2 x0.01 (its own cluster); its tables go
    to stderr, its figures come back."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tasks as tasks_bench

    args = argparse.Namespace(quick=True, minutes=0.0, in_flight=5, seed=seed, model="resnet50", scale=0.01,
                              out=None, agent_logs=None, verbose=False, only_cases=True)
    bench = tasks_bench.TasksBench(args)
    with contextlib.redirect_stdout(sys.stderr):
        res = asyncio.run(bench.run())
    LIVE_JOBS.extend(ph.js for ph in bench.phases if ph.js is not None)
    if res["tasks_wrong"] or res["tasks_hung"]:
        raise SystemExit(f"task cases: {res['tasks_wrong']} wrong, {res['tasks_hung']} hung")
    return res


def big_simulation() -> dict[str, float]:
    """Plan + simulate on a 1,000-node Waxman graph, AlexNet at full size."""
    topo = build("waxman:1000:seed=1")
    out = {}
    for p in predict(topo, None, ["mst", "ktree"], 57_030_000, 1_000_000):
        out[p.scheme] = p.plan_s + p.simulate_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="3 repeats of 2 rounds at --scale 0.02 (under 4 min)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--scale", type=float, default=None)
    args = ap.parse_args()
    repeats = args.repeats or 3
    rounds = args.rounds or (2 if args.quick else 4)
    scale = args.scale or (0.02 if args.quick else 0.05)
    setups = [("internet2", None), ("hetero", 9)]
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    t0 = time.time()
    for rep in range(repeats):  # interleaved: every setup once per repeat
        for topology, nodes in setups:
            for scheme, pair in live_vs_sim(topology, nodes, scale, rounds).items():
                samples.setdefault((topology, scheme), []).append(pair)
            print(f"repeat {rep + 1}/{repeats} {topology} done at {time.time() - t0:.0f} s", file=sys.stderr)
    print(f"\nlive vs simulated round time, resnet50 x{scale}, {repeats} interleaved repeats x {rounds} rounds")
    print(f"{'topology':<10} {'scheme':<6} {'live median s':>13} {'spread s':>9} {'sim s':>7} {'error %':>8}")
    errors, verdicts = [], {}
    for topology, _ in setups:
        live_m, sim_m = {}, {}
        for scheme in SCHEMES:
            pairs = samples[(topology, scheme)]
            live = [p[0] for p in pairs]
            sim = statistics.median(p[1] for p in pairs)
            lm = statistics.median(live)
            err = 100 * (lm - sim) / sim
            errors.append(abs(err))
            live_m[scheme], sim_m[scheme] = lm, sim
            print(f"{topology:<10} {scheme:<6} {lm:>13.3f} {max(live) - min(live):>9.3f} {sim:>7.3f} {err:>+8.1f}")
        ok, bad = ranking_agrees(live_m, sim_m)
        verdicts[topology] = ok
        order_l = " < ".join(sorted(live_m, key=live_m.get))
        order_s = " < ".join(sorted(sim_m, key=sim_m.get))
        print(f"  ranking live: {order_l}; simulated: {order_s}; "
              f"{'agree' if ok else 'DISAGREE: ' + '; '.join(bad)} (ties within {TIE_PCT}%)")
    cases = task_cases(1)
    for case, err in cases["sim_vs_live_by_case"].items():
        errors.append(err)
        print(f"tasks      {case:<13} median |error| over its tasks {err:5.1f} %")
    print(f"  3:1 share pairs: delivered bytes off the configured shares by at most {cases['share_error_pct']:.1f} %")
    big = big_simulation()
    print("\n1,000-node Waxman, alexnet: plan + simulate " + ", ".join(f"{k} {v:.2f} s" for k, v in big.items()))
    print(json.dumps({
        "sim_vs_live_median_err_pct": round(statistics.median(errors), 2),
        "sim_vs_live_max_err_pct": round(max(errors), 2),
        "ranking_agrees": all(verdicts.values()),
        "sim_1000_nodes_s": round(max(big.values()), 2),
        "tasks_cases_err_pct": {k: round(v, 2) for k, v in cases["sim_vs_live_by_case"].items()},
        "share_error_pct": cases["share_error_pct"],
        "repeats": repeats, "rounds": rounds, "scale": scale,
        **live_guard(LIVE_JOBS),
    }))


if __name__ == "__main__":
    main()
