"""Every link known: how much of the WAN the scheduler's view knows, how well, and what probing costs.

Per cell (--scale 0.005, 0.01, 0.05 x backend app, tc) it runs real clusters (`wansync run`'s launcher)
on `hetero` with 8 nodes (56 directed links) and `geo:aws10:x=0.02` (90), tree packing then NetStorm,
probing on. Each run reports:

- coverage: directed topology links whose estimate is passive or probed (not nominal), read from the
  live view 30 s after the first job started;
- error: every known link's estimate against its configured rate (bounded by the node caps where a
  topology has them: the max-min share a lone flow gets there), at the same moment;
- slowdown: probing is switched on and off every TOGGLE_S through the run; the median round that
  started with probing on over the median round that started with it off (and no probe left in
  flight), per scheme; a cell's figure is the geometric mean of its runs' ratios, minus 1;
- probes on a bottleneck: probes ordered on a link while it was the bottleneck (at the configured
  rates) of a plan in force: the job's current plan or that of a round still running, as the prober
  recorded their versions with the order;
- rounds wrong: every receiver's digest against an exact sum computed here from the workload's formula;
- validity: the fidelity guard's verdict of every job (a cell counts if every run in it was valid);
  beside it, the CPU the busiest scheme's agents would need at the configured rates (wansync.guard's
  cpu_forecast: the project's measured cost per chunk crossing a link and per GB), against what this
  machine can give them: where it asks for more, no run of the cell can be valid here.

Also, per backend, on `hetero` at --scale 0.01 with ring (whose plan leaves 48 links idle): a trace
halves one idle link and doubles another CHANGE_S after the job starts; the seconds until both
estimates are within 10 % of their new rates.

    python scripts/bench/view.py [--quick] [--backends app,tc] [--seed 1]

Prints a table and, last, one JSON line of the headline figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import result_digest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core.classes import MBIT  # noqa: E402
from emulation.tc import unavailable  # noqa: E402
from emulation.topology import Topology  # noqa: E402
from scheduler.planners.onview import link_loads  # noqa: E402
from wansync.cluster import run  # noqa: E402
from wansync.guard import CPU_BUDGET, cpu_forecast, job_guard  # noqa: E402
from wansync.options import Options  # noqa: E402
from wansync.predict import predict  # noqa: E402
from wansync.runspec import resolve  # noqa: E402

TOPOLOGIES = (("hetero", 8), ("geo:aws10:x=0.02", None))
SCALES = (0.005, 0.01, 0.05)
SCHEMES = ("packing", "netstorm")
COVER_AT_S = 30.0  # coverage and error are read this long after the first job started
TOGGLE_S = 2.0  # probing alternates on/off this often (the slowdown's two halves)
DRAIN_S = 0.5  # a round counts as "off" only if it started this long after probing went off
JOB_S = 14.0  # the first scheme runs this long; the second what is left of COVER_AT_S
MIN_ROUNDS = 6  # rounds per job: a scheme runs jobs of this many back to back until its time is up
FIRST_ROUNDS = 3  # ... the first one shorter (how long a round takes live is known only once it ran)
CHANGE_S = 20.0  # the idle-link trace changes this long after the job starts (the view knows every link by then:
# coverage is judged at COVER_AT_S; at 10 s a fast idle link could still be unknown, its first probes sized
# for the links known so far)
DETECT_WITHIN = 0.10
DETECT_GIVE_UP_S = 16.0  # the goal is 15 s: later is a miss (reported as not detected)


# --- exact sums, written out again from the workload's definition (agents/workload.py) -----------------------
@functools.lru_cache(maxsize=512)
def exact_digest(rnd: int, attempt: int, members: tuple[int, ...], params: int) -> str:
    """Digest (bench_common.result_digest: what agents report) of the members' exact sum of
    f(r, a, n, i) = ((7i + 13n + 31r + 17a + (i >> 5) n) mod 64) - 32, summed in int64."""
    i = np.arange(params, dtype=np.int64)
    total = np.zeros(params, dtype=np.int64)
    for n in members:
        total += (7 * i + 13 * n + 31 * rnd + 17 * attempt + (i >> 5) * n) % 64 - 32
    return result_digest(total.astype(np.float32))


def rounds_wrong(js: Any) -> int:
    wrong = 0
    for r in js.records:
        if r.aborted:
            continue
        want = exact_digest(r.round, r.attempt, tuple(sorted(r.members)), r.bytes // 4)
        if not r.digests or any(d != want for d in r.digests.values()):
            wrong += 1
    return wrong


# --- what one run measures -----------------------------------------------------------------------------------
@dataclass
class RunOut:
    topology: str
    backend: str
    scale: float
    links: int
    coverage: float | None = None
    err_max_pct: float | None = None
    worst: str = ""  # the worst known link: estimate against expected, and how the view knows it
    valid: bool = False
    reasons: list[str] = field(default_factory=list)
    wrong: int = 0
    ratios: dict[str, tuple[float, float, int, int]] = field(default_factory=dict)  # scheme: on, off medians, n
    probes: int = 0
    probe_mb: float = 0.0
    cores_needed: float | None = None  # the busiest scheme's agents at the configured rates (cpu_forecast)
    on_bottleneck: int = 0
    rounds: int = 0
    seconds: float = 0.0


def expected_rate(topo: Topology, a: int, b: int) -> float:
    """What a lone flow gets on a->b: its rate, bounded by the sender's uplink and receiver's downlink caps."""
    r = topo.links[(a, b)].rate_mbps
    for cap in (topo.uplink_mbps.get(a), topo.downlink_mbps.get(b)):
        if cap is not None:
            r = min(r, cap)
    return r


def bottlenecks(plan: Any, topo: Topology, route: Any) -> set[tuple[int, int]]:
    times = {k: b / (expected_rate(topo, *k) * MBIT) for k, b in link_loads(plan, route).items() if k in topo.links}
    if not times:
        return set()
    top = max(times.values())
    return {k for k, t in times.items() if t >= 0.99 * top}


def one_run(topology: str, nodes: int | None, scale: float, backend: str, seed: int) -> RunOut:
    fd, name = tempfile.mkstemp(prefix="wansync-view-", suffix=".jsonl")
    os.close(fd)
    cfg = resolve(Options.make(topology=topology, nodes=nodes, seed=seed, schemes=list(SCHEMES), scale=scale,
                               rounds=MIN_ROUNDS, warmup=1, out=name, backend=backend, no_http=True))
    out = RunOut(topology, backend, scale, len(cfg.topo.links))
    forecast = cpu_forecast(cfg.topo, None, SCHEMES, cfg.params, cfg.chunk, cores=1e-9)  # always says how many
    out.cores_needed = forecast[1] if forecast else None
    toggles: list[tuple[float, bool]] = []
    state: dict[str, Any] = {}

    async def toggle(sched: Any) -> None:
        while True:
            on = not sched.prober.enabled if toggles else True
            sched.prober.set_enabled(on)
            toggles.append((time.time(), on))
            await asyncio.sleep(TOGGLE_S)

    async def snapshot(sched: Any, t0: float) -> None:
        await asyncio.sleep(max(0.0, t0 + COVER_AT_S - time.time()))
        view = sched.view
        known = [k for k in cfg.topo.links if view.known(*k)]
        out.coverage = len(known) / len(cfg.topo.links)
        errs = [(100 * abs(view.rate(*k) - expected_rate(cfg.topo, *k)) / expected_rate(cfg.topo, *k), k)
                for k in known]
        if errs:
            out.err_max_pct, (a, b) = max(errs)
            out.worst = (f"{a}->{b} {view.rate(a, b):.1f} vs {expected_rate(cfg.topo, a, b):.1f} Mbit/s "
                         f"({view.how(a, b)['how']})")

    async def job(sched: Any, scheme: str, run_job: Any) -> Any:
        """The first scheme runs about JOB_S, the second until about COVER_AT_S: jobs of MIN_ROUNDS rounds
        back to back until then (how long a round takes live is known only once it ran)."""
        if "snap" not in state:
            state["sched"], state["t0"] = sched, time.time()
            state["toggle"] = asyncio.create_task(toggle(sched))
            state["snap"] = asyncio.create_task(snapshot(sched, state["t0"]))
            until = state["t0"] + JOB_S
        else:
            until = state["t0"] + COVER_AT_S
        rounds = FIRST_ROUNDS
        while True:
            js = await run_job(rounds=rounds)
            jobs.append(js)
            per = statistics.median(r.round_s for r in js.records) + 0.05  # and a barrier's worth
            left = until - time.time()
            if left < 2 * per:  # a job is a warm-up round and one more at least
                return js
            rounds = max(1, min(MIN_ROUNDS, int(left / per) - 1))

    async def after() -> None:
        state["toggle"].cancel()
        state["sched"].prober.set_enabled(True)
        await state["snap"]  # the cluster stays up (probing) until the 30 s mark

    quiet = Console(file=io.StringIO(), width=150)
    jobs: list[Any] = []
    try:
        asyncio.run(run(cfg, console=quiet, show_table=False, job=job, after=after))
    finally:
        Path(name).unlink(missing_ok=True)
    sched = state["sched"]
    route = cfg.topo.routes().route
    verdicts = [job_guard(js) for js in jobs]
    out.valid = all(g.verdict == "valid" for g in verdicts)
    out.reasons = [r for g in verdicts for r in g.reasons][:3]
    out.wrong = sum(rounds_wrong(js) for js in jobs)
    out.probes = sched.prober.stats.ordered
    out.probe_mb = sched.prober.stats.bytes / 1e6
    on: dict[str, list[float]] = {}
    off: dict[str, list[float]] = {}
    tops: dict[int, set[tuple[int, int]]] = {}  # plan version -> its bottleneck links
    for js in jobs:
        recs = sorted((r for r in js.records if not r.warmup), key=lambda r: r.t_start)
        out.rounds += len(recs)
        for r in recs:
            st = _probing_at(toggles, r.t_start)
            if st is not None:
                (on if st else off).setdefault(js.scheme, []).append(r.round_s)
        if recs:
            t_end = max(r.t_end for r in recs)
            for t, a, b, _, versions in sched.prober.history:
                if not js.t0 <= t <= t_end:
                    continue
                # the plans in force when the probe was ordered (the prober records them: the current plan
                # and those of rounds still running), each judged at the configured rates
                for v in versions:
                    if v not in tops and (plan := sched.plans.get(v)) is not None:
                        tops[v] = bottlenecks(plan, cfg.topo, route)
                if any((a, b) in tops.get(v, ()) for v in versions):
                    out.on_bottleneck += 1
    for scheme in SCHEMES:
        if on.get(scheme) and off.get(scheme):
            out.ratios[scheme] = (statistics.median(on[scheme]), statistics.median(off[scheme]), len(on[scheme]),
                                  len(off[scheme]))
    return out


def _probing_at(toggles: list[tuple[float, bool]], t: float) -> bool | None:
    """True: probing was on at t; False: off since at least DRAIN_S; None: just switched off, or before."""
    state = None
    for when, on in toggles:
        if when > t:
            break
        state = on if on or t - when >= DRAIN_S else None
    return state


# --- an idle link changes --------------------------------------------------------------------------------------
def change_run(backend: str, seed: int) -> tuple[float | None, str]:
    """hetero, 8 nodes, --scale 0.01, ring: two links ring's plan leaves idle change at CHANGE_S (one halves, one
    doubles); seconds until both estimates are within DETECT_WITHIN of the new rates (None: not within the run)."""
    scale, topology, nodes = 0.01, "hetero", 8
    cfg0 = resolve(Options.make(topology=topology, nodes=nodes, seed=seed, schemes=["ring"], scale=scale, no_http=True))
    plan = predict(cfg0.topo, None, ["ring"], cfg0.params, cfg0.chunk)[0].plan
    used = set(link_loads(plan, cfg0.topo.routes().route))
    idle = [k for k in sorted(cfg0.topo.links) if k not in used]
    down, up = idle[0], idle[len(idle) // 2]
    new = {down: cfg0.topo.links[down].rate_mbps / 2, up: cfg0.topo.links[up].rate_mbps * 2}
    fd, trace = tempfile.mkstemp(prefix="wansync-view-trace-", suffix=".csv")
    os.close(fd)
    Path(trace).write_text("time,src,dst,rate\n" + "".join(
        f"{CHANGE_S / scale},{a},{b},{r}\n" for (a, b), r in new.items()))
    t_round = predict(cfg0.topo, None, ["ring"], cfg0.params, cfg0.chunk)[0].prediction.round_s
    rounds = max(10, math.ceil((CHANGE_S + DETECT_GIVE_UP_S) / max(t_round, 1e-3)))  # it runs until then at least
    cfg = resolve(Options.make(topology=topology, nodes=nodes, seed=seed, schemes=["ring"], scale=scale, rounds=rounds,
                               warmup=1, backend=backend, no_http=True, trace=f"csv:{trace}"))
    found: dict[str, float] = {}

    async def watch(sched: Any) -> None:
        while sched.current is None:
            await asyncio.sleep(0.05)
        t_change = sched.current.t0 + CHANGE_S
        while time.time() < t_change + DETECT_GIVE_UP_S:
            await asyncio.sleep(0.1)
            if time.time() > t_change and all(
                    sched.view.known(*k) and abs(sched.view.rate(*k) - r) <= DETECT_WITHIN * r for k, r in new.items()):
                found["s"] = time.time() - t_change
                return

    state: dict[str, Any] = {}

    async def job(sched: Any, scheme: str, run_job: Any) -> Any:
        state["w"] = asyncio.create_task(watch(sched))
        return await run_job()

    async def after() -> None:
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(state["w"], DETECT_GIVE_UP_S + CHANGE_S)

    try:
        asyncio.run(run(cfg, console=Console(file=io.StringIO()), show_table=False, job=job, after=after))
    finally:
        Path(trace).unlink(missing_ok=True)
    return found.get("s"), f"{down[0]}->{down[1]} /2, {up[0]}->{up[1]} x2"


# --- the report ------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one pass (the check, under 8 min)")
    ap.add_argument("--backends", default="app,tc")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    if "tc" in backends and (why := unavailable()):
        print(f"tc backend unavailable ({why}): application backend only", file=sys.stderr)
        backends = [b for b in backends if b != "tc"]
    passes = 1 if args.quick else 3
    runs: list[RunOut] = []
    t_start = time.time()
    for p in range(passes):
        for backend in backends:
            for scale in SCALES:
                for topology, nodes in TOPOLOGIES:
                    t = time.time()
                    r = one_run(topology, nodes, scale, backend, args.seed + p)
                    r.seconds = time.time() - t
                    runs.append(r)
                    print(f"  {topology} {backend} x{scale:g}: coverage {r.coverage}, err {r.err_max_pct}, "
                          f"valid {r.valid}, {r.seconds:.0f} s", file=sys.stderr, flush=True)
    detect = {b: change_run(b, args.seed) for b in backends}
    print(f"{'topology':<18} {'backend':<7} {'scale':>6} {'links':>5} {'cover':>6} {'err%':>6} {'probes':>6} "
          f"{'MB':>6} {'on bn':>5} {'rounds':>6} {'wrong':>5} {'cores':>5} "
          f"{'slowdown by scheme (on/off median, n)':<44} verdict")
    for r in runs:
        slow = ", ".join(f"{s} {100 * (on / off - 1):+.1f}% ({n_on}/{n_off})" for s, (on, off, n_on, n_off)
                         in r.ratios.items())
        cov = "-" if r.coverage is None else f"{r.coverage:.2f}"
        err = "-" if r.err_max_pct is None else f"{r.err_max_pct:.1f}"
        why = ("valid" if r.valid else "INVALID: " + "; ".join(r.reasons)[:120]) + f" | worst {r.worst}"
        cores = "-" if r.cores_needed is None else f"{r.cores_needed:.1f}"
        print(f"{r.topology:<18} {r.backend:<7} {r.scale:>6g} {r.links:>5} {cov:>6} {err:>6} {r.probes:>6} "
              f"{r.probe_mb:>6.1f} {r.on_bottleneck:>5} {r.rounds:>6} {r.wrong:>5} {cores:>5} {slow:<44} {why}")
    spare = CPU_BUDGET * (os.cpu_count() or 1)
    print(f"cores: what the busiest scheme's agents would need at the configured rates (wansync.guard.cpu_forecast); "
          f"this machine gives them ~{spare:.1f}")
    for b, (s, what) in detect.items():
        print(f"idle link change on {b} ({what}): " + ("not detected" if s is None else f"both within 10 % after "
                                                         f"{s:.1f} s"))
    cells: dict[tuple[str, float], list[RunOut]] = {}
    for r in runs:
        cells.setdefault((r.backend, r.scale), []).append(r)
    valid_cells = sum(1 for rs in cells.values() if all(r.valid for r in rs))
    valid_runs = [r for r in runs if r.valid]
    slow_cells = []
    for rs in cells.values():
        ratios = [on / off for r in rs for on, off, *_ in r.ratios.values()]
        if ratios:
            slow_cells.append(100 * (math.exp(statistics.fmean(math.log(x) for x in ratios)) - 1))
    errs = [r.err_max_pct for r in valid_runs if r.err_max_pct is not None]
    covs = [r.coverage for r in runs if r.coverage is not None]
    detects = [s for s, _ in detect.values()]
    print(json.dumps({
        "view_coverage": round(min(covs), 3) if covs else None,
        "view_err_max_pct": round(max(errs), 2) if errs else None,
        "cells_valid": valid_cells,
        "cells": len(cells),
        "probe_slowdown_pct": round(max(slow_cells), 2) if slow_cells else None,
        "idle_change_detect_s": (None if any(s is None for s in detects) or not detects
                                 else round(max(detects), 2)),
        "probed_bottleneck_busy": sum(r.on_bottleneck for r in runs),
        "rounds_wrong": sum(r.wrong for r in runs),
        "probes": sum(r.probes for r in runs),
        "cells_cpu_feasible": sum(1 for rs in cells.values()
                                  if all(r.cores_needed is not None and r.cores_needed <= spare for r in rs)),
        "backends": backends,
        "passes": passes,
        "minutes": round((time.time() - t_start) / 60, 2),
    }))


if __name__ == "__main__":
    main()
