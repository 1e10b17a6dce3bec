"""Soak: jobs back to back on internet2 while seeded random faults hit the cluster.

A scheduler here and one `wansync agent` process per node (authenticated, application shaping).
First a fault-free phase measures rounds per second; then the faulty phase injects, on average
every `--mean-gap` seconds (exponential gaps, seeded), one of: kill (SIGKILL), freeze (SIGSTOP,
SIGCONT later), cut (the link down for a moment), blackhole (bytes silently held) or collapse
(rate / 7), on random nodes and links. A killed or fenced agent is restarted after a few seconds,
as an operator's supervisor would, and rejoins. Every round is checked exact by every agent.

Detection: from a fault to the scheduler noticing (agent declared lost, or a round aborted). A
blackhole can only be noticed once a round sends into it: its detection counts from the later of
the fault and the start of the attempt that was aborted (`detect_since_fault_p95_s` counts from the
fault itself).
Recovery: from a fault to the end of the first round that began after it and ended exact. Faults
that need no reaction (a short cut, a collapse, a fault on a link the plan does not use) count for
recovery only.

    python scripts/bench/soak.py [--minutes 30] [--seed 1] [--mean-gap 30]

Prints tables; the last stdout line is one JSON object (rounds_ok, rounds_retried, rounds_wrong,
faults_injected, detect_p95_s, recover_p95_s, throughput_vs_fault_free).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agents.workload import chunk_params, model_params  # noqa: E402
from emulation.faults import AppLinkControl, Fault, FaultInjector  # noqa: E402
from emulation.topology import internet2  # noqa: E402
from overlay.auth import SECRET_ENV, generate_secret  # noqa: E402
from scheduler.service import Scheduler  # noqa: E402
from wansync.backend import agent_command  # noqa: E402
from wansync.cluster import agent_options_file  # noqa: E402
from wansync.guard import live_guard  # noqa: E402
from wansync.options import Options  # noqa: E402
from wansync.procs import reap  # noqa: E402
from wansync.runspec import resolve  # noqa: E402

SCHEMES = ["mst", "netstorm", "ring", "star"]
KINDS = ["kill", "freeze", "cut", "blackhole", "collapse"]
RESTART_AFTER_S = 3.0
ROUNDS_PER_JOB = 15


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.topo = internet2(seed=args.seed).scaled(args.scale)
        self.params, self.chunk = model_params(args.model, args.scale), chunk_params(args.scale)
        self.secret = generate_secret()
        self.cluster = "soak-" + self.secret[:8]
        self.options_file: Path | None = None  # written once: every agent reads the same
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self.sched = Scheduler(self.cluster, self.topo.nodes, secret=self.secret.encode(),
                               on_event=lambda kind, data: self.events.append((time.time(), kind, data)))
        self.procs: dict[int, subprocess.Popen] = {}
        self.port = 0
        self.records: list[Any] = []
        self.aborts: list[dict[str, Any]] = []
        self.restarts = 0
        self.jobs: dict[str, list[Any]] = {"fault_free": [], "faulty": []}  # every job, for the fidelity guard
        self.phase = "fault_free"

    # --- processes -------------------------------------------------------------------------------
    def spawn(self, node: int) -> None:
        if self.options_file is None:
            cfg = resolve(Options.make(topology="internet2", schemes=SCHEMES, workload__model=self.args.model,
                                       scale=self.args.scale, rounds=ROUNDS_PER_JOB, seed=self.args.seed))
            self.options_file = agent_options_file(cfg, self.cluster)
        cmd = agent_command(self.options_file, node, f"127.0.0.1:{self.port}")
        self.procs[node] = subprocess.Popen(cmd, env={**os.environ, SECRET_ENV: self.secret},
                                            stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def supervise(self) -> None:
        """Restart agents that died (killed, or fenced after a freeze), as a supervisor would."""
        dead_since: dict[int, float] = {}
        while True:
            await asyncio.sleep(0.2)
            for n, p in self.procs.items():
                if p.poll() is None:
                    continue
                t = dead_since.setdefault(n, time.time())
                if time.time() - t >= RESTART_AFTER_S:
                    del dead_since[n]
                    self.restarts += 1
                    self.spawn(n)

    # --- phases ----------------------------------------------------------------------------------
    async def jobs_until(self, end: float) -> list[Any]:
        """Jobs back to back (schemes in turn) until `end`; rounds that ended by then count."""
        recs, i = [], 0
        while time.time() < end:
            scheme = SCHEMES[i % len(SCHEMES)]
            i += 1
            job = asyncio.ensure_future(self.sched.run_job(scheme, rounds=ROUNDS_PER_JOB, params=self.params,
                                                           chunk_params=self.chunk))
            try:
                js = await asyncio.wait_for(asyncio.shield(job), max(1.0, end - time.time()) + 120)
            except TimeoutError:
                js = self.sched.current
                state = (f"alive {sorted(self.sched.agents)}, frozen {js.frozen}, attempts {js.attempt}, "
                         f"at the barrier {({r: sorted(a) for r, a in js.asked.items()})}, started {js.started}, "
                         f"done {({r: sorted(d) for r, d in js.done.items()})}") if js else ""
                raise RuntimeError(f"job {scheme} hung for 2 minutes past the phase's end: {state}") from None
            self.jobs[self.phase].append(js)
            recs += [r for r in js.records if r.t_end <= end + self.sched_offset()]
            self.aborts += js.aborts
        return recs

    def sched_offset(self) -> float:
        return 0.0  # agents' clocks are synced to the scheduler's (Cristian), which is this process's

    def random_faults(self, seconds: float) -> list[Fault]:
        rng = random.Random(self.args.seed)
        links = sorted({tuple(sorted(k)) for k in self.topo.links})
        out, t = [], rng.expovariate(1 / self.args.mean_gap)
        while t < seconds - 10:
            kind = KINDS[len(out) % len(KINDS)] if len(out) < len(KINDS) else rng.choice(KINDS)
            if kind in ("kill", "freeze"):
                out.append(Fault(kind, node=rng.randrange(self.topo.nodes), at_s=t,
                                 for_s=rng.uniform(2, 5) if kind == "freeze" else None, spec=kind))
            else:
                a, b = rng.choice(links)
                name = {"cut": "down"}.get(kind, kind)
                dur = {"cut": rng.uniform(0.5, 2), "blackhole": rng.uniform(3, 8), "collapse": rng.uniform(5, 15)}
                out.append(Fault(name, link=(a, b), at_s=t, for_s=dur[kind], factor=7.0 if kind == "collapse" else None,
                                 spec=kind))
            t += max(5.0, rng.expovariate(1 / self.args.mean_gap))
        return out

    async def run(self) -> dict[str, Any]:
        a = self.args
        self.port = await self.sched.start()
        for n in range(self.topo.nodes):
            self.spawn(n)
        await self.sched.wait_agents(60)
        sup = asyncio.create_task(self.supervise())
        try:
            # fault-free phase
            t0 = time.time()
            base = await self.jobs_until(t0 + a.baseline_minutes * 60)
            base_rps = sum(1 for r in base if r.ok) / (a.baseline_minutes * 60)
            # faulty phase
            faults = self.random_faults(a.minutes * 60)
            injected: list[dict[str, Any]] = []

            def report(rec: dict[str, Any]) -> None:
                if rec["action"] == "inject" and "error" not in rec:
                    js = self.sched.current
                    rec["mid_round"] = bool(js and js.started)
                    rec["at"] = time.time()
                    injected.append(rec)
            ctl = AppLinkControl(lambda n, msg: self.sched.agents[n].conn.send(msg) if n in self.sched.agents
                                 else None)
            inj = FaultInjector(faults, links=ctl, pid_of=lambda n: self.procs[n].pid,
                                rate_of=lambda s, d: self.topo.links[(s, d)].rate_mbps, report=report)
            self.sched.subscribe(inj.on_event)
            self.events.clear()
            self.phase = "faulty"
            t1 = time.time()
            inj.start()
            recs = await self.jobs_until(t1 + a.minutes * 60)
            await inj.stop()
            return self.summarize(recs, injected, base_rps, t1, a.minutes * 60, len(base))
        finally:
            sup.cancel()
            await self.sched.shutdown()
            reap(list(self.procs.values()))

    def summarize(self, recs: list[Any], injected: list[dict[str, Any]], base_rps: float, t1: float,
                  seconds: float, base_rounds: int) -> dict[str, Any]:
        ok = [r for r in recs if r.ok and r.digests_agree and r.versions_agree]
        wrong = [r for r in recs if not (r.ok and r.digests_agree and r.versions_agree)]
        timeline = [(t, d) for t, k, d in self.events if k == "timeline"]
        detect, since_fault, recover, rows = [], [], [], []
        for f in injected:
            at = f["at"]
            seen = raw = None
            if f["kind"] in ("kill", "freeze"):  # noticed when that agent is declared lost
                raw = seen = next((t - at for t, d in timeline if t >= at and d["kind"] == "agent_lost"
                                   and d.get("node") == f["node"]), None)
            elif f["kind"] == "blackhole":
                # noticed when a round aborts while it lasts (a stall). Nothing can notice a blackhole on
                # a link no round uses, so it counts from when the aborted attempt began, if later
                ab = next((x for x in self.aborts if at <= x["t"] <= at + f["for_s"] + 1), None)
                if ab is not None:
                    raw, seen = ab["t"] - at, ab["t"] - max(at, ab.get("t_start") or at)
            if seen is not None:  # a blackhole on a link no plan used needs no reaction
                detect.append(seen)
                since_fault.append(raw)
            # recovered: a round that began after the fault (so all of it ran with the fault) ended exact
            done = next((r.t_end - at for r in sorted(ok, key=lambda r: r.t_end) if r.t_start >= at), None)
            if done is not None:
                recover.append(done)
            rows.append((f"{f['t_run']:.1f}", f["spec"] or f["kind"], str(f.get("node", f.get("link"))),
                         "yes" if f["mid_round"] else "no", "-" if seen is None else f"{seen:.2f}",
                         "-" if raw is None else f"{raw:.2f}",
                         "-" if done is None else f"{done:.2f}"))
        t = Table(title=f"faults ({len(injected)} injected over {seconds / 60:.1f} min)")
        for col in ("t s", "kind", "target", "mid-round", "detected s", "since fault s", "recovered s"):
            t.add_column(col)
        for row in rows:
            t.add_row(*row)
        Console(width=120).print(t)
        rps = len(ok) / seconds
        res = {"rounds_ok": len(ok), "rounds_retried": sum(1 for r in recs if r.attempt > 0),
               "rounds_wrong": len(wrong), "faults_injected": len(injected),
               "faults_mid_round": sum(1 for f in injected if f["mid_round"]),
               "aborts": len(self.aborts), "restarts": self.restarts,
               "detect_p50_s": pct(detect, 50), "detect_p95_s": pct(detect, 95),
               "detect_since_fault_p95_s": pct(since_fault, 95),
               "recover_p50_s": pct(recover, 50), "recover_p95_s": pct(recover, 95),
               "round_s_median": statistics.median(r.round_s for r in ok) if ok else None,
               "throughput_vs_fault_free": rps / base_rps if base_rps else None,
               "fault_free_rounds": base_rounds, "minutes": seconds / 60,
               # the live figures (throughput_vs_fault_free, round times) use both phases' jobs; a job
               # cut short by a fault (a lost agent sends no STATS) is unjudged, so this is often false
               **live_guard(self.jobs["fault_free"] + self.jobs["faulty"]),
               "live_guard_fault_free": live_guard(self.jobs["fault_free"])["live_guard_valid"]}
        s = Table(title="soak summary")
        s.add_column("figure")
        s.add_column("value", justify="right")
        for k, v in res.items():
            s.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
        Console(width=120).print(s)
        return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="faulty phase (default 30)")
    ap.add_argument("--baseline-minutes", type=float, default=None,
                    help="fault-free phase (default: as long as the faulty one, at most 2 min; 1 min for runs < 5 min)")
    ap.add_argument("--mean-gap", type=float, default=30.0, help="mean seconds between faults (default 30)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-v", "--verbose", action="store_true", help="also informational logs on stderr")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--scale", type=float, default=0.01, help="model bytes and delays (default 0.01: ~0.5 s rounds)")
    args = ap.parse_args(argv)
    if args.baseline_minutes is None:
        args.baseline_minutes = min(args.minutes, 2.0) if args.minutes >= 5 else min(args.minutes, 1.0)
    # the scheduler's warnings (lost agents, aborts, suspected links) on stderr: the post-mortem record
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    res = asyncio.run(Soak(args).run())
    print(json.dumps(res))
    return 0 if res["rounds_wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
