"""Tasks: random partial reduces, several in flight at once, with aggregators outside their members.

A scheduler here and one `wansync agent` process per node (authenticated, application shaping) on
internet2, scaled. One tasks job per scheme: `star` with its hub outside the members (the hub only
aggregates and sends back) and `mst` with `aggregators` (non-member nodes the tree needs between its
members: they sum what passes through without contributing). Each job keeps `--in-flight` tasks
running at once, each on a random subset of 3-5 nodes, refilled as they finish, until its share of
the time budget is spent. A third of the tasks carry integer weights; some star tasks also deliver
to their hub (receivers != members).

Then the units SelMcast, selective reduce and CREW build on, live on the same agents:
  mcast   a tasks job of multicasts: in waves, every node sends its tensor to a random half of the
          others, at once, alternately one unicast per receiver (l7) and replicated where routes
          part (l3); every delivery judged against the source's exact tensor
  ssp     a job of iterations under SSP, s = 2, per-node lognormal compute: after each iteration a
          worker's parameters are multicast to all others; the rule (its own multicast of k - 1
          over, and k <= the slowest's last iteration over + 1 + s) is checked here on every READY,
          from the scheduler's clock
  queue   a job of iterations under a ready queue (P-Reduce, p = 3), the same compute model: the first
          p ready workers form a partial reduce of their own iterations' contributions

Then the blind simulator's cases (`--only-cases`: these alone): per case a warm-up burst, then
bursts of tasks started together — 3 partial reduces (mst with aggregators), 3 multicasts (l7, l3),
and 2 pairs of 8 MiB multicasts over one route weighted 3:1 (`sharing`) — each task's live time
against sim.simulate_tasks replaying its burst from the plans and the configured topology alone
(the live start times as arrivals). The pairs also give the share figure: the bytes of each
delivered while both were received (the receiver's own counts, TASK_DONE `beside`) against 3:1.

Every task is judged here, not only by the agents' own check: each receiver's digest must equal the
digest of the exact (weighted) sum this script computes from the contributions' closed form, the
members and receivers must be those asked for. Overlap: on each agent, from the spans the agents
timed with their synced clocks, the most tasks whose parts ran at the same moment.

    python scripts/bench/tasks.py [--quick] [--minutes 4] [--in-flight 5] [--scale 0.01] [--out r.jsonl]

Prints tables; the last stdout line is one JSON object (tasks_started, tasks_ok_pct, tasks_wrong,
tasks_aborted, concurrent_overlap_max, live_guard_valid, multicast_deliveries, multicast_wrong,
ssp_violations, ready_tasks, share_error_pct, sim_vs_live_median_err_pct (over every compared task),
sim_vs_live_max_err_pct (the worst case's median), ...). Every task of every phase counts in the
tasks_* figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_common import result_digest, spawn_agent  # noqa: E402

from agents.workload import chunk_params, model_params  # noqa: E402
from core.compute import ComputeModel  # noqa: E402
from core.plan import (
    Job,  # noqa: E402
    Plan,  # noqa: E402
)
from emulation.simnet import sim_network  # noqa: E402
from emulation.topology import Topology, internet2  # noqa: E402
from overlay.auth import SECRET_ENV, generate_secret  # noqa: E402
from scheduler import planners  # noqa: E402
from scheduler.live import LiveState  # noqa: E402
from scheduler.service import Scheduler  # noqa: E402
from scheduler.tasks import JobState, TaskRecord  # noqa: E402
from sim import MEASURED, SimNetwork, TaskRun, simulate_job, simulate_tasks  # noqa: E402
from sim.job import Queue as SimQueue  # noqa: E402
from sim.job import Ssp as SimSsp  # noqa: E402
from wansync.backend import agent_command  # noqa: E402
from wansync.cluster import agent_options_file  # noqa: E402
from wansync.guard import job_guard, live_guard  # noqa: E402
from wansync.options import Options  # noqa: E402
from wansync.predict import oracle_view  # noqa: E402
from wansync.procs import reap  # noqa: E402
from wansync.results import Recorder, Results  # noqa: E402
from wansync.runspec import resolve  # noqa: E402

SCHEMES = ["star", "mst"]
# the blind simulator's cases (after the phases): bursts of tasks started together, replayed by sim
# from the plans and the configured topology alone, each task's time compared with the live one
BURSTS = 2  # bursts of partial reduces (mst with aggregators) and of multicasts
WARMUP_BURSTS = 1  # per case, judged exact but not compared (a job's first tasks pay its cold start)
BURST_TASKS = 3  # partial reduces at once per burst
SHARE_WEIGHTS = (3.0, 1.0)  # two multicasts over the same route at once, weighted 3:1
SHARE_PAIRS = 2
SHARE_PARAMS = 1 << 21  # 8 MiB per task: ~40 segments of the light class by the heavy one's end
# each phase's share of the time budget: the partial reduces first, then multicast, SSP, ready queue
PHASES = {"star": 0.3, "mst": 0.3, "mcast": 0.15, "ssp": 0.125, "queue": 0.125}
STALENESS, GROUP = 2, 3
COMPUTE_MEAN_S = 0.4  # per-node lognormal compute (each node its own mean, within +-50 %)
GRACE_S = 30.0  # a task not recorded this long after its job's time is up counts as hung (and fails the run)
CLOSE_S = 30.0  # a job's agents send their STATS within this of JOB_END
QUICK_MINUTES = 1.5  # --quick: two jobs of 45 s; with startup, grace and judging well under 4 min


# --- the exact sums, written out again from the workload's definition (agents/workload.py) ----------
@lru_cache(maxsize=2)
def _terms(params: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(params, dtype=np.int64)
    return 7 * i, i >> 5


def closed_form(rnd: int, node: int, params: int) -> np.ndarray:
    """Node n's contribution to the task of round r, element i, attempt 0 (tasks always contribute
    attempt 0's values), in int64: ((7i + 13n + 31r + (i >> 5) n) mod 64) - 32."""
    seven_i, i_shr5 = _terms(params)
    return (seven_i + 13 * node + 31 * rnd + i_shr5 * node) % 64 - 32


def exact_digest(rnd: int, members: Iterable[int], params: int, weights: Mapping[int, int] | None = None,
                 iters: Mapping[int, int] | None = None) -> str:
    """Hex XXH3-64 (what agents report) of the float32 bytes of the members' exact
    (integer-)weighted sum: summed in int64, where nothing rounds, then stored as float32 (exact: every
    value is below 2^24). `iters`: the iteration each member's contribution comes from (default `rnd`)."""
    total = np.zeros(params, dtype=np.int64)
    for n in members:
        total += int((weights or {}).get(n, 1)) * closed_form((iters or {}).get(n, rnd), n, params)
    assert np.abs(total).max(initial=0) < 2**24
    return result_digest(total.astype(np.float32))


# --- what is asked ---------------------------------------------------------------------------------
@dataclass
class Ask:
    """One task as this script asks for it, and what became of it."""

    scheme: str
    members: list[int]
    receivers: list[int] | None  # None: the members
    options: dict[str, Any]
    weights: dict[int, int] | None
    iters: dict[int, int] | None = None  # member -> its iteration (tasks of a progress model)
    rec: TaskRecord | None = None
    exact: int = 0  # receivers whose result is the exact sum (a multicast's deliveries)
    verdict: str = "pending"  # ok, wrong, aborted, hung
    why: str = ""
    t_asked: float = 0.0
    t_back: float = 0.0

    @property
    def want_receivers(self) -> list[int]:
        return sorted(self.members if self.receivers is None else self.receivers)


def adjacency(topo: Topology) -> dict[int, set[int]]:
    adj: dict[int, set[int]] = {n: set() for n in range(topo.nodes)}
    for a, b in topo.links:
        adj[a].add(b)
        adj[b].add(a)
    return adj


def shortest_path(adj: Mapping[int, set[int]], a: int, b: int, rng: random.Random) -> list[int]:
    """A min-hop path a..b (ties broken at random)."""
    prev: dict[int, int | None] = {a: None}
    frontier = [a]
    while frontier and b not in prev:
        nxt = []
        for u in frontier:
            for v in rng.sample(sorted(adj[u]), len(adj[u])):
                if v not in prev:
                    prev[v] = u
                    nxt.append(v)
        frontier = nxt
    path, n = [], b
    while n is not None:
        path.append(n)
        n = prev[n]
    return path[::-1]


def pick(scheme: str, topo: Topology, adj: Mapping[int, set[int]], rng: random.Random) -> Ask:
    """A random partial reduce on 3-5 nodes with at least one aggregator outside its members."""
    nodes = list(range(topo.nodes))
    for _ in range(100):
        members = sorted(rng.sample(nodes, rng.randint(3, 5)))
        weights = {n: rng.randint(1, 3) for n in members} if rng.random() < 1 / 3 else None
        if scheme == "star":
            hub = rng.choice([n for n in nodes if n not in members])
            receivers = sorted([*members, hub]) if rng.random() < 0.25 else None
            return Ask(scheme, members, receivers, {"hub": hub}, weights)
        # mst needs direct links: the nodes on min-hop paths between the members become its aggregators
        inner = set(members)
        for m in members[1:]:
            inner.update(shortest_path(adj, members[0], m, rng))
        aggregators = sorted(inner - set(members))
        if aggregators:
            return Ask(scheme, members, None, {"aggregators": aggregators}, weights)
    raise RuntimeError("no member subset needs an aggregator on this topology")


def overlap_max(spans: Iterable[tuple[float, float]]) -> int:
    """The most intervals that hold one moment in common (an interval ending when another starts
    does not overlap it)."""
    ev = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def ssp_breaches(events: Iterable[tuple[float, str, int, int]], workers: Iterable[int], s: int
                 ) -> tuple[list[tuple[int, int]], int]:
    """SSP's rule, replayed from the scheduler's clock: events (t, "ready" | "over", worker,
    iteration), "over" when a worker's multicast of that iteration was recorded. A READY for k of
    worker i breaks the rule unless i's multicast of k - 1 was over and k <= min_j done_j + 1 + s
    (done_j: j's last iteration over, -1 before). What held at a READY held when computing began
    (done counts only rise). Returns the breaches and the most iterations any worker had done
    beyond the slowest."""
    done = {n: -1 for n in workers}
    bad, ahead = [], 0
    for _, kind, node, k in sorted(events):
        if kind == "over":
            done[node] = max(done.get(node, -1), k)
            ahead = max(ahead, done[node] - min(done.values()))
        elif done.get(node, -1) < k - 1 or k > min(done.values()) + 1 + s:
            bad.append((node, k))
    return bad, ahead


@dataclass
class Phase:
    scheme: str  # the phase's name (star, mst, mcast, ssp, queue)
    js: JobState | None = None
    asks: list[Ask] = field(default_factory=list)
    seconds: float = 0.0
    closed: bool = False
    notes: dict[str, Any] = field(default_factory=dict)  # phase-specific figures (the SSP bound, coverage)


class TasksBench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.topo = internet2(seed=args.seed).scaled(args.scale)
        self.adj = adjacency(self.topo)
        self.params, self.chunk = model_params(args.model, args.scale), chunk_params(args.scale)
        self.secret = generate_secret()
        self.cluster = "tasks-" + self.secret[:8]
        self.options_file: Path | None = None  # written once: every agent reads the same
        self.sched = Scheduler(self.cluster, self.topo.nodes, secret=self.secret.encode())
        self.results = Results(args.out)
        if args.out is not None:
            Recorder(self.results, self.sched, LiveState(self.sched))
        self.procs: dict[int, subprocess.Popen] = {}
        self.rng = random.Random(args.seed)
        self.phases: list[Phase] = []
        self.sim_rows: list[tuple[str, int, float, float, float]] = []

    def spawn(self, node: int, port: int) -> None:
        if self.options_file is None:
            cfg = resolve(Options.make(topology="internet2", schemes=SCHEMES, workload__model=self.args.model,
                                       scale=self.args.scale, rounds=1, seed=self.args.seed))
            self.options_file = agent_options_file(cfg, self.cluster)
        cmd = agent_command(self.options_file, node, f"127.0.0.1:{port}")
        self.procs[node] = spawn_agent(cmd, node, {SECRET_ENV: self.secret},
                                       self.args.agent_logs)

    async def watch_agents(self) -> None:
        """An agent process that exits mid-run fails the benchmark at once (nothing here kills one)."""
        while True:
            await asyncio.sleep(0.5)
            dead = [(n, p.returncode) for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"agent process(es) exited: {dead}")

    async def run(self) -> dict[str, Any]:
        a = self.args
        port = await self.sched.start()
        self.results.write({"type": "run", "topology": "internet2", "nodes": self.topo.nodes, "schemes": SCHEMES,
                            "model": a.model, "params": self.params, "chunk_params": self.chunk, "scale": a.scale,
                            "seed": a.seed, "mode": "tasks", "in_flight": a.in_flight})
        for n in range(self.topo.nodes):
            self.spawn(n, port)
        watch = asyncio.create_task(self.watch_agents())
        try:
            waited = asyncio.create_task(self.sched.wait_agents(120))
            await asyncio.wait({waited, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch.done():
                waited.cancel()
                watch.result()
            waited.result()
            for name, share in ({} if a.only_cases else PHASES).items():
                seconds = a.minutes * 60 * share
                phase = (self.phase(name, seconds) if name in SCHEMES else self.multicast_phase(seconds)
                         if name == "mcast" else self.progress_phase(name, seconds))
                drive = asyncio.create_task(phase)
                await asyncio.wait({drive, watch}, return_when=asyncio.FIRST_COMPLETED)
                if watch.done():
                    drive.cancel()
                    watch.result()
                drive.result()
            drive = asyncio.create_task(self.sim_cases())
            await asyncio.wait({drive, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch.done():
                drive.cancel()
                watch.result()
            drive.result()
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watch
            await self.sched.shutdown()
            reap(list(self.procs.values()))
            self.results.close()
        return self.summarize()

    async def phase(self, scheme: str, seconds: float) -> None:
        """One tasks job: `--in-flight` workers each run one task after another until the deadline."""
        ph = Phase(scheme)
        self.phases.append(ph)
        js = ph.js = self.sched.open_tasks(scheme, params=self.params, chunk_params=self.chunk,
                                           in_flight=max(16, 2 * self.args.in_flight))
        t0 = time.time()
        end = t0 + seconds

        async def worker() -> None:
            while time.time() < end:
                ask = pick(scheme, self.topo, self.adj, self.rng)
                ph.asks.append(ask)
                ask.t_asked = time.time()
                try:
                    ask.rec = await asyncio.wait_for(
                        self.sched.run_task(js, ask.members, ask.receivers, options=ask.options,
                                            weights={n: float(w) for n, w in ask.weights.items()}
                                            if ask.weights else None), max(1.0, end + GRACE_S - time.time()))
                except TimeoutError:
                    ask.verdict = "hung"
                    ask.why = f"not recorded {GRACE_S:.0f} s past the job's time ({time.time() - ask.t_asked:.0f} s)"
                ask.t_back = time.time()

        await asyncio.gather(*(worker() for _ in range(self.args.in_flight)))
        ph.seconds = time.time() - t0
        await self.close(ph)

    async def multicast_phase(self, seconds: float) -> None:
        """Waves of multicasts: every node to a random half of the others, all at once, l7 and l3 in
        turn; a new wave once the last one is recorded, until the phase's time is up."""
        ph = Phase("mcast")
        self.phases.append(ph)
        nodes = list(range(self.topo.nodes))
        js = ph.js = self.sched.open_tasks("mcast", params=self.params, chunk_params=self.chunk,
                                           in_flight=2 * len(nodes))
        t0 = time.time()
        end, wave = t0 + seconds, 0

        async def one(ask: Ask) -> None:
            ask.t_asked = time.time()
            try:
                ask.rec = await asyncio.wait_for(
                    self.sched.run_task(js, ask.members, ask.receivers, options=ask.options),
                    max(1.0, end + GRACE_S - time.time()))
            except TimeoutError:
                ask.verdict, ask.why = "hung", f"not recorded {GRACE_S:.0f} s past the job's time"
            ask.t_back = time.time()

        while time.time() < end:
            asks = []
            for src in nodes:
                others = [n for n in nodes if n != src]
                half = sorted(self.rng.sample(others, max(1, len(others) // 2)))
                asks.append(Ask("mcast", [src], half, {"mode": ("l7", "l3")[(src + wave) % 2]}, None))
            ph.asks += asks
            await asyncio.gather(*(one(x) for x in asks))
            wave += 1
        ph.seconds = time.time() - t0
        ph.notes["waves"] = wave
        await self.close(ph)

    async def progress_phase(self, name: str, seconds: float) -> None:
        """A job of iterations under a progress model (ssp: multicasts after every iteration; queue:
        partial reduces of the first ready), with per-node lognormal compute; as many iterations as fit
        the phase's time at the model's mean pace. Its tasks are judged as if asked for: SSP's task for
        worker i's iteration k must carry exactly i's iteration-k tensor to every other worker."""
        ph = Phase(name)
        self.phases.append(ph)
        nodes = list(range(self.topo.nodes))
        rounds = max(4, int(seconds / (2 * COMPUTE_MEAN_S)))
        compute = f"lognormal:mean={COMPUTE_MEAN_S},cv=0.3,spread=0.5"
        scheme = "mcast" if name == "ssp" else "star"
        t0 = time.time()
        run = asyncio.create_task(self.sched.run_job(scheme, rounds=rounds, params=self.params, chunk_params=self.chunk,
                                                     progress=name, staleness=STALENESS, group=GROUP,
                                                     compute=compute, seed=self.args.seed))
        await asyncio.sleep(0)  # run_job opened the job before its first await
        js = ph.js = self.sched.current
        try:
            await asyncio.wait_for(asyncio.shield(run), seconds * 4 + GRACE_S)
            ph.closed = True
        except TimeoutError:
            logging.warning("%s job %d did not end within %.0f s", name, js.job, seconds * 4 + GRACE_S)
            run.cancel()
        ph.seconds = time.time() - t0
        ph.notes.update(rounds=rounds, compute=compute)
        ph.notes["job_sim"] = self.job_prediction(name, scheme, js, rounds, compute)
        for rec in js.records:
            if name == "ssp":  # what SSP must have multicast: one worker's iteration, to all the others
                src = rec.members[0] if rec.members else -1
                ask = Ask(name, [src], [n for n in nodes if n != src], {}, None, iters={src: rec.round})
            else:
                ask = Ask(name, sorted(rec.iters), None, {}, None, iters=dict(rec.iters))
            ask.rec = rec
            ph.asks.append(ask)
        for t in js.tasks.values():
            if t.recorded_t is None:
                ph.asks.append(Ask(name, list(t.members), None, {}, None, iters=dict(t.iters),
                                   verdict="hung", why="never recorded"))
        want = {(n, k) for n in nodes for k in range(rounds)}
        got = [(n, k) for rec in js.records if not rec.aborted for n, k in rec.iters.items()]
        ph.notes["iterations_missing"] = len(want - set(got))
        ph.notes["iterations_twice"] = len(got) - len(set(got))
        if name == "ssp":
            events = [(e["t"], "ready", e["node"], e["round"]) for e in self.sched.timeline
                      if e["kind"] == "ready" and e.get("job") == js.job]
            ph.notes["ready_events"] = len(events)
            events += [(t.recorded_t, "over", n, k) for t in js.tasks.values() if t.recorded_t is not None
                       for n, k in t.iters.items()]
            ph.notes["breaches"], ph.notes["max_ahead"] = ssp_breaches(events, nodes, STALENESS)
            ph.notes["scheduler_violations"] = js.progress.violations
            ph.notes["go_wait_s"] = sum(float(st.get("go_wait_s", 0.0)) for st in js.stats.values())
        for ask in ph.asks:
            self.judge(ask)

    async def sim_cases(self) -> None:
        """Bursts of tasks started together, each judged exact like every other task, then replayed
        by the simulator blind (plans, configured topology, the live start times as arrivals):
        partial reduces with aggregators, multicasts (l7 and l3), and pairs of multicasts over one
        route weighted 3:1, whose delivered bytes also give the share figure."""
        nodes = list(range(self.topo.nodes))
        for name, params in (("burst-reduce", self.params), ("burst-mcast", self.params), ("share", SHARE_PARAMS)):
            ph = Phase(name)
            self.phases.append(ph)
            scheme = "mst" if name == "burst-reduce" else "mcast"
            js = ph.js = self.sched.open_tasks(scheme, params=params, chunk_params=self.chunk, in_flight=16)
            t0 = time.time()
            for b in range(WARMUP_BURSTS + (SHARE_PAIRS if name == "share" else BURSTS)):
                if name == "burst-reduce":
                    asks = [pick("mst", self.topo, self.adj, self.rng) for _ in range(BURST_TASKS)]
                    for x in asks:
                        x.weights = None
                elif name == "burst-mcast":
                    srcs = self.rng.sample(nodes, 3)
                    asks = [Ask("mcast", [src], sorted(self.rng.sample([n for n in nodes if n != src], 4)),
                                {"mode": ("l7", "l3")[(i + b) % 2]}, None) for i, src in enumerate(srcs)]
                else:
                    src, dst = self.rng.choice(sorted(self.topo.links))
                    asks = [Ask("mcast", [src], [dst], {"mode": "l7", "sharing": {"weight": w}}, None)
                            for w in SHARE_WEIGHTS]
                ph.asks += asks
                await asyncio.gather(*(self.ask_one(js, x) for x in asks))
                if b >= WARMUP_BURSTS:
                    ph.notes.setdefault("bursts", []).append(asks)
            ph.seconds = time.time() - t0
            await self.close(ph)

    async def ask_one(self, js: JobState, ask: Ask) -> None:
        ask.t_asked = time.time()
        opts = {k: v for k, v in ask.options.items() if k != "sharing"}
        try:
            ask.rec = await asyncio.wait_for(
                self.sched.run_task(js, ask.members, ask.receivers, options=opts, sharing=ask.options.get("sharing")),
                GRACE_S * 2)
        except TimeoutError:
            ask.verdict, ask.why = "hung", f"not recorded within {GRACE_S * 2:.0f} s"
        ask.t_back = time.time()

    def sim_figures(self) -> dict[str, Any]:
        """Per case, each task's live time against the simulator's; the share pairs' delivered bytes."""
        net = sim_network(self.topo)
        cases: dict[str, list[float]] = {}
        rows = []
        share_err: list[float] = []
        for ph in self.phases:
            for asks in ph.notes.get("bursts", []):
                recs = [x.rec for x in asks if x.verdict == "ok" and x.rec is not None]
                if len(recs) != len(asks):
                    continue  # a burst with a task not exact is not a fair case
                pred = predict_burst([(r.task, self.sched.plans[r.version], r.t_start) for r in recs], net)
                for r in recs:
                    err = 100 * (pred[r.task] - r.round_s) / r.round_s
                    cases.setdefault(ph.scheme, []).append(abs(err))
                    rows.append((ph.scheme, r.task, r.round_s, pred[r.task], err))
                if ph.scheme == "share":
                    share_err.append(share_error(asks))
        per_case = {name: statistics.median(errs) for name, errs in cases.items()}
        every = [e for errs in cases.values() for e in errs]
        self.sim_rows = rows
        return {"share_error_pct": max(share_err) if share_err else None, "share_pairs": len(share_err),
                "sim_vs_live_median_err_pct": statistics.median(every) if every else None,
                "sim_vs_live_max_err_pct": max(per_case.values()) if per_case else None,
                "sim_vs_live_task_max_err_pct": max(every) if every else None,
                "sim_vs_live_by_case": per_case}

    def job_prediction(self, name: str, scheme: str, js: JobState, rounds: int, compute: str) -> dict[str, Any]:
        """The simulator's job mode, blind: the same policy, compute draws and iterations, tasks planned
        by the same scheme on the configured rates; the job's live time (its start to its last task's
        end) against the predicted one."""
        recs = [r for r in js.records if not r.aborted]
        if not recs:
            return {}
        view = oracle_view(self.topo)
        spec = planners.resolve(scheme)
        options = {"mode": "l7"} if scheme == "mcast" else {}

        def plan_for(members: tuple[int, ...], receivers: tuple[int, ...]) -> Plan:
            job = Job(self.params, self.chunk, members, {**options, "receivers": list(receivers)})
            plan = spec.plan(view, job, {})
            return dataclasses.replace(plan, receivers=tuple(receivers)) if scheme != "mcast" else plan
        policy = SimSsp(STALENESS) if name == "ssp" else SimQueue(GROUP)
        live = max(r.t_end for r in recs) - js.t0
        pred = simulate_job(policy, plan_for, ComputeModel(compute, seed=self.args.seed), range(self.topo.nodes),
                            sim_network(self.topo), budget_s=10 * live, rounds=rounds, costs=MEASURED)
        ends = [t.end_s for t in pred.tasks if t.end_s is not None]
        sim = max(ends) if ends else None
        return {"live_s": live, "sim_s": sim, "err_pct": None if sim is None else 100 * (sim - live) / live,
                "tasks_live": len(recs), "tasks_sim": len(pred.tasks)}

    async def close(self, ph: Phase) -> None:
        """End a tasks job (its agents send their stats) and judge its tasks."""
        assert ph.js is not None
        try:
            await self.sched.close_job(ph.js, timeout=CLOSE_S)
            ph.closed = True
        except TimeoutError:
            logging.warning("job %d (%s) did not close within %.0f s", ph.js.job, ph.scheme, CLOSE_S)
        for ask in ph.asks:  # judged between the jobs: the exact sums cost nothing to the tasks in flight
            self.judge(ask)

    def judge(self, ask: Ask) -> None:
        r = ask.rec
        if r is None:
            return
        if r.aborted:
            ask.verdict, ask.why = "aborted", "; ".join(r.errors[:1])
            return
        want = exact_digest(r.round, ask.members, r.bytes // 4, ask.weights, ask.iters)  # the task's own size
        ask.exact = sum(1 for n in ask.want_receivers if r.digests.get(n) == want)
        if ask.iters is not None and r.iters != ask.iters:
            ask.verdict, ask.why = "wrong", f"iterations {r.iters}, expected {ask.iters}"
        elif r.members != ask.members:
            ask.verdict, ask.why = "wrong", f"members {r.members}, asked {ask.members}"
        elif r.receivers != ask.want_receivers:
            ask.verdict, ask.why = "wrong", f"receivers {r.receivers}, asked {ask.want_receivers}"
        elif sorted(int(n) for n in r.digests) != ask.want_receivers:
            ask.verdict, ask.why = "wrong", f"digests from {sorted(r.digests)}, receivers {ask.want_receivers}"
        elif any(d != want for d in r.digests.values()):
            bad = sorted(int(n) for n, d in r.digests.items() if d != want)
            ask.verdict, ask.why = "wrong", f"nodes {bad} hold a result that is not the exact sum"
        else:
            ask.verdict = "ok"

    # --- figures -----------------------------------------------------------------------------------
    def summarize(self) -> dict[str, Any]:
        asks = [x for ph in self.phases for x in ph.asks]
        count = {v: sum(1 for x in asks if x.verdict == v) for v in ("ok", "wrong", "aborted", "hung", "pending")}
        done = [x for x in asks if x.verdict == "ok" and x.rec is not None]
        times = [x.rec.round_s for x in done if x.rec is not None]
        overlap, where, by_scheme = 0, None, {}
        for ph in self.phases:
            per_node: dict[int, list[tuple[float, float]]] = {}
            for x in ph.asks:
                if x.rec is not None and not x.rec.aborted:
                    for n, (s, e) in x.rec.spans.items():
                        per_node.setdefault(int(n), []).append((s, e))
            best = {n: overlap_max(sp) for n, sp in per_node.items()}
            top = max(best.values(), default=0)
            recs = [x.rec for x in ph.asks if x.rec is not None and not x.rec.aborted]
            sched_overlap = overlap_max([(r.t_start, r.t_end) for r in recs])
            busy = sum(r.t_end - r.t_start for r in recs)
            by_scheme[ph.scheme] = {
                "tasks": len(ph.asks), "ok": sum(1 for x in ph.asks if x.verdict == "ok"),
                "tasks_per_s": len(recs) / ph.seconds if ph.seconds else None,
                "task_s_median": statistics.median([r.round_s for r in recs]) if recs else None,
                "overlap_max_agent": top, "overlap_max_tasks": sched_overlap,
                "mean_in_flight": busy / ph.seconds if ph.seconds else None,
                "with_aggregators": sum(1 for r in recs if r.aggregators),
                "retried": sum(1 for r in recs if r.attempt > 0), "closed": ph.closed,
                **self.guard_figures(ph.js)}
            if top > overlap:
                overlap, where = top, f"{ph.scheme}: node {max(best, key=lambda n: best[n])}"
        reduces = [x for ph in self.phases if ph.scheme in SCHEMES for x in ph.asks]
        by_size: dict[int, dict[str, Any]] = {}
        for size in (3, 4, 5):
            xs = [x for x in reduces if len(x.members) == size]
            ts = [x.rec.round_s for x in xs if x.verdict == "ok" and x.rec is not None]
            by_size[size] = {"tasks": len(xs), "ok": sum(1 for x in xs if x.verdict == "ok"),
                             "task_s_median": statistics.median(ts) if ts else None, "task_s_p95": pct(ts, 95)}
        seconds = sum(ph.seconds for ph in self.phases)
        started = len(asks)
        res: dict[str, Any] = {
            "tasks_started": started, "tasks_ok": count["ok"],
            "tasks_ok_pct": 100.0 * count["ok"] / started if started else 0.0,
            "tasks_wrong": count["wrong"], "tasks_aborted": count["aborted"], "tasks_hung": count["hung"],
            "tasks_retried": sum(1 for x in asks if x.rec is not None and x.rec.attempt > 0),
            "tasks_weighted": sum(1 for x in asks if x.weights),
            "tasks_receivers_not_members": sum(1 for x in asks if x.receivers is not None),
            "tasks_with_aggregators_pct": 100.0 * sum(1 for x in reduces if x.verdict == "ok" and x.rec
                                                      and x.rec.aggregators)
            / max(1, sum(1 for x in reduces if x.verdict == "ok")),
            "agents_disagree": sum(1 for x in asks if x.rec is not None and not x.rec.aborted
                                   and (x.rec.ok and x.rec.digests_agree) != (x.verdict == "ok")),
            "concurrent_overlap_max": overlap, "overlap_where": where,
            "tasks_per_s": len(done) / seconds if seconds else 0.0,
            "task_s_median": statistics.median(times) if times else None, "task_s_p95": pct(times, 95),
            "in_flight": self.args.in_flight, "seconds": round(seconds, 1), "scale": self.args.scale,
            "params": self.params, **self.progress_figures(), **self.sim_figures(),
            "by_scheme": by_scheme, "by_size": by_size,
            **live_guard([ph.js for ph in self.phases if ph.js is not None])}
        self.tables(asks, res)
        return res

    def sim_table(self) -> None:
        t = Table(title="the blind simulator's cases: each task live vs predicted (started together)")
        for col in ("case", "task", "live s", "sim s", "error %"):
            t.add_column(col, justify="right")
        for case, task, live, sim, err in self.sim_rows:
            t.add_row(case, str(task), f"{live:.3f}", f"{sim:.3f}", f"{err:+.1f}")
        Console(width=140).print(t)

    def progress_figures(self) -> dict[str, Any]:
        """Multicast deliveries (the mcast and SSP phases: one per receiver, exact or not), SSP's bound
        as this script checks it on every READY, and the ready queue's tasks."""
        ph = {p.scheme: p for p in self.phases}
        mc = [x for name in ("mcast", "ssp") if name in ph for x in ph[name].asks]
        judged = [x for x in mc if x.verdict in ("ok", "wrong")]
        ssp, queue = ph.get("ssp"), ph.get("queue")
        return {
            "multicast_tasks": len(mc), "multicast_deliveries": sum(len(x.want_receivers) for x in judged),
            "multicast_exact": sum(x.exact for x in judged),
            "multicast_wrong": sum(len(x.want_receivers) - x.exact for x in judged),
            "multicast_l3_tasks": sum(1 for x in mc if x.options.get("mode") == "l3"),
            "ssp_violations": len(ssp.notes["breaches"]) if ssp and "breaches" in ssp.notes else None,
            "ssp_violations_scheduler": ssp.notes.get("scheduler_violations") if ssp else None,
            "ssp_readies": ssp.notes.get("ready_events") if ssp else None,
            "ssp_max_ahead": ssp.notes.get("max_ahead") if ssp else None, "ssp_staleness": STALENESS,
            "ssp_go_wait_s": ssp.notes.get("go_wait_s") if ssp else None,
            "ssp_iterations_missing": ssp.notes.get("iterations_missing") if ssp else None,
            "ready_tasks": sum(1 for x in queue.asks if x.verdict == "ok") if queue else 0,
            "ready_group": GROUP,
            "ready_iterations_missing": queue.notes.get("iterations_missing") if queue else None,
            "ready_iterations_twice": queue.notes.get("iterations_twice") if queue else None,
            # the simulator's job mode against the live job (informational: no goal yet)
            "job_sim_vs_live_err_pct": {p.scheme: round(p.notes["job_sim"]["err_pct"], 2) for p in (ssp, queue)
                                        if p is not None and p.notes.get("job_sim", {}).get("err_pct") is not None}}

    @staticmethod
    def guard_figures(js: JobState | None) -> dict[str, Any]:
        """The fidelity guard's verdict on one job, and what it judged: the worst link, the busiest
        agent loop (a CPU-starved machine shows here first)."""
        if js is None:
            return {"guard": None}
        g = job_guard(js)
        st = list(js.stats.values())
        return {"guard": g.verdict, "guard_worst_ratio": g.worst_ratio, "guard_judged": g.judged,
                "guard_below": len(g.bad),
                "loop_cpu_share_max": max((float(x.get("loop_cpu_share", 0.0)) for x in st), default=None),
                "loop_lag_busy_p99_max_s": max((float(x["loop_lag_busy_p99_s"]) for x in st
                                                if x.get("loop_lag_busy_p99_s") is not None), default=None)}

    def tables(self, asks: list[Ask], res: dict[str, Any]) -> None:
        con = Console(width=140, stderr=False)
        t = Table(title=f"tasks per scheme ({self.args.in_flight} in flight, internet2 x{self.args.scale})")
        for col in ("scheme", "tasks", "ok", "tasks/s", "median s", "overlap on an agent", "tasks at once",
                    "mean in flight", "with aggregators", "retried", "fidelity", "worst link", "loop CPU max"):
            t.add_column(col, justify="right")
        for scheme, s in res["by_scheme"].items():
            t.add_row(scheme, str(s["tasks"]), str(s["ok"]), _f(s["tasks_per_s"]), _f(s["task_s_median"]),
                      str(s["overlap_max_agent"]), str(s["overlap_max_tasks"]), _f(s["mean_in_flight"]),
                      str(s["with_aggregators"]), str(s["retried"]),
                      f"{s['guard']} ({s.get('guard_below', 0)}/{s.get('guard_judged', 0)} below)",
                      _f(s.get("guard_worst_ratio")), _f(s.get("loop_cpu_share_max")))
        con.print(t)
        t = Table(title="per subset size (members)")
        for col in ("members", "tasks", "ok", "median s", "p95 s"):
            t.add_column(col, justify="right")
        for size, s in res["by_size"].items():
            t.add_row(str(size), str(s["tasks"]), str(s["ok"]), _f(s["task_s_median"]), _f(s["task_s_p95"]))
        con.print(t)
        self.sim_table()
        bad = [x for x in asks if x.verdict not in ("ok",)]
        if bad:
            t = Table(title=f"tasks not exact ({len(bad)}; first 20)")
            for col in ("scheme", "task", "members", "options", "verdict", "why"):
                t.add_column(col)
            for x in bad[:20]:
                t.add_row(x.scheme, str(x.rec.task if x.rec else "-"), str(x.members), json.dumps(x.options),
                          x.verdict, x.why[:80])
            con.print(t)
        s = Table(title="tasks summary")
        s.add_column("figure")
        s.add_column("value", justify="right")
        for k, v in res.items():
            if not isinstance(v, dict):
                s.add_row(k, _f(v) if isinstance(v, float) else str(v))
        con.print(s)


def share_error(asks: list[Ask]) -> float:
    """Worst deviation of delivered bytes from the configured shares, in % of each share, while both
    were received: from the first-done task's first byte at the receiver to its end there (the
    other's bytes at those two moments, as the receiver reported them)."""
    recs = [x.rec for x in asks]
    assert all(r is not None for r in recs)
    weights = [x.options["sharing"]["weight"] for x in asks]
    first = min(range(len(asks)), key=lambda i: recs[i].t_end)  # type: ignore[union-attr]
    dst = asks[first].want_receivers[0]
    got = []
    for i, r in enumerate(recs):
        if i == first:
            got.append(r.bytes)  # type: ignore[union-attr]
        else:
            beside = recs[first].beside.get(dst, {})  # type: ignore[union-attr]
            at_first, at_end = beside.get(r.task, (0, 0))  # type: ignore[union-attr]
            got.append(at_end - at_first)
    total, wsum = sum(got), sum(weights)
    return max(100 * abs(g / total - w / wsum) / (w / wsum) for g, w in zip(got, weights, strict=True))


def predict_burst(tasks: list[tuple[int, Plan, float]], net: SimNetwork) -> dict[int, float]:
    """Each task's predicted time (first start to last receiver), all replayed at once from their
    live start times, blind: the plans and the configured network, the data plane's own costs."""
    t0 = min(t for _, _, t in tasks)
    runs = [TaskRun(key, plan, start - t0) for key, plan, start in tasks]
    out = simulate_tasks(runs, net, costs=MEASURED)
    return {key: out.tasks[key].end_s - (start - t0) for key, _, start in tasks}


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_MINUTES:g} minutes of tasks (the check's run: "
                    "under 4 min in all)")
    ap.add_argument("--minutes", type=float, default=None, help="time budget for tasks, shared by the schemes "
                    "(default 6; --quick: 2)")
    ap.add_argument("--in-flight", type=int, default=5, help="tasks running at once (default 5)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--scale", type=float, default=0.01,
                    help="model bytes and delays (default 0.01: ~1 MB tensors, a task takes ~0.2-1 s)")
    ap.add_argument("--out", type=Path, default=None, help="also write a results file (schema 3: task records)")
    ap.add_argument("--agent-logs", type=Path, default=None, help="each agent's stderr to DIR/agentN.log")
    ap.add_argument("--only-cases", action="store_true", help="only the simulator's cases (bursts, share pairs)")
    ap.add_argument("-v", "--verbose", action="store_true", help="also informational logs on stderr")
    args = ap.parse_args(argv)
    if args.minutes is None:
        args.minutes = QUICK_MINUTES if args.quick else 6.0
    if args.in_flight < 1:
        ap.error("--in-flight must be at least 1")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    res = asyncio.run(TasksBench(args).run())
    print(json.dumps(res))
    return 0 if (res["tasks_wrong"] == 0 and res["tasks_hung"] == 0 and res["multicast_wrong"] == 0
                 and not res["ssp_violations"]) else 1


if __name__ == "__main__":
    sys.exit(main())
