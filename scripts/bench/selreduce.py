"""Selective reduce (seed 003): BAG + bpaWR against P-Reduce and all-reduce, in the simulator at the
paper's scale and live with real training.

Simulated (blind, sim.job with the paper's ring cost model, sim/ringcost.py): n = 40, 80, 120, 200
workers on a non-blocking switch, b_i = round(20u, 3) Gbit/s with u ~ U[lambda, 1] (lambda 0.05),
alpha 1 ms, a 500 MB model, 100 s of training; CNN-like runtimes (core.compute `cnn`: lognormal,
cv 0.1, 1.5-2x spikes in 1 round of 20) of mean 0.5 s (the paper's traces are lost; "sub-second").
p = 0.3 n, eta 0.3, theta 1, dt = 5 % of the mean round (the digest's rule for the emulation, used
at both scales), warm start, the hazard form of Eq. 4 (see below). Per scheme and n, over seeds
(median, min-max): average sync time (launch to done), average scale, total syncs, iterations per
worker, wasted wait (% of worker time), starvation (the longest any worker went without a sync).

Live (16 `wansync agent` processes, application shaping): the same switch at 4 Mbit/s per unit
(b = 4-80 Mbit/s; the same draws as the simulator's seed), alpha 1 ms, p = 5; a 64-512-320-10 ReLU MLP
(200,650 parameters + a 5-value check trailer: 0.80 MB of float32) trained on scikit-learn's digits
(IID shards, 2 SGD steps of 32 per round, lr 0.1), weighted ring averages inside each group,
CNN-like rounds of mean 0.2 s (the simulator's compute / fastest-sync ratio, 1.25), dt 10 ms. Each
scheme runs for the same wall-clock budget; a full all-reduce then takes ~1.5 s (the slowest edge is
~10 Mbit/s). Every sync is judged: every receiver's digest the same, each within float32 rounding of
the members' weighted sum (agents.training's in-band check), the members and iterations as launched.
The simulator's job mode replays each live job blind (exact engine, same policy, compute draws and
bandwidths); its average sync time is compared with the live one.

Eq. 4: the paper's literal F(t + dt) over-predicts arrivals (digest §2.3) and makes the controller
wait in windows nobody arrives in: ~3 % of worker time at n = 200 against the paper's < 0.01 %. The
headline runs the true conditional (hazard) the paper starts from; `prob_model=paper` is an
ablation row of the full run, with its wasted wait.

    python scripts/bench/selreduce.py [--quick] [--seeds 10] [--budget 90] [--out r.jsonl] [--no-live]

Prints tables; the last stdout line is one JSON object (sim_sync_time_pr_over_sr, sim_order_ok,
sim_scale_over_p, wasted_wait_pct, live_sync_time_sr_over_pr, live_iterations_sr_over_pr,
live_accuracy_at_budget, sim_vs_live_max_err_pct, syncs_wrong, live_guard_valid, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_common import spawn_agent  # noqa: E402

from agents.training import TrainingSpec  # noqa: E402
from core.compute import ComputeModel  # noqa: E402
from core.plan import Job, Plan  # noqa: E402
from core.selective import SelectiveConfig  # noqa: E402
from emulation.simnet import sim_network  # noqa: E402
from emulation.switch import edge_bandwidths, switch  # noqa: E402
from overlay.auth import SECRET_ENV, generate_secret  # noqa: E402
from overlay.messages import JobEnd  # noqa: E402
from scheduler.live import LiveState  # noqa: E402
from scheduler.planners import ring  # noqa: E402
from scheduler.progress.selective import SelectiveReduce  # noqa: E402
from scheduler.service import Scheduler  # noqa: E402
from scheduler.tasks import JobState  # noqa: E402
from sim import MEASURED, SimNetwork, simulate_job  # noqa: E402
from sim.job import Selective  # noqa: E402
from wansync.backend import agent_command  # noqa: E402
from wansync.cluster import agent_options_file  # noqa: E402
from wansync.guard import job_guard, live_guard  # noqa: E402
from wansync.options import Options  # noqa: E402
from wansync.predict import oracle_view  # noqa: E402
from wansync.procs import reap  # noqa: E402
from wansync.results import Recorder, Results  # noqa: E402
from wansync.runspec import resolve  # noqa: E402

SCHEMES = ("sr", "pr", "ar")
# --- the paper's simulation (digest §4, §2.8) ---------------------------------------------------------
NS = (40, 80, 120, 200)
PAPER_V_MB = 500.0
GBIT = 1000.0  # Mbit/s per bandwidth unit
ALPHA_S = 0.001
LAMBDA = 0.05
SIM_BUDGET_S = 100.0
P_FRACTION = 0.3
ETA, THETA = 0.3, 1.0
COMPUTE_MEAN_S = 0.5  # per round at paper scale ("sub-second"; the traces are lost)
DT_FRACTION = 0.05  # dt = 5 % of the mean round (digest §2.8: the emulation's rule)
PROB_MODEL = "hazard"
STRICT_TRIGGER = True  # A6: the paper's `len(Q) > p` (pseudocode and prose); `>= p` is a sweep row
SWEEP_N = 120  # A19: the sweeps' n is not stated
PROFILE_ROUNDS = 1000  # warm start: a profile of this many rounds (another seed of the same model)
# --- live (16 agents on this machine) ------------------------------------------------------------------
LIVE_N = 16
LIVE_UNIT = 4.0  # Mbit/s per bandwidth unit: b in [4, 80] Mbit/s
LIVE_HIDDEN = (512, 320)
LIVE_CHUNK = 25_000  # parameters per chunk (100 KB); a ring of m cuts at least m
TARGET_ACC = 0.90
LIVE_C = 20  # a full all-reduce every 20 syncs in the live (convergence) runs, SR and PR alike (digest §2.8)
LIVE_WARM = False  # cold start live: the CDF of rounds as the controller sees them (with the agents' own
# overheads: applying, evaluating, messages), which no profile of the compute model knows
QUICK_BUDGET_S = 35.0
FULL_BUDGET_S = 90.0
GRACE_S = 45.0
HEARTBEAT_S = 5.0
STARTUP_S = 120.0


def p_of(n: int, frac: float = P_FRACTION) -> int:
    """A23: round(frac x n), at least 2."""
    return max(2, round(frac * n))


def med(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return statistics.median(v) if v else None


def spread(xs: Iterable[float | None]) -> str:
    v = [x for x in xs if x is not None]
    if not v:
        return "-"
    return f"{statistics.median(v):.3g} [{min(v):.3g}-{max(v):.3g}]"


def profile(compute: str, seed: int, rounds: int = PROFILE_ROUNDS) -> tuple[float, ...]:
    """Warm start: the runtime distribution known in advance, from a profile (another seed)."""
    m = ComputeModel(compute, seed=seed + 10_000)
    return tuple(m.draw(i % 50, i // 50) for i in range(rounds))


# --- the paper's scale, simulated ------------------------------------------------------------------------
class _Fabric:
    """The switch as the ring planner sees it: every worker reaches every other."""

    def require_connected(self, nodes: Iterable[int]) -> None:
        pass


def paper_network(bw: Mapping[int, float], alpha: float) -> SimNetwork:
    n = len(bw)
    fabric = 20 * GBIT
    rates = {(a, b): fabric for a in range(n) for b in range(n) if a != b}
    return SimNetwork(rates, dict.fromkeys(rates, alpha), lambda a, b: (a, b), dict(bw), dict(bw))


@dataclass(frozen=True)
class SimCase:
    n: int
    seed: int
    scheme: str
    lam: float = LAMBDA
    alpha: float = ALPHA_S
    compute: str = f"cnn:mean={COMPUTE_MEAN_S}"
    p_frac: float = P_FRACTION
    eta: float = ETA
    theta: float = THETA
    dt: float | None = None  # None: DT_FRACTION x the mean round
    prob_model: str = PROB_MODEL
    warm: bool = True
    bw_error: float = 0.0
    c: int | None = None
    strict_trigger: bool = STRICT_TRIGGER


def compute_mean(spec: str) -> float:
    return ComputeModel(spec).mean_of(0)


def run_sim(case: SimCase) -> dict[str, Any]:
    """One simulated run of the paper's setting: the controller's figures at the budget's end."""
    bw = edge_bandwidths(case.n, case.lam, GBIT, case.seed)
    params = int(PAPER_V_MB * 1e6 / 4)
    dt = case.dt if case.dt is not None else DT_FRACTION * compute_mean(case.compute)
    cfg = SelectiveConfig(scheme=case.scheme, p=p_of(case.n, case.p_frac), eta=case.eta, theta=case.theta, dt=dt,
                          v_mbit=params * 4 * 8 / 1e6, c=case.c, prob_model=case.prob_model, warm=case.warm,
                          bw_error=case.bw_error, weights="uniform", strict_trigger=case.strict_trigger,
                          seed=case.seed)
    fabric = _Fabric()

    def plan_for(members: tuple[int, ...], receivers: tuple[int, ...]) -> Plan:
        return ring.plan(fabric, Job(params, math.ceil(params / len(members)), members))  # type: ignore[arg-type]
    pred = simulate_job(Selective(cfg, bw, profile(case.compute, case.seed)), plan_for,
                        ComputeModel(case.compute, seed=case.seed), range(case.n), paper_network(bw, case.alpha),
                        SIM_BUDGET_S, engine="ring")
    assert pred.controller is not None
    return pred.controller.summary(SIM_BUDGET_S)


def sim_grid(cases: list[SimCase]) -> dict[SimCase, dict[str, Any]]:
    return {c: run_sim(c) for c in cases}


def by_seed(res: Mapping[SimCase, dict[str, Any]], base: SimCase, seeds: Iterable[int], scheme: str,
            key: str) -> list[float | None]:
    return [res[replace(base, seed=s, scheme=scheme)][key] for s in seeds]


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def sim_main(seeds: list[int], con: Console) -> tuple[dict[str, Any], dict[SimCase, dict[str, Any]]]:
    """Figs. 5 (CNN-like) at n = 40..200: the headline figures, medians over seeds."""
    cases = [SimCase(n, s, sch) for n in NS for s in seeds for sch in SCHEMES]
    res = sim_grid(cases)
    t = Table(title=f"simulated, paper scale (CNN-like, lambda {LAMBDA}, {len(seeds)} seeds: median [min-max]); "
              "paper: AR and PR rise with n, SR flat or falling, SR < PR < AR; SR scale up to ~1.25 p")
    for col in ("n", "scheme", "avg sync s", "avg scale", "syncs", "iterations/worker", "wasted wait %",
                "starvation s"):
        t.add_column(col, justify="right")
    order_ok, rows = True, {}
    for n in NS:
        base = SimCase(n, seeds[0], "sr")
        means = {}
        for sch in SCHEMES:
            g = {k: by_seed(res, base, seeds, sch, k) for k in ("mean_sync_s", "mean_scale", "syncs",
                                                                 "iterations_per_worker", "wasted_wait_pct",
                                                                 "starvation_s")}
            means[sch] = med(g["mean_sync_s"])
            rows[(n, sch)] = g
            t.add_row(str(n), sch, spread(g["mean_sync_s"]), spread(g["mean_scale"]), spread(g["syncs"]),
                      spread(g["iterations_per_worker"]), spread(g["wasted_wait_pct"]), spread(g["starvation_s"]))
        order_ok = order_ok and means["sr"] < means["pr"] < means["ar"]  # type: ignore[operator]
    con.print(t)
    top = NS[-1]
    pr_over_sr = [ratio(a, b) for a, b in zip(rows[(top, "pr")]["mean_sync_s"], rows[(top, "sr")]["mean_sync_s"],
                                                strict=True)]
    scale_p = [x / p_of(top) for x in rows[(top, "sr")]["mean_scale"] if x is not None]
    it_ratio = [ratio(a, b) for a, b in zip(rows[(top, "sr")]["iterations_per_worker"],
                                            rows[(top, "pr")]["iterations_per_worker"], strict=True)]
    wasted = [med(rows[(n, "sr")]["wasted_wait_pct"]) for n in NS]
    out = {
        "sim_sync_time_pr_over_sr": med(pr_over_sr),
        "sim_sync_time_pr_over_sr_range": [min(pr_over_sr), max(pr_over_sr)],  # type: ignore[type-var]
        "sim_order_ok": order_ok, "sim_scale_over_p": med(scale_p),
        "sim_scale_over_p_range": [min(scale_p), max(scale_p)],
        "sim_iterations_sr_over_pr": med(it_ratio),
        "sim_wasted_wait_pct_by_n": dict(zip(NS, wasted, strict=True)),
        "sim_avg_sync_s": {f"{sch}@{n}": med(rows[(n, sch)]["mean_sync_s"]) for n in NS for sch in SCHEMES},
        "sim_starvation_s_sr_200": med(rows[(top, "sr")]["starvation_s"]),
        "sim_seeds": len(seeds), "sim_prob_model": PROB_MODEL, "sim_dt_s": DT_FRACTION * COMPUTE_MEAN_S,
    }
    return out, res


SWEEPS: list[tuple[str, str, list[Any], str]] = [
    ("p/n", "p_frac", [0.1, 0.2, 0.3, 0.4, 0.5], "Fig. 8: at p = 0.5 n total sync and iterations collapse "
     "(one big group blocks the rest)"),
    ("eta", "eta", [0.0, 0.1, 0.3, 0.5, 0.8], "Fig. 9: scale rises with eta; sync time not necessarily; "
     "iterations rise then drop at 0.8; SR beats PR at every eta"),
    ("theta", "theta", [1.0, 5.0, 10.0, 20.0], "Fig. 10: not very sensitive; larger theta: scale falls slightly, "
     "sync time rises slightly"),
    ("warm", "warm", [True, False], "Fig. 11: cold and warm start: no visible gap"),
    ("bw error e", "bw_error", [0.0, 0.1, 0.2, 0.3, 0.5], "Fig. 12: sync time rises slightly, scale falls "
     "marginally: robust"),
    ("lambda", "lam", [0.05, 0.1, 0.2], "Fig. 13: SR beats PR at every lambda; the gain grows as lambda falls"),
    ("alpha s", "alpha", [0.0, 0.001, 0.005, 0.05], "Fig. 14: scale unaffected; sync time rises with alpha, "
     "fastest for AR, slowest for SR"),
    ("dt s", "dt", [0.001, 0.005, 0.01, 0.025, 0.05, 0.1], "not in the paper (dt is not given): the waiting "
     "slot; wasted wait grows with it"),
    ("Eq. 4", "prob_model", ["hazard", "paper"], "the paper's F(t + dt) over-predicts arrivals: more waiting, "
     "more wasted wait"),
    ("trigger > p", "strict_trigger", [True, False], "A6: the paper's `len(Q) > p`; with `>= p` a group launches "
     "as soon as p are ready and BAG has nobody to leave out unless they queued meanwhile"),
    ("compute", "compute", [f"cnn:mean={COMPUTE_MEAN_S}", f"transformer:mean={COMPUTE_MEAN_S}"],
     "Figs. 5/6: both traces, SR < PR"),
]


def sim_sweeps(seeds: list[int], con: Console) -> dict[str, Any]:
    """The paper's sweeps at n = 120 (A19), SR next to PR (AR where the figure has it), medians over seeds."""
    out: dict[str, Any] = {}
    for label, attr, values, shape in SWEEPS:
        t = Table(title=f"sweep {label} (n = {SWEEP_N}, {len(seeds)} seeds, median [min-max]); paper: {shape}")
        for col in (label, "scheme", "avg sync s", "avg scale / p", "syncs", "iterations/worker", "wasted wait %",
                    "starvation s", "PR / SR sync"):
            t.add_column(col, justify="right")
        figs = {}
        for v in values:
            schemes = ("sr", "pr", "ar") if attr == "alpha" else ("sr", "pr")
            if attr in ("warm", "prob_model", "dt", "theta", "eta", "bw_error", "strict_trigger"):
                schemes = ("sr",) + (("pr",) if v == values[0] else ())
            runs = {sch: [run_sim(replace(SimCase(SWEEP_N, s, sch), **{attr: v})) for s in seeds] for sch in schemes}
            pr_runs = runs.get("pr") or [run_sim(SimCase(SWEEP_N, s, "pr", **({attr: v} if attr in (
                "lam", "alpha", "compute", "p_frac") else {}))) for s in seeds]
            for sch, rs in runs.items():
                p = p_of(SWEEP_N, v if attr == "p_frac" else P_FRACTION)
                gain = [ratio(b["mean_sync_s"], a["mean_sync_s"]) for a, b in zip(rs, pr_runs, strict=True)]
                t.add_row(str(v), sch, spread(r["mean_sync_s"] for r in rs),
                          spread((r["mean_scale"] or 0) / p for r in rs), spread(r["syncs"] for r in rs),
                          spread(r["iterations_per_worker"] for r in rs), spread(r["wasted_wait_pct"] for r in rs),
                          spread(r["starvation_s"] for r in rs), spread(gain) if sch == "sr" else "")
                figs[f"{v}/{sch}"] = {"avg_sync_s": med(r["mean_sync_s"] for r in rs),
                                      "avg_scale": med(r["mean_scale"] for r in rs),
                                      "iterations_per_worker": med(r["iterations_per_worker"] for r in rs),
                                      "wasted_wait_pct": med(r["wasted_wait_pct"] for r in rs)}
        con.print(t)
        out[label] = figs
    return out


# --- live -----------------------------------------------------------------------------------------------
@dataclass
class LiveRun:
    scheme: str
    shard: str
    js: JobState | None = None
    policy: SelectiveReduce | None = None
    t0: float = 0.0
    t_end: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)
    accuracy: list[tuple[float, int, float]] = field(default_factory=list)  # (t - t0, node, acc)
    sim: dict[str, Any] = field(default_factory=dict)


class LiveBench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.live_p = args.live_p if args.live_p is not None else p_of(LIVE_N)
        self.topo = switch(LIVE_N, LAMBDA, LIVE_UNIT, args.seed)
        self.topo_spec = f"switch:{LIVE_N}:lam={LAMBDA}:unit={LIVE_UNIT:g}:seed={args.seed}"
        self.bw = {n: self.topo.uplink_mbps[n] for n in range(LIVE_N)}
        self.spec = TrainingSpec(n=LIVE_N, hidden=LIVE_HIDDEN, eval_s=args.eval_s, seed=args.seed)
        self.compute = f"cnn:mean={args.compute_mean}"
        self.secret = generate_secret()
        self.cluster = "selreduce-" + self.secret[:8]
        self.options_file: Path | None = None  # written once: every agent reads the same
        # 16 agents on 2 shared cores: a starved agent's heartbeat comes late, which is no failure to
        # react to (the fidelity guard judges the run); 1.5 s lost two agents mid-job on a loaded machine
        self.sched = Scheduler(self.cluster, LIVE_N, secret=self.secret.encode(), heartbeat_timeout=HEARTBEAT_S)
        self.results = Results(args.out)
        if args.out is not None:
            Recorder(self.results, self.sched, LiveState(self.sched))
        self.procs: dict[int, subprocess.Popen] = {}
        self.runs: list[LiveRun] = []
        self.schemes = tuple(getattr(args, "schemes", None) or SCHEMES)  # wansync reproduce: sr and pr alone

    def spawn(self, node: int, port: int) -> None:
        if self.options_file is None:
            cfg = resolve(Options.make(topology=self.topo_spec, nodes=self.topo.nodes, schemes=["ring"],
                                       workload__model=str(self.spec.vector_params), scale=1.0, rounds=1,
                                       seed=self.args.seed))
            self.options_file = agent_options_file(cfg, self.cluster)
        one_thread = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        cmd = agent_command(self.options_file, node, f"127.0.0.1:{port}")
        self.procs[node] = spawn_agent(cmd, node, {SECRET_ENV: self.secret},
                                       self.args.agent_logs, env=one_thread)

    async def run(self) -> None:
        port = await self.sched.start()
        self.results.write({"type": "run", "topology": self.topo_spec, "nodes": LIVE_N, "schemes": list(self.schemes),
                            "model": f"mlp 64-{'-'.join(map(str, LIVE_HIDDEN))}-10", "params": self.spec.vector_params,
                            "chunk_params": LIVE_CHUNK, "scale": 1.0, "seed": self.args.seed, "mode": "rounds"})
        for n in range(LIVE_N):
            self.spawn(n, port)
        try:
            await self.sched.wait_agents(STARTUP_S)
            await self.warmup()
            shards = ["iid"] + (["noniid"] if not self.args.quick else [])
            for shard in shards:
                for scheme in self.schemes:
                    dead = [(n, p.returncode) for n, p in self.procs.items() if p.poll() is not None]
                    if dead:
                        raise RuntimeError(f"agent process(es) exited: {dead}")
                    await self.one(scheme, shard)
        finally:
            await self.sched.shutdown()
            reap(list(self.procs.values()))
            self.results.close()

    def policy(self, scheme: str) -> SelectiveReduce:
        return SelectiveReduce(scheme, group=self.live_p, eta=ETA, theta=THETA,
                               dt=DT_FRACTION * self.args.compute_mean, c=LIVE_C if scheme != "ar" else None,
                               prob_model=PROB_MODEL, samples=profile(self.compute, self.args.seed), warm=LIVE_WARM,
                               weights="staleness", strict_trigger=STRICT_TRIGGER, seed=self.args.seed)

    async def warmup(self) -> None:
        """Every agent loads the data set and numpy's code paths once, unmeasured (a short AR job)."""
        pol = self.policy("ar")
        spec = replace(self.spec, eval_s=1e9).to_spec()
        js = await asyncio.wait_for(self.sched.run_job(
            "ring", rounds=2, params=self.spec.vector_params, chunk_params=LIVE_CHUNK, progress=pol,
            compute="constant:0", seed=self.args.seed, workload=spec), STARTUP_S)
        bad = [r for r in js.records if not (r.ok and r.digests_agree)]
        if bad:
            raise RuntimeError(f"warm-up syncs not exact: {bad[0].errors[:1]}")

    async def one(self, scheme: str, shard: str) -> None:
        run = LiveRun(scheme, shard)
        self.runs.append(run)
        pol = run.policy = self.policy(scheme)
        spec = replace(self.spec, shard=shard).to_spec()
        budget = self.args.budget
        job = asyncio.create_task(self.sched.run_job(
            "ring", rounds=100_000, params=self.spec.vector_params, chunk_params=LIVE_CHUNK, progress=pol,
            compute=self.compute, seed=self.args.seed, workload=spec))
        await asyncio.sleep(0)  # run_job opened the job before its first await
        js = run.js = self.sched.current
        assert js is not None
        run.t0 = pol.t0
        await asyncio.sleep(max(0.0, run.t0 + budget - time.time()))
        run.t_end = run.t0 + budget
        pol.stop()
        for n in sorted(self.sched.agents):
            with contextlib.suppress(RuntimeError, ConnectionError):
                self.sched.send(n, JobEnd(job=js.job))
        try:
            await asyncio.wait_for(asyncio.shield(job), GRACE_S)
        except TimeoutError:
            run.wrong.append(f"job {js.job} did not end within {GRACE_S:.0f} s of its budget")
            job.cancel()
        run.summary = pol.summary(run.t_end)
        self.judge(run)
        for node, st in sorted(js.stats.items()):
            for t, k, acc in (st.get("training") or {}).get("accuracy", []):
                run.accuracy.append((t - run.t0, node, acc))
                self.results.write({"type": "accuracy", "job": js.job, "scheme": f"{scheme}-{shard}", "node": node,
                                    "at": t, "t_rel": t - run.t0, "iteration": k, "accuracy": acc})
        if shard == "iid":
            run.sim = self.simulate(run)

    def judge(self, run: LiveRun) -> None:
        """Every sync recorded: not aborted, each receiver's own check passed (the in-band float32 bound),
        all receivers' digests the same, the members and their iterations those the controller launched."""
        assert run.js is not None and run.policy is not None and run.policy.controller is not None
        launched = {s.gid: s for s in run.policy.controller.syncs.values()}
        gid_of = {}
        for t in run.js.tasks.values():
            gid_of[t.id] = t
        for rec in run.js.records:
            why = ""
            if rec.aborted:
                why = "aborted"
            elif not rec.ok:
                why = "; ".join(rec.errors[:1]) or "a receiver's check failed"
            elif not rec.digests_agree or len(set(rec.digests.values())) != 1:
                why = "receivers hold different bytes"
            elif sorted(int(n) for n in rec.digests) != rec.members:
                why = f"digests from {sorted(rec.digests)}, members {rec.members}"
            if why:
                run.wrong.append(f"task {rec.task}: {why}")
        members = sorted(tuple(s.members) for s in launched.values())
        formed = sorted(tuple(t.members) for t in run.js.tasks.values())
        if members != formed:
            run.wrong.append("the tasks formed are not the groups the controller launched")

    def simulate(self, run: LiveRun) -> dict[str, Any]:
        """The live job replayed blind: the same controller settings, compute draws and bandwidths; tasks
        planned by the ring planner on the configured rates, in the exact engine with the data plane's
        measured costs."""
        assert run.policy is not None and run.policy.controller is not None
        view = oracle_view(self.topo)
        params = self.spec.vector_params

        def plan_for(members: tuple[int, ...], receivers: tuple[int, ...]) -> Plan:
            return ring.plan(view, Job(params, LIVE_CHUNK, members))
        cfg = run.policy.controller.cfg
        t = time.time()
        pred = simulate_job(Selective(cfg, self.bw, run.policy.samples), plan_for,
                            ComputeModel(self.compute, self.args.seed), range(LIVE_N), sim_network(self.topo),
                            self.args.budget, costs=MEASURED)
        assert pred.controller is not None
        s = pred.controller.summary(self.args.budget)
        return {"mean_sync_s": s["mean_sync_s"], "iterations_per_worker": s["iterations_per_worker"],
                "mean_scale": s["mean_scale"], "syncs": s["syncs"], "wall_s": time.time() - t}


def accuracy_at(acc: list[tuple[float, int, float]], t: float, workers: int) -> float | None:
    """The mean over workers of each one's latest held-out accuracy at time t (None before all evaluated)."""
    latest: dict[int, float] = {}
    for tt, node, a in sorted(acc):
        if tt > t:
            break
        latest[node] = a
    return statistics.fmean(latest.values()) if len(latest) == workers else None


def time_to(acc: list[tuple[float, int, float]], target: float, workers: int) -> float | None:
    for tt in sorted({t for t, _, _ in acc}):
        a = accuracy_at(acc, tt, workers)
        if a is not None and a >= target:
            return tt
    return None


def live_figures(bench: LiveBench, con: Console) -> dict[str, Any]:
    runs = {(r.scheme, r.shard): r for r in bench.runs}
    t = Table(title=f"live: {LIVE_N} agents, switch x {LIVE_UNIT:g} Mbit/s (b {min(bench.bw.values()):.0f}-"
              f"{max(bench.bw.values()):.0f}), MLP {bench.spec.model_params:,} params on digits, "
              f"{bench.args.budget:g} s each (a loaded 2-core machine)")
    for col in ("scheme", "shard", "syncs", "avg sync s", "sim s", "err %", "ready->done s", "avg scale",
                "iterations/worker", "sim it/w", "wasted wait %", "starvation s", f"acc@{bench.args.budget:g}s",
                f"t to {TARGET_ACC:.0%}", "wrong", "guard"):
        t.add_column(col, justify="right")
    errs, wrong, jobs = [], 0, []
    for r in bench.runs:
        s = r.summary
        assert r.js is not None
        jobs.append(r.js)
        g = job_guard(r.js)
        err = None
        if r.sim.get("mean_sync_s") and s.get("mean_sync_s"):
            err = 100 * (r.sim["mean_sync_s"] - s["mean_sync_s"]) / s["mean_sync_s"]
            errs.append(abs(err))
        wrong += len(r.wrong)
        acc = accuracy_at(r.accuracy, bench.args.budget, LIVE_N)
        tta = time_to(r.accuracy, TARGET_ACC, LIVE_N)
        r.summary.update(acc_at_budget=acc, time_to_target_s=tta, guard=g.verdict)
        t.add_row(r.scheme, r.shard, str(s.get("syncs")), _f(s.get("mean_sync_s")), _f(r.sim.get("mean_sync_s")),
                  _f(err), _f(s.get("mean_ready_to_done_s")), _f(s.get("mean_scale")),
                  _f(s.get("iterations_per_worker")), _f(r.sim.get("iterations_per_worker")),
                  _f(s.get("wasted_wait_pct")), _f(s.get("starvation_s")), _f(acc), _f(tta), str(len(r.wrong)),
                  f"{g.verdict} {_f(g.worst_ratio)}")
    con.print(t)
    for r in bench.runs:
        for w in r.wrong[:5]:
            con.print(f"[red]{r.scheme}-{r.shard}: {w}[/]")
    sr, pr = runs.get(("sr", "iid")), runs.get(("pr", "iid"))

    def err_pct(r: LiveRun) -> float | None:
        live, sim = r.summary.get("mean_sync_s"), r.sim.get("mean_sync_s")
        return 100 * (sim - live) / live if live and sim else None
    out: dict[str, Any] = {
        "live_sync_time_sr_over_pr": ratio(sr.summary.get("mean_sync_s"), pr.summary.get("mean_sync_s"))
        if sr and pr else None,
        "live_iterations_sr_over_pr": ratio(sr.summary.get("iterations_per_worker"),
                                            pr.summary.get("iterations_per_worker")) if sr and pr else None,
        "live_accuracy_at_budget": {r.scheme: r.summary.get("acc_at_budget") for r in bench.runs if r.shard == "iid"},
        "live_time_to_90_s": {f"{r.scheme}-{r.shard}": r.summary.get("time_to_target_s") for r in bench.runs},
        "live_avg_sync_s": {f"{r.scheme}-{r.shard}": r.summary.get("mean_sync_s") for r in bench.runs},
        "live_avg_scale": {f"{r.scheme}-{r.shard}": r.summary.get("mean_scale") for r in bench.runs},
        "live_iterations_per_worker": {f"{r.scheme}-{r.shard}": r.summary.get("iterations_per_worker")
                                       for r in bench.runs},
        "live_wasted_wait_pct": sr.summary.get("wasted_wait_pct") if sr else None,
        "live_starvation_s": {f"{r.scheme}-{r.shard}": r.summary.get("starvation_s") for r in bench.runs},
        "live_syncs": sum(len(r.js.records) for r in bench.runs if r.js is not None),
        "sim_vs_live_max_err_pct": max(errs) if errs else None,
        "sim_vs_live_err_pct": {r.scheme: err_pct(r) for r in bench.runs if r.shard == "iid"},
        "syncs_wrong": wrong,
        "live_model_params": bench.spec.model_params, "live_unit_mbps": LIVE_UNIT,
        "live_bandwidth_mbps": [min(bench.bw.values()), max(bench.bw.values())],
        "live_full_allreduce_s": 2 * (LIVE_N - 1) / LIVE_N * bench.spec.vector_params * 32 / 1e6
        / min(bench.bw.values()),
        "live_budget_s": bench.args.budget, "live_p": bench.live_p,
        "live_float_tolerance": "(m+1) * 2^-24 * sum_j w_j |x_j| per element",
        **live_guard(jobs)}
    return out


def _f(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the check's run: 3 seeds, no sweeps, IID only, "
                    f"{QUICK_BUDGET_S:g} s per live scheme (under 5 min)")
    ap.add_argument("--seeds", type=int, default=None, help="simulated seeds (default 10; --quick 3)")
    ap.add_argument("--seed", type=int, default=1, help="the live run's bandwidth, compute and data seed")
    ap.add_argument("--budget", type=float, default=None, help=f"live seconds per scheme (default {FULL_BUDGET_S:g})")
    ap.add_argument("--compute-mean", type=float, default=0.2, help="live mean round, s (default 0.2)")
    ap.add_argument("--live-p", type=int, default=None,
                    help=f"live p, the minimum group (default round({P_FRACTION} x {LIVE_N}))")
    ap.add_argument("--eval-s", type=float, default=2.0, help="a worker evaluates held-out accuracy this often")
    ap.add_argument("--no-live", action="store_true", help="the simulator only")
    ap.add_argument("--no-sweeps", action="store_true", help="skip the sweeps of the full run")
    ap.add_argument("--out", type=Path, default=None, help="a results file (tasks, accuracy) for wansync plot")
    ap.add_argument("--agent-logs", type=Path, default=None, help="each agent's stderr to DIR/agentN.log")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    args.seeds = args.seeds or (3 if args.quick else 10)
    args.budget = args.budget or (QUICK_BUDGET_S if args.quick else FULL_BUDGET_S)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    con = Console(width=160)
    t0 = time.time()
    seeds = list(range(1, args.seeds + 1))
    res, _ = sim_main(seeds, con)
    res["sim_wall_s"] = round(time.time() - t0, 1)
    if not args.quick and not args.no_sweeps:
        res["sim_sweeps"] = sim_sweeps(seeds, con)
    if not args.no_live:
        bench = LiveBench(args)
        asyncio.run(bench.run())
        res.update(live_figures(bench, con))
    res["wasted_wait_pct"] = res["sim_wasted_wait_pct_by_n"][NS[-1]]  # the headline setting, n = 200
    res["wall_s"] = round(time.time() - t0, 1)
    s = Table(title="selective reduce: headline figures")
    s.add_column("figure")
    s.add_column("value", justify="right")
    for k, v in res.items():
        if not isinstance(v, dict) and k != "sim_sweeps":
            s.add_row(k, _f(v) if not isinstance(v, list) else str(v))
    con.print(s)
    print(json.dumps(res, default=str))
    return 0 if res.get("syncs_wrong", 0) == 0 else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
