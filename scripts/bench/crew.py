"""CREW (seed 004): partial reduce over every active worker, against its baselines, in the simulator at
the paper's scale and live on real agents; outages survived exact.

Simulated (job mode, blind: the configured matrices, no live measurement): n = 60 workers on `crew:60`
matrices (the paper's N2: 25 Mbit/s x an integer from N(5, 1) clipped to 1..10, each direction drawn
on its own), a 180 MB model in 64 KiB chunks, per-(worker, iteration) compute times from a skewed
surrogate of the paper's T1 rescaled to [0.05, 0.2] s (lognormal draws, min-max rescaled: the
original histograms are not available), a ready queue of p, 50 s simulated; per seed the median over
workers of the rounds each finished, then across `--seeds` seeds the median and spread (min..max) of
those and of the per-seed ratios. Schemes: crew (N-A split, flow-level FCFS), crew E-D with fair
sharing (the variant gain), OPR (the members aggregate, N-A, FCFS) and all-to-all, at p = 5 and 10.
The engine is the simulator's stepped fluid engine (sim/stepped.py; the exact one takes tens of
seconds per job at this size): flows, not chunks, in 10 ms steps.

The headline simulations run during the live jobs at the kernel's idle priority (SCHED_IDLE: only
on CPU the agents leave; the fidelity guard judges the live jobs as always; --no-sim-during-live
runs them after). Live: 12 agent processes (`crew:12:x=X`: the same generator, every rate x X so
2 cores carry it), one scheduler here, progress model `crew` (the ready queue with CREW's failure
rules), p = 5, an 8 MB model in 128 KiB chunks, the same compute draws; after a short warm-up job
(the view learns the links from passive samples; plans use what it learned, never the
configuration), one job per scheme (crew, opr, a2a) for the same wall-clock budget (`--live-budget`,
real seconds, unscaled), then stopped (no new tasks; the running ones finish; JOB_END). Rounds per
worker = its tasks that ended exact within the budget (mean over the workers). Every task's digest
on every receiver is compared here with the exact sum this script computes from the contributions'
closed form. Then an
outage job: crew with a link down (`down:link=A-B`, for good) and one worker killed (`kill:node=K`)
mid-job: tasks exact, wrong, abandoned, blocks moved (Eq. 3). The simulator (exact engine, the data
plane's measured costs) predicts each live job's rounds per worker blind; `sim_vs_live_max_err_pct`
is the worst of the three.

The full run (without --quick) adds: Fig. 4 (one task's completion time per scheme: crew, OPR, PS,
greedy ring, ToA, A2A, on N1 and N2 (N1: a lognormal surrogate of EC2's inter-region rates, 50-500
Mbit/s), planning time apart), Fig. 6 (non-blocking vs blocking scatter, sim/nonblocking.py), Fig. 7
(the five flow-scheduling schemes at p = 4, 5, 10, 12), Fig. 8 (rounds as links fail for good, in the
simulator: a failed link's tasks are repaired by Eq. (3) once it is known, sim/outage.py) and Fig.
11 (N-A and E-D deciding on rates x (1 + U[-l, l])).

    python scripts/bench/crew.py [--quick] [--seeds 10] [--live-budget 30] [--skip-live] [--skip-sim]

Prints tables; the last stdout line is one JSON object (see the check: sim_rounds_crew_over_a2a_p5,
sim_rounds_crew_over_opr_p5, sim_rounds_crew_over_opr_p10, sim_variant_gain, live_rounds_crew_over_opr,
live_rounds_crew_over_a2a, live_tasks_wrong, live_outage_tasks_ok, live_outage_tasks_wrong,
live_outage_tasks_abandoned, sim_vs_live_max_err_pct, live_guard_valid, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_common import result_digest, spawn_agent  # noqa: E402

from core.compute import ComputeModel  # noqa: E402
from core.plan import Job, Plan  # noqa: E402
from emulation.faults import AppLinkControl, FaultInjector, parse  # noqa: E402
from emulation.simnet import sim_network  # noqa: E402
from emulation.topology import Topology, build  # noqa: E402
from overlay.auth import SECRET_ENV, generate_secret  # noqa: E402
from scheduler import planners  # noqa: E402
from scheduler.planners import crew  # noqa: E402
from scheduler.service import Scheduler  # noqa: E402
from scheduler.tasks import JobState  # noqa: E402
from sim import MEASURED, SimNetwork, simulate, simulate_job  # noqa: E402
from sim.job import Queue  # noqa: E402
from sim.nonblocking import default_blocks, simulate_nonblocking  # noqa: E402
from sim.outage import simulate_outages  # noqa: E402
from wansync.backend import agent_command  # noqa: E402
from wansync.cluster import agent_options_file  # noqa: E402
from wansync.guard import job_guard, live_guard  # noqa: E402
from wansync.options import Options  # noqa: E402
from wansync.predict import oracle_view  # noqa: E402
from wansync.procs import reap  # noqa: E402
from wansync.runspec import resolve  # noqa: E402

MODEL_BYTES = 180_000_000  # the paper's default model
CHUNK_PARAMS = 16_384  # 64 KiB chunks (k ~ 2,750 >> n)
N = 60
BUDGET_S = 50.0
DT = 0.01
COMPUTE_LO, COMPUTE_HI = 0.05, 0.2
DRAWS = 400  # compute draws per worker (a csv trace repeats after them)
SIM_SCHEMES = {5: ("crew", "crew-ed-fs", "opr", "a2a"), 10: ("crew", "opr")}
LIVE_SCHEMES = ("crew", "opr", "a2a")
LIVE_N, LIVE_P = 12, 5
GRACE_S = 40.0  # running tasks must end this long after a job's budget (else: hung)


# --- the exact sums, written out again from the workload's definition (agents/workload.py) -----------
def exact_digest(members: Iterable[int], iters: dict[int, int], params: int) -> str:
    """Hex CRC-32 (what agents report) of the float32 bytes of the members' exact sum, each
    member's contribution from its own iteration (attempt 0): ((7i + 13n + 31r + (i >> 5) n) mod 64) - 32,
    summed in int64."""
    i = np.arange(params, dtype=np.int64)
    total = np.zeros(params, dtype=np.int64)
    for n in members:
        total += (7 * i + 13 * n + 31 * iters[n] + (i >> 5) * n) % 64 - 32
    return result_digest(total.astype(np.float32))


# --- workloads ----------------------------------------------------------------------------------------
def compute_trace(path: Path, kind: str, seed: int, nodes: int, draws: int = DRAWS) -> str:
    """A surrogate of the paper's per-iteration compute times (T1: LSTM on UCF101, T2: Transformer on
    WMT16, rescaled to [0.05, 0.2] s): lognormal draws per (worker, iteration), min-max rescaled; T2's
    tail is heavier. Written as a csv trace (core.compute), so agents and simulator draw the same."""
    rng = np.random.default_rng([seed, 0 if kind == "T1" else 1])
    x = rng.lognormal(0.0, 0.35 if kind == "T1" else 0.8, size=(nodes, draws))
    x = COMPUTE_LO + (COMPUTE_HI - COMPUTE_LO) * (x - x.min()) / (x.max() - x.min())
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for n in range(nodes):
            for k in range(draws):
                f.write(f"{n},{k},{x[n, k]:.5f}\n")
    return f"csv:{path}"


def network(kind: str, n: int, seed: int, x: float = 1.0) -> Topology:
    """N2: crew:N (the paper's generator); N1: a lognormal surrogate of measured EC2 inter-region rates
    (Lai et al.'s CDF is not available), median ~150 Mbit/s, clipped to 50-500."""
    if kind == "N2":
        return build(f"crew:{n}:seed={seed}:x={x:g}")
    topo = build(f"crew:{n}:seed={seed}")
    rng = np.random.default_rng([seed, 7])
    rates = {k: float(np.clip(rng.lognormal(np.log(150.0), 0.55), 50.0, 500.0)) * x for k in sorted(topo.links)}
    return topo.with_rates(rates)


# --- the simulator at n = 60 -------------------------------------------------------------------------
def sim_case(case: tuple[str, int, int, str, str, dict[str, Any]]) -> dict[str, Any]:
    """One job of the simulator's job mode: (scheme, p, seed, network, compute, extra planner options)."""
    scheme, p, seed, net_kind, comp_kind, extra = case
    topo = network(net_kind, N, seed)
    view = oracle_view(topo)
    noise = extra.pop("noise", 0.0)
    if noise:  # the planner decides on b (1 + U[-l, l]), the network keeps b
        rng = np.random.default_rng([seed, 11])
        for _, _, e in view.g.edges(data=True):
            e["rate"] *= 1 + rng.uniform(-noise, noise)
    net = sim_network(topo)
    spec = planners.resolve(scheme)
    params = MODEL_BYTES * extra.pop("model_x", 1) // 4
    opts = {**spec.options, **extra}
    plan_s = [0.0]

    def plan_for(members: tuple[int, ...], receivers: tuple[int, ...]) -> Plan:
        t = time.perf_counter()
        plan = spec.plan(view, Job(params, CHUNK_PARAMS, members, opts))
        plan_s[0] += time.perf_counter() - t
        return plan
    with tempfile.TemporaryDirectory() as d:
        compute = compute_trace(Path(d) / "compute.csv", comp_kind, seed, N)
        t = time.perf_counter()
        pred = simulate_job(Queue(p), plan_for, ComputeModel(compute, seed=seed), range(N), net, BUDGET_S,
                            engine="stepped", dt=DT)
    rounds = list(pred.iterations.values())
    return {"scheme": scheme, "p": p, "seed": seed, "net": net_kind, "compute": comp_kind, "extra": extra,
            "noise": noise, "rounds": statistics.median(rounds), "rounds_mean": statistics.fmean(rounds),
            "tasks": len(pred.tasks), "plan_s": plan_s[0], "wall_s": time.perf_counter() - t}


OUTAGE_DETECT_S = 3.0  # the live policy's floor for a link whose chunks stay unacknowledged


def outage_case(case: tuple[int, int, int]) -> dict[str, Any]:
    """CREW's job with `f` links failing for good at random times in the first half (both directions),
    the live policy's repair (Eq. (3)) after OUTAGE_DETECT_S: rounds per worker (Fig. 8)."""
    p, seed, f = case
    topo = network("N2", N, seed)
    view, net = oracle_view(topo), sim_network(topo)
    rng = random.Random(seed * 1000 + f)
    pairs = sorted({(min(a, b), max(a, b)) for a, b in topo.links})
    failures = [(rng.uniform(0, BUDGET_S / 2), a, b) for a, b in rng.sample(pairs, f)]
    spec = planners.resolve("crew")
    params = MODEL_BYTES // 4

    def plan_for(members: tuple[int, ...], receivers: tuple[int, ...]) -> Plan:
        return spec.plan(view, Job(params, CHUNK_PARAMS, members, dict(spec.options)))

    def on_detect(links: list[tuple[int, int]]) -> None:
        for a, b in links:
            view.suspend(a, b)

    def bw(a: int, b: int) -> float:
        e = view.g.adj[a].get(b) if a in view.g else None
        return 0.0 if e is None else float(e["rate"])

    def repair(plan: Plan, dead: set[tuple[int, int]], running: list[Plan]) -> Plan | None:
        out = crew.move_blocks(plan, range(N), bw, crew.loads(dict(enumerate([*running, plan]))))
        if out is None:
            return None
        return spec.plan(view, Job(params, CHUNK_PARAMS, plan.participants, {**spec.options, "blocks": out[0]}))
    with tempfile.TemporaryDirectory() as d:
        compute = compute_trace(Path(d) / "compute.csv", "T1", seed, N)
        pred = simulate_outages(Queue(p), plan_for, ComputeModel(compute, seed=seed), range(N), net, BUDGET_S,
                                failures, detect_s=OUTAGE_DETECT_S, on_detect=on_detect, repair=repair, dt=DT)
    return {"p": p, "seed": seed, "f": f, "rounds": statistics.fmean(pred.iterations.values()),
            "repaired": pred.repaired, "abandoned": pred.abandoned}


def scatter_case(case: tuple[int, int, bool]) -> dict[str, Any]:
    """CREW with blocking or non-blocking scatter (Fig. 6): rounds per worker in 50 s."""
    p, seed, nonblocking = case
    topo = network("N2", N, seed)
    view, net = oracle_view(topo), sim_network(topo)
    params = MODEL_BYTES // 4
    default = crew.plan(view, Job(params, CHUNK_PARAMS, tuple(range(N)), {}))  # P = every worker
    opts = {"from_blocks": crew.blocks_of(default)} if nonblocking else {}

    def plan_for(members: tuple[int, ...], receivers: tuple[int, ...]) -> Plan:
        return crew.plan(view, Job(params, CHUNK_PARAMS, members, opts))
    with tempfile.TemporaryDirectory() as d:
        comp = ComputeModel(compute_trace(Path(d) / "compute.csv", "T1", seed, N), seed=seed)
        if nonblocking:
            pred = simulate_nonblocking(Queue(p), plan_for, default_blocks(default), default.layout, comp, range(N),
                                        net, BUDGET_S, dt=DT)
        else:
            pred = simulate_job(Queue(p), plan_for, comp, range(N), net, BUDGET_S, engine="stepped", dt=DT)
    return {"p": p, "seed": seed, "nonblocking": nonblocking, "rounds": statistics.median(pred.iterations.values())}


def run_cases(cases: list[tuple], procs: int, fn: Any = None) -> list[dict[str, Any]]:
    fn = fn or sim_case
    if procs <= 1:
        return [fn(c) for c in cases]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        return pool.map(fn, cases, chunksize=1)


def med_spread(xs: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def ratio(rows: list[dict[str, Any]], a: tuple, b: tuple) -> dict[str, float]:
    """Per seed rounds(a) / rounds(b); median and spread over the seeds."""
    by = {(r["scheme"], r["p"], r["seed"]): r["rounds"] for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    xs = [by[(*a, s)] / by[(*b, s)] for s in seeds if (*a, s) in by and (*b, s) in by and by[(*b, s)] > 0]
    return med_spread(xs) if xs else {"median": float("nan"), "min": float("nan"), "max": float("nan")}


def one_task_times(net_kind: str, seed: int, schemes: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Fig. 4's draw: one partial reduce of 5 random workers per scheme on the same network, (completion s,
    planning ms) each."""
    topo = network(net_kind, N, seed)
    view, net = oracle_view(topo), sim_network(topo)
    members = tuple(sorted(random.Random(seed).sample(range(N), 5)))
    out = {}
    for s in schemes:
        spec = planners.resolve(s)
        chunk = CHUNK_PARAMS * (8 if s in ("ps", "gring", "toa", "a2a", "blink") else 1)
        t = time.perf_counter()
        plan = spec.plan(view, Job(MODEL_BYTES // 4, chunk, members, dict(spec.options)))
        ms = 1e3 * (time.perf_counter() - t)
        out[s] = (_one_task(plan, net), ms)
    return out


class SimPart:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seeds = list(range(1, args.seeds + 1))

    def start(self, idle: bool) -> None:
        """The headline cases in a pool of worker processes, started now; idle: at the kernel's idle
        priority (SCHED_IDLE), so that they only take CPU the live agents leave (they run meanwhile)."""
        cases = [(s, p, seed, "N2", "T1", {}) for p, schemes in SIM_SCHEMES.items() for s in schemes
                 for seed in self.seeds]
        cases.sort(key=lambda c: -_cost(c))  # the long ones first: the pool ends evenly
        self.t_start = time.perf_counter()
        self.pool = multiprocessing.get_context("fork").Pool(max(1, self.args.procs),
                                                             initializer=_idle if idle else None)
        self.pending = self.pool.map_async(sim_case, cases, chunksize=1)

    def headline(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        if not hasattr(self, "pending"):
            self.start(idle=False)
        rows = self.pending.get()
        self.pool.close()
        self.pool.join()
        wall = time.perf_counter() - self.t_start
        out: dict[str, Any] = {
            "sim_rounds_crew_over_a2a_p5": ratio(rows, ("crew", 5), ("a2a", 5))["median"],
            "sim_rounds_crew_over_opr_p5": ratio(rows, ("crew", 5), ("opr", 5))["median"],
            "sim_rounds_crew_over_opr_p10": ratio(rows, ("crew", 10), ("opr", 10))["median"],
            "sim_variant_gain": ratio(rows, ("crew", 5), ("crew-ed-fs", 5))["median"],
            "sim_spread": {
                "crew_over_a2a_p5": ratio(rows, ("crew", 5), ("a2a", 5)),
                "crew_over_opr_p5": ratio(rows, ("crew", 5), ("opr", 5)),
                "crew_over_opr_p10": ratio(rows, ("crew", 10), ("opr", 10)),
                "variant_gain": ratio(rows, ("crew", 5), ("crew-ed-fs", 5))},
            "sim_rounds": {f"{s}_p{p}": med_spread([r["rounds"] for r in rows if r["scheme"] == s and r["p"] == p])
                           for p, schemes in SIM_SCHEMES.items() for s in schemes},
            "sim_plan_ms_per_task": {f"{s}_p{p}": 1e3 * sum(r["plan_s"] for r in rows if r["scheme"] == s
                                                            and r["p"] == p)
                                     / max(1, sum(r["tasks"] for r in rows if r["scheme"] == s and r["p"] == p))
                                     for p, schemes in SIM_SCHEMES.items() for s in schemes},
            "sim_n": N, "sim_seeds": len(self.seeds), "sim_budget_s": BUDGET_S, "sim_engine": f"stepped dt={DT}",
            "sim_wall_s": round(wall, 1)}
        table = Table(title=f"simulated rounds per worker in {BUDGET_S:g} s (n = {N}, crew:{N} = N2, T1 surrogate, "
                            f"{len(self.seeds)} seeds: median \\[min..max]; stepped engine, dt = {DT:g} s)")
        for col in ("p", "scheme", "rounds", "tasks (median)", "plan ms / task"):
            table.add_column(col, justify="right")
        for p, schemes in SIM_SCHEMES.items():
            for s in schemes:
                rs = [r for r in rows if r["scheme"] == s and r["p"] == p]
                m = med_spread([r["rounds"] for r in rs])
                table.add_row(str(p), s, f"{m['median']:.1f} [{m['min']:.1f}..{m['max']:.1f}]",
                              f"{statistics.median(r['tasks'] for r in rs):.0f}",
                              f"{out['sim_plan_ms_per_task'][f'{s}_p{p}']:.2f}")
        Console(width=140).print(table)
        t2 = Table(title="ratios of rounds (per seed, then median \\[min..max]); paper: 12-15x vs A2A, 8-9x vs OPR "
                         "at p = 5, 4-5x at p = 10, (N-A, FCFS) 1.5-2x (E-D, FS)")
        t2.add_column("figure")
        t2.add_column("ours", justify="right")
        for k, v in out["sim_spread"].items():
            t2.add_row(k, f"{v['median']:.2f} [{v['min']:.2f}..{v['max']:.2f}]")
        Console(width=140).print(t2)
        return out, rows

    # --- the full benchmark's figures ---------------------------------------------------------------
    def fig4(self) -> dict[str, Any]:
        """One task per scheme, on the same random groups: completion time (simulated, exact engine) and
        planning time, on N1 and N2 (p = 5; paper: CREW < OPR << PS, Ring, ToA, BLINK, A2A)."""
        schemes = ["crew", "opr", "ps", "gring", "toa", "a2a"] + (["blink"] if "blink" in planners.SCHEMES else [])
        out: dict[str, Any] = {}
        table = Table(title="Fig. 4: one partial reduce (n = 60, p = 5, 180 MB): completion s (median over "
                            "seeds) and planning ms")
        table.add_column("network")
        for s in schemes:
            table.add_column(s, justify="right")
        for net_kind in ("N1", "N2"):
            times: dict[str, list[float]] = {s: [] for s in schemes}
            plan_ms: dict[str, list[float]] = {s: [] for s in schemes}
            for seed in self.seeds:
                for s, (task_s, ms) in one_task_times(net_kind, seed, schemes).items():
                    plan_ms[s].append(ms)
                    times[s].append(task_s)
            out[net_kind] = {s: {"task_s": statistics.median(times[s]), "plan_ms": statistics.median(plan_ms[s])}
                             for s in schemes}
            table.add_row(net_kind, *[f"{out[net_kind][s]['task_s']:.2f} s / {out[net_kind][s]['plan_ms']:.1f} ms"
                                      for s in schemes])
        Console(width=160).print(table)
        if "blink" not in schemes:
            out["blink"] = "not on main yet: left out"
        return out

    def fig7(self) -> dict[str, Any]:
        """Rounds in 50 s for the five flow-scheduling schemes (N-A) at p = 4, 5, 10, 12 (paper: FL best,
        C1 worst ~ TL, C2 hurts less, FS below FL)."""
        scheds = ("fl", "fs", "tl", "c1", "c2")
        ps = (4, 5, 10, 12)
        cases = [(f"crew-na-{s}", p, seed, "N2", "T1", {}) for s in scheds for p in ps for seed in self.seeds]
        rows = run_cases(sorted(cases, key=lambda c: -_cost(c)), self.args.procs)
        out = {f"{s}_p{p}": statistics.median(r["rounds"] for r in rows if r["scheme"] == f"crew-na-{s}"
                                              and r["p"] == p) for s in scheds for p in ps}
        table = Table(title="Fig. 7: rounds per worker in 50 s by flow scheduling (N-A, median over seeds)")
        table.add_column("p")
        for s in scheds:
            table.add_column(s.upper(), justify="right")
        for p in ps:
            table.add_row(str(p), *[f"{out[f'{s}_p{p}']:.1f}" for s in scheds])
        Console(width=140).print(table)
        return out

    def fig6(self) -> dict[str, Any]:
        """Non-blocking vs blocking scatter (paper Fig. 6: never worse, up to 1.2x, sometimes slight)."""
        ps = (4, 5, 10, 12)
        rows = run_cases([(p, seed, nb) for p in ps for seed in self.seeds for nb in (False, True)],
                         self.args.procs, scatter_case)
        by = {(r["p"], r["seed"], r["nonblocking"]): r["rounds"] for r in rows}
        out = {f"p{p}": {"blocking": statistics.median(by[(p, s, False)] for s in self.seeds),
                         "nonblocking": statistics.median(by[(p, s, True)] for s in self.seeds),
                         "gain": statistics.median(by[(p, s, True)] / by[(p, s, False)] for s in self.seeds)}
               for p in ps}
        table = Table(title="Fig. 6: rounds per worker in 50 s, blocking vs non-blocking scatter (crew, median over "
                            "seeds; gain per seed)")
        for col in ("p", "blocking", "non-blocking", "gain"):
            table.add_column(col, justify="right")
        for p in ps:
            o = out[f"p{p}"]
            table.add_row(str(p), f"{o['blocking']:.1f}", f"{o['nonblocking']:.1f}", f"{o['gain']:.3f}")
        Console(width=140).print(table)
        return out

    def fig8(self) -> dict[str, Any]:
        """Rounds in 50 s as links fail (paper Fig. 8: a sharp drop once faults start, then nearly flat
        thanks to load-balanced replacement; larger p more sensitive)."""
        counts = (0, 1, 2, 4, 8, 16)
        ps = (5, 10)
        rows = run_cases([(p, seed, f) for p in ps for f in counts for seed in self.seeds], self.args.procs,
                         outage_case)
        out = {f"p{p}_f{f}": {k: statistics.median(r[k] for r in rows if r["p"] == p and r["f"] == f)
                              for k in ("rounds", "repaired", "abandoned")} for p in ps for f in counts}
        table = Table(title=f"Fig. 8: rounds per worker in 50 s as links fail for good (crew, detection "
                            f"{OUTAGE_DETECT_S:g} s, Eq. (3) repair; mean over workers, median over seeds: "
                            "rounds / repaired / abandoned)")
        table.add_column("p")
        for f in counts:
            table.add_column(f"{f} links", justify="right")
        for p in ps:
            table.add_row(str(p), *[f"{out[f'p{p}_f{f}']['rounds']:.1f} / {out[f'p{p}_f{f}']['repaired']:.0f} / "
                                    f"{out[f'p{p}_f{f}']['abandoned']:.0f}" for f in counts])
        Console(width=160).print(table)
        return out

    def noise(self) -> dict[str, Any]:
        """N-A and E-D deciding on noisy rates (paper Fig. 11: N-A degrades slowly, E-D is unaffected)."""
        lams = (0.0, 0.1, 0.3, 0.5)
        cases = [(s, 5, seed, "N2", "T2", {"noise": lam}) for s in ("crew", "crew-ed-fl") for lam in lams
                 for seed in self.seeds]
        rows = run_cases(cases, self.args.procs)
        out = {f"{s}_l{lam}": statistics.median(r["rounds"] for r in rows if r["scheme"] == s and r["noise"] == lam)
               for s in ("crew", "crew-ed-fl") for lam in lams}
        table = Table(title="Fig. 11: rounds in 50 s deciding on rates x (1 + U[-l, l]) (N2, T2 surrogate, p = 5)")
        table.add_column("scheme")
        for lam in lams:
            table.add_column(f"l = {lam}", justify="right")
        for s in ("crew", "crew-ed-fl"):
            table.add_row(s, *[f"{out[f'{s}_l{lam}']:.1f}" for lam in lams])
        Console(width=140).print(table)
        return out


def _idle() -> None:
    """A simulator process runs only on CPU nobody else wants (the live agents first)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def _cost(case: tuple) -> float:
    scheme, p = case[0], case[1]
    return 0.1 if scheme in ("a2a", "opr") or scheme.startswith("opr") else 1.0 + 5.0 / p


def _one_task(plan: Plan, net: SimNetwork) -> float:
    from sim.model import TaskRun
    from sim.stepped import NotOneHop, Stepped
    try:
        eng = Stepped(net, DT / 2)
        eng.add(TaskRun(0, plan, 0.0))
        return eng.run()[0][0]
    except NotOneHop:  # rings and trees: the exact engine
        return simulate(plan, net, mode="exact").round_s


# --- live --------------------------------------------------------------------------------------------
class LivePart:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.spec = f"crew:{LIVE_N}:seed={args.live_seed}:x={args.live_x:g}"
        self.topo = build(self.spec)
        self.params, self.chunk = args.live_model_mb * 1_000_000 // 4, args.live_chunk_kib * 256
        self.compute = compute_trace(tmp / "live-compute.csv", "T1", args.live_seed, LIVE_N)
        self.secret = generate_secret()
        self.cluster = "crew-" + self.secret[:8]
        self.options_file: Path | None = None  # written once: every agent reads the same
        self.sched = Scheduler(self.cluster, LIVE_N, secret=self.secret.encode())
        self.procs: dict[int, subprocess.Popen] = {}
        self.jobs: dict[str, JobState] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.injector: FaultInjector | None = None
        self.outage: dict[str, Any] = {}

    def spawn(self, node: int, port: int) -> None:
        if self.options_file is None:  # probes follow the chunk size (half a chunk), as --chunk does
            cfg = resolve(Options.make(topology=self.spec, nodes=self.topo.nodes, schemes=list(LIVE_SCHEMES),
                                       workload__model=str(self.params), scale=1.0, rounds=1,
                                       seed=self.args.live_seed, chunk=str(self.chunk)))
            self.options_file = agent_options_file(cfg, self.cluster)
        cmd = agent_command(self.options_file, node, f"127.0.0.1:{port}")
        self.procs[node] = spawn_agent(cmd, node, {SECRET_ENV: self.secret},
                                       self.args.agent_logs)

    async def run(self) -> dict[str, Any]:
        port = await self.sched.start()
        for n in range(LIVE_N):
            self.spawn(n, port)
        try:
            await self.sched.wait_agents(120)
            await self.job("warmup", "crew", self.args.warmup)
            for scheme in LIVE_SCHEMES:
                await self.job(scheme, scheme, self.args.live_budget)
            await self.outage_job()
        finally:
            if self.injector is not None:
                await self.injector.stop()
            await self.sched.shutdown()
            reap(list(self.procs.values()))
        return self.figures()

    async def job(self, name: str, scheme: str, budget: float, *, before_stop: Any = None) -> JobState:
        """A rounds job under the crew progress model, stopped after `budget` s: no new task forms, the
        running ones end, then JOB_END."""
        run = asyncio.create_task(self.sched.run_job(scheme, rounds=100_000, params=self.params,
                                                     chunk_params=self.chunk, progress="crew", group=LIVE_P,
                                                     compute=self.compute, seed=self.args.live_seed))
        await asyncio.sleep(0)
        js = self.sched.current
        assert js is not None
        self.jobs[name] = js
        if before_stop is not None:
            before_stop(js)
        await asyncio.sleep(max(0.0, js.t0 + budget - time.time()))
        js.progress.stop()
        t_stop = time.time()
        while any(t.recorded_t is None for t in js.tasks.values()) and time.time() - t_stop < GRACE_S:
            await asyncio.sleep(0.1)
        hung = [t.id for t in js.tasks.values() if t.recorded_t is None]
        try:
            await asyncio.wait_for(self.sched.close_job(js, timeout=GRACE_S), GRACE_S + 5)
            await asyncio.wait_for(run, 10)
        except TimeoutError:
            logging.warning("job %s did not close", name)
            run.cancel()
        self.results[name] = self.judge(js, budget, hung)
        return js

    async def outage_job(self) -> None:
        rng = random.Random(self.args.live_seed)
        a, b, k = rng.sample(range(LIVE_N), 3)
        faults = [parse(f"down:link={a}-{b}@t={self.args.down_at:g}"), parse(f"kill:node={k}@t={self.args.kill_at:g}")]
        self.outage = {"down": [a, b], "kill": k, "faults": [f.spec for f in faults]}

        def arm(js: JobState) -> None:
            self.injector = FaultInjector(faults, links=AppLinkControl(self.sched.send),
                                          pid_of=lambda n: self.procs[n].pid, rate_of=lambda s, d: 0.0,
                                          report=lambda rec: self.sched.note_event("fault", **{
                                              ("fault" if kk == "kind" else kk): v for kk, v in rec.items()
                                              if kk != "type"}))
            self.injector.start()
        js = await self.job("outage", "crew", self.args.outage_budget, before_stop=arm)
        pol = js.progress
        self.outage.update(failovers=len(pol.failovers), abandoned_by_policy=len(pol.abandoned),
                           failover_list=pol.failovers[:10], abandoned_list=[x["why"][:90] for x in pol.abandoned[:5]],
                           injected=[f"{x.get('action')} {x.get('spec', x.get('kind'))} at {x.get('t_run') or 0:.1f} s"
                                     for x in (self.injector.log if self.injector else [])])

    def judge(self, js: JobState, budget: float, hung: list[int]) -> dict[str, Any]:
        """Every record against the exact sum computed here; rounds per worker within the budget."""
        ok = wrong = aborted = 0
        why: list[str] = []
        rounds = dict.fromkeys(range(LIVE_N), 0)
        seen: set[tuple[int, int]] = set()
        for r in js.records:
            if r.aborted:
                aborted += 1
                continue
            want = exact_digest(r.members, r.iters, r.bytes // 4)
            good = (r.ok and sorted(int(n) for n in r.digests) == r.receivers and r.receivers == r.members
                    and all(d == want for d in r.digests.values())
                    and not any((m, i) in seen for m, i in r.iters.items()))
            seen.update(r.iters.items())
            if not good:
                wrong += 1
                why.append(f"task {r.task}: ok={r.ok} errors={r.errors[:1]} receivers={r.receivers} "
                           f"digests from {sorted(r.digests)} iters={r.iters}")
                continue
            ok += 1
            for m in r.members:
                end = r.spans.get(m, [0, r.t_end])[1]
                if end <= js.t0 + budget:
                    rounds[m] += 1
        live = [n for n in range(LIVE_N) if n in self.sched.agents or n in js.stats]
        per = [rounds[n] for n in live]
        g = job_guard(js)
        why += [f"task {t} never recorded (attempt {js.tasks[t].attempt}, members {list(js.tasks[t].members)})"
                for t in hung]
        return {"ok": ok, "wrong": wrong, "aborted": aborted, "hung": len(hung), "why": why[:5],
                "rounds_median": statistics.median(per) if per else 0.0, "rounds": rounds,
                "rounds_mean": statistics.fmean(per) if per else 0.0,
                "task_s_median": statistics.median([r.round_s for r in js.records if not r.aborted] or [0.0]),
                "plan_ms_per_task": 1e3 * js.policy_s / max(1, len(js.records)), "guard": g.verdict,
                "guard_reasons": g.reasons[:2], "tasks": len(js.records)}

    def predictions(self) -> dict[str, float]:
        """The simulator's job mode, blind, for each measured live job: same topology, compute draws,
        p and budget; plans on the configured rates; the data plane's measured costs."""
        view, net = oracle_view(self.topo), sim_network(self.topo)
        out = {}
        for scheme in LIVE_SCHEMES:
            spec = planners.resolve(scheme)

            def plan_for(members: tuple[int, ...], receivers: tuple[int, ...], spec: Any = spec) -> Plan:
                return spec.plan(view, Job(self.params, self.chunk, members, dict(spec.options)))
            pred = simulate_job(Queue(LIVE_P), plan_for, ComputeModel(self.compute, seed=self.args.live_seed),
                                range(LIVE_N), net, self.args.live_budget, costs=MEASURED)
            out[scheme] = statistics.fmean(pred.iterations.values())
        return out

    def figures(self) -> dict[str, Any]:
        res = self.results
        pred = self.predictions()
        # rounds per worker as the mean over the workers: a median of a few integer counts (A2A does
        # 3-4 in 30 s) moves by a whole round with one worker
        errs = {s: 100 * abs(pred[s] - res[s]["rounds_mean"]) / res[s]["rounds_mean"]
                if res[s]["rounds_mean"] else None for s in LIVE_SCHEMES}
        crew, opr, a2a = (res[s]["rounds_mean"] for s in LIVE_SCHEMES)
        out = res.get("outage", {})
        figs: dict[str, Any] = {
            "live_rounds_crew_over_opr": crew / opr if opr else None,
            "live_rounds_crew_over_a2a": crew / a2a if a2a else None,
            "live_rounds": {s: res[s]["rounds_mean"] for s in LIVE_SCHEMES},
            "live_rounds_median": {s: res[s]["rounds_median"] for s in LIVE_SCHEMES},
            "live_tasks_wrong": sum(res[s]["wrong"] + res[s]["hung"] for s in ("warmup", *LIVE_SCHEMES)),
            "live_tasks_aborted": sum(res[s]["aborted"] for s in LIVE_SCHEMES),
            "live_outage_tasks_ok": out.get("ok"), "live_outage_tasks_wrong": out.get("wrong", 0) + out.get("hung", 0),
            "live_outage_tasks_abandoned": out.get("aborted"), "live_outage_failovers": self.outage.get("failovers"),
            "live_outage": {k: v for k, v in self.outage.items() if k != "failover_list"},
            "live_not_exact": {name: res[name]["why"] for name in res if res[name]["why"]},
            "sim_vs_live_max_err_pct": max((e for e in errs.values() if e is not None), default=None),
            "sim_vs_live_err_pct": errs, "sim_live_rounds": pred,
            "live_plan_ms_per_task": {s: res[s]["plan_ms_per_task"] for s in LIVE_SCHEMES},
            "live_task_s_median": {s: res[s]["task_s_median"] for s in LIVE_SCHEMES},
            "live_topology": self.spec, "live_budget_s": self.args.live_budget, "live_p": LIVE_P,
            "live_model_bytes": self.params * 4, "live_chunk_bytes": self.chunk * 4,
            "live_loaded_machine_note": "live figures depend on the machine's load (2 cores shared)",
            **live_guard([self.jobs[s] for s in LIVE_SCHEMES])}
        table = Table(title=f"live on {self.spec}, p = {LIVE_P}, {self.args.live_budget:g} s wall-clock per scheme")
        for col in ("job", "rounds / worker (mean, median)", "sim (mean)", "tasks ok", "wrong", "abandoned", "task s",
                    "plan ms", "guard"):
            table.add_column(col, justify="right")
        for name in ("warmup", *LIVE_SCHEMES, "outage"):
            r = res[name]
            table.add_row(name, f"{r['rounds_mean']:.2f}, {r['rounds_median']:.1f}",
                          f"{pred[name]:.2f}" if name in pred else "-",
                          str(r["ok"]), str(r["wrong"] + r["hung"]), str(r["aborted"]), f"{r['task_s_median']:.2f}",
                          f"{r['plan_ms_per_task']:.1f}", f"{r['guard']} {'; '.join(r['guard_reasons'])[:60]}")
        Console(width=160).print(table)
        for name in ("warmup", *LIVE_SCHEMES, "outage"):
            for w in res[name]["why"]:
                print(f"{name}: NOT EXACT: {w}")
        print(f"outage: {json.dumps(self.outage)}")
        return figs


# --- main --------------------------------------------------------------------------------------------
def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the check's run: the headline figures only (<= 5 min)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--procs", type=int, default=2, help="simulator processes (default 2)")
    ap.add_argument("--dt", type=float, default=None, help="the stepped engine's step (default 0.01 s; "
                    "--quick: 0.02 s, about 3 %% fewer rounds for every scheme alike)")
    ap.add_argument("--skip-live", action="store_true")
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--no-sim-during-live", dest="sim_during_live", action="store_false",
                    help="run the headline simulations after the live jobs instead of on idle CPU during them")
    ap.add_argument("--live-budget", type=float, default=30.0, help="wall-clock seconds per live scheme (>= 30)")
    ap.add_argument("--warmup", type=float, default=6.0, help="seconds of a crew job first (the view learns)")
    ap.add_argument("--outage-budget", type=float, default=20.0, help="seconds of the outage job")
    ap.add_argument("--live-x", type=float, default=0.1, help="rate multiplier of the live crew:12 (default 0.1)")
    ap.add_argument("--live-seed", type=int, default=1)
    ap.add_argument("--live-model-mb", type=int, default=8, help="live model size in MB (default 8)")
    ap.add_argument("--live-chunk-kib", type=int, default=128, help="live chunk size (default 128 KiB: ~5 per block)")
    ap.add_argument("--down-at", type=float, default=4.0, help="outage job: the link goes down at t (s)")
    ap.add_argument("--kill-at", type=float, default=9.0, help="outage job: the worker is killed at t (s)")
    ap.add_argument("--agent-logs", type=Path, default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    global DT
    DT = args.dt if args.dt is not None else 0.02 if args.quick else 0.01
    res: dict[str, Any] = {"quick": args.quick}
    t0 = time.time()
    sp = None if args.skip_sim else SimPart(args)
    if sp is not None and not args.skip_live and args.sim_during_live:
        sp.start(idle=True)  # the headline simulations on idle CPU while the live jobs run
    if not args.skip_live:
        with tempfile.TemporaryDirectory() as d:
            live = LivePart(args, Path(d))
            with contextlib.suppress(KeyboardInterrupt):
                res.update(asyncio.run(live.run()))
    if sp is not None:
        head, _ = sp.headline()
        res.update(head)
        if not args.quick:
            res["fig4"] = sp.fig4()
            res["fig6"] = sp.fig6()
            res["fig7"] = sp.fig7()
            res["fig8"] = sp.fig8()
            res["noise"] = sp.noise()
    res["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(res, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
