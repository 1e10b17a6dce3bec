"""`wansync train SCRIPT [ARGS...]`: your own training script, once per node beside its agent, under
every scheme in turn, from the same initial model and data order; then a table of what each scheme
bought you (and, on the kernel backend, plain torch.distributed DDP on Gloo on the same WAN).

The run is `wansync run`'s (cluster.conduct: a scheduler, one agent per node, the backend shaping the
links), with a different job per scheme (`TrainJobs`): start the scripts with the environment torchrun
gives (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and the hand-off channel's socket and
per-run token; wait until every rank attached with the same model (scheduler.attach); run the job
whose contributions are the scripts' steps (workload "handoff", as many rounds as the scripts take);
end it when every script has exited. The cluster secret never reaches a script.

Under a partial or multicast progress model (docs/training-progress.md) the attach broadcast runs as a
one-round full reduce of its own before the job, the scripts learn the model and its groups from the
environment (wt.Optimizer refuses a mode that cannot train there), and each script that exits is
reported to the progress model (`Scheduler.finished`), which then stops waiting for that rank.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agents.handoff import socket_path
from core.sketch import trailer_len
from overlay.auth import SECRET_ENV
from overlay.handoff import CHANNEL_ENV, GROUPS_ENV, PROGRESS_ENV, TOKEN_ENV
from scheduler.progress import MODELS
from scheduler.service import JobState, Scheduler

from .backend import AppBackend
from .guard import GUARD_MAX_RUNQ_PER_CPU, GUARD_MAX_RUNQ_PER_RUN_S
from .prefork import ForkedScript, fork_script
from .procs import reap
from .report import summarize
from .results import SCHEMA_VERSION
from .runspec import RunConfig

ROUNDS = 1 << 40  # a training job has as many rounds as its scripts take steps: it ends when they exit
METRICS_ENV = "WANSYNC_METRICS"  # the baseline's ranks write their metrics here (JSON lines)
BASELINE_ENV = "WANSYNC_BASELINE"
TAIL = 2000  # characters of a failed script's stderr in the error
HIDDEN = (SECRET_ENV, TOKEN_ENV, BASELINE_ENV)  # of the launcher's environment, never a script's
SYNC_ERROR = "wansync.torch.sync.SyncError: "  # how a script's uncaught SyncError ends its stderr
BROADCAST_SCHEME = "ring"  # the one full reduce before a partial or multicast job: rank 0's model to all


class TrainError(RuntimeError):
    """A script failed, never attached, or its ranks' models differ; says which rank and why."""


@dataclass
class TrainRun:
    """One scheme's (or the baseline's) training, as the scripts reported it."""

    name: str
    metrics: dict[int, list[dict[str, float]]]  # rank -> what it logged, with "t" (seconds, this run's clock)
    t0: float  # every rank attached: the clock starts
    t_end: float
    link_bytes: int = 0
    syncs: int = 0
    syncs_wrong: int = 0
    guard_valid: bool | None = None
    exit_codes: list[int] = field(default_factory=list)
    agents: dict[int, dict[str, Any]] = field(default_factory=dict)  # per node: its agent's hand-off figures
    guard_verdict: str = ""
    guard_reason: str = ""

    def series(self, key: str = "accuracy") -> list[tuple[float, float]]:
        """(seconds since t0, value) of `key` as the lowest rank that logs it reported it. The time the
        script spent evaluating (the running total it logs as `eval_s`, if it does) is left out: time to
        accuracy counts training, not the measuring of it."""
        for rank in sorted(self.metrics):
            pts = [(m["t"] - self.t0 - m.get("eval_s", 0.0), m[key]) for m in self.metrics[rank] if key in m]
            if pts:
                return pts
        return []

    def time_to(self, target: float | None, key: str = "accuracy") -> float | None:
        if target is None:
            return None
        return next((t for t, v in self.series(key) if v >= target), None)

    def last(self, key: str = "accuracy") -> float | None:
        pts = self.series(key)
        return pts[-1][1] if pts else None

    def step_s(self) -> float | None:
        """Median over ranks of the wall time per step (what the scripts report when they detach)."""
        per = [m["wall_s"] / m["steps"] for ms in self.metrics.values() for m in ms
               if m.get("steps") and "wall_s" in m]
        return statistics.median(per) if per else None

    def sync_share(self) -> float | None:
        """Median over ranks of the share of its wall time spent in syncs (evaluation left out, as in
        `series`)."""
        share = []
        for ms in self.metrics.values():
            evaluating = max((m["eval_s"] for m in ms if "eval_s" in m), default=0.0)
            share += [m["sync_s"] / (m["wall_s"] - evaluating) for m in ms
                      if "sync_s" in m and m.get("wall_s", 0.0) > evaluating]
        return statistics.median(share) if share else None


class Scripts:
    """The script's processes, one per rank, started beside their agents (inside its namespace on the
    kernel backend); their stderr is kept to say why one failed."""

    def __init__(self, cfg: RunConfig, backend: AppBackend, env: dict[str, str], console: Console) -> None:
        self.cfg, self.backend, self.env, self.console = cfg, backend, env, console
        self.procs: list[subprocess.Popen | ForkedScript] = []
        self.logs: list[Path] = []

    async def launch(self, extra: dict[str, str], workdir: Path, channels: Path | None = None) -> None:
        """`start`, as TrainJobs calls it (a deployment's scripts start over SSH: deploy/training.py)."""
        self.start(extra, workdir, channels)

    def start(self, extra: dict[str, str], workdir: Path, channels: Path | None = None) -> None:
        """One process per rank; `channels`: the directory of the agents' sockets (none: the baseline)."""
        t = self.cfg.options.train
        n = self.cfg.topo.nodes
        for rank in range(n):
            env = {**self.env, **extra, **rank_env(rank, n, rank, n)}
            if channels is not None:
                env[CHANNEL_ENV] = str(socket_path(channels, rank))
            if METRICS_ENV in extra:
                env[METRICS_ENV] = str(workdir / f"metrics-{rank}.jsonl")
            log = workdir / f"rank-{rank}.stderr"
            self.logs.append(log)
            prefix = self.backend.exec_prefix(rank)
            if t["start"] == "fork" and not prefix:  # beside its agent is here: fork, torch already imported
                self.procs.append(fork_script(t["script"], list(t["args"]), env, log, hidden=HIDDEN))
                continue
            with open(log, "wb") as err:
                cmd = [sys.executable, t["script"], *t["args"]]
                self.procs.append(subprocess.Popen(prefix + cmd, env=env, stdin=subprocess.DEVNULL, stderr=err))

    async def first(self, aw: Any) -> Any:
        """`aw`'s result, unless a script fails first (TrainError naming its rank and why)."""
        task = asyncio.ensure_future(aw)
        while not task.done():
            await asyncio.wait({task}, timeout=0.2)
            if not task.done() and (gone := self.dead()):
                task.cancel()
                raise TrainError(f"rank {gone[0][0]}'s script failed ({gone[0][1]})")
        return task.result()

    def dead(self) -> list[tuple[int, str]]:
        return [(i, self.why(i)) for i, p in enumerate(self.procs) if p.poll() is not None and p.returncode != 0]

    def why(self, rank: int) -> str:
        text = self.logs[rank].read_text(errors="replace")
        said = [line for line in text.splitlines() if line.startswith(SYNC_ERROR)]
        if said:  # wansync.torch said why (a refused mode, a failed sync): that, not the traceback
            return f"exit {self.procs[rank].returncode}: {said[-1].removeprefix(SYNC_ERROR)}"
        tail = text[-TAIL:].strip()
        return f"exit {self.procs[rank].returncode}" + (f":\n{tail}" if tail else "")

    async def wait(self, timeout: float, ended: Callable[[set[int]], None] | None = None) -> list[int]:
        """Every rank's exit status, once all ended (TrainError if one failed or they overran);
        `ended`: told every poll which ranks have exited cleanly so far."""
        end = time.time() + timeout
        while any(p.poll() is None for p in self.procs):
            if ended is not None:
                ended({i for i, p in enumerate(self.procs) if p.returncode == 0})
            if gone := self.dead():
                raise TrainError(f"rank {gone[0][0]}'s script failed ({gone[0][1]})")
            if time.time() > end:
                raise TrainError(f"the scripts did not end within {timeout:.0f} s (--run-timeout)")
            await asyncio.sleep(0.2)
        if gone := self.dead():
            raise TrainError(f"rank {gone[0][0]}'s script failed ({gone[0][1]})")
        return [p.returncode for p in self.procs]

    def stop(self) -> None:
        reap(self.procs, grace_s=1.0)
        self.procs, self.logs = [], []


def rank_env(rank: int, world: int, local_rank: int, local_world: int) -> dict[str, str]:
    """Who a script is, as torchrun says it."""
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(local_world)}


class TrainJobs:
    """`cluster.conduct`'s job per scheme for `wansync train` (and `wansync deploy --train`, whose
    `scripts` start them on the hosts): the scripts' training, end to end."""

    def __init__(self, cfg: RunConfig, backend: AppBackend, console: Console,
                 scripts: Callable[[TrainJobs], Scripts] | None = None) -> None:
        self.cfg, self.backend, self.console = cfg, backend, console
        self.scripts = scripts or (lambda jobs: Scripts(jobs.cfg, jobs.backend, jobs.script_env, jobs.console))
        self.dir = Path(tempfile.mkdtemp(prefix="wansync-train-"))  # 0700: the channel's sockets live here
        self.token = secrets.token_urlsafe(24)
        self.master_port = _free_port()
        self.runs: list[TrainRun] = []
        env = {k: v for k, v in os.environ.items() if k not in HIDDEN}
        self.script_env = {**env, "MASTER_ADDR": backend.data_host(0), "MASTER_PORT": str(self.master_port),
                           "PYTHONUNBUFFERED": "1"}
        if backend.data_ifname is not None:  # Gloo must send over the shaped links, not the control bridge
            self.script_env["GLOO_SOCKET_IFNAME"] = backend.data_ifname
        progress = cfg.options.progress["model"]
        # who a rank's result comes from: wt.Optimizer refuses a mode that cannot train so (torch/modes.py)
        self.groups = MODELS[progress].groups if progress in MODELS else "full"
        self.run_env = {PROGRESS_ENV: progress, GROUPS_ENV: self.groups, "PYTHONUNBUFFERED": "1"}  # wansync's own
        self.script_env.update(self.run_env)

    @property
    def agent_env(self) -> dict[str, str]:
        """What the agents need beyond the run's: the channel's token."""
        return {TOKEN_ENV: self.token}

    async def __call__(self, sched: Scheduler, scheme: str, run_job: Callable[..., Any]) -> JobState:
        t = self.cfg.options.train
        work = Path(tempfile.mkdtemp(prefix=f"{scheme}-", dir=self.dir))
        scripts = self.scripts(self)
        n = self.cfg.topo.nodes
        await scripts.launch({TOKEN_ENV: self.token, "WANSYNC_SCHEME": scheme}, work, channels=self.dir)
        try:
            layout = await scripts.first(sched.attached(t["attach_timeout_s"]))
            self.console.print(f"{scheme}: every rank attached ({layout['params']:,} values); training",
                               highlight=False)
            values = layout["params"] + trailer_len(n)
            if self.groups != "full":  # the attach broadcast must reach every rank: one full reduce first
                await scripts.first(sched.run_job(BROADCAST_SCHEME, rounds=1, params=values,
                                                  chunk_params=self.cfg.chunk, workload="handoff"))
            first = sched.current
            job = asyncio.ensure_future(run_job(params=values, rounds=ROUNDS, workload="handoff"))
            told: set[int] = set()

            def ended(ranks: set[int]) -> None:
                """A rank whose script ended has no step left: the progress model stops waiting for it."""
                js = sched.current
                if js is None or js is first:
                    return  # the job has not opened yet: told on a later poll
                for rank in sorted(ranks - told):
                    sched.finished(js, rank)
                told.update(ranks)

            codes = await scripts.wait(t["run_timeout_s"], ended)
            js = sched.current
            assert js is not None
            await sched.close_job(js, timeout=60)
            await job
        finally:
            scripts.stop()
        self.runs.append(self._run_of(scheme, js, codes))
        return js

    def _run_of(self, name: str, js: JobState, codes: list[int]) -> TrainRun:
        metrics = {n: list(st.get("training", {}).get("metrics", [])) for n, st in js.stats.items()}
        attach = [st["training"]["t_attach"] for st in js.stats.values() if "t_attach" in st.get("training", {})]
        t_end = max((m["t"] for ms in metrics.values() for m in ms), default=time.time())
        link_bytes = sum(int(entry.get("bytes", 0)) for st in js.stats.values() for entry in st["links"].values())
        wrong = sum(1 for r in js.records if not (r.ok and r.digests_agree))
        agents = {n: {k: v for k, v in st.get("training", {}).items() if k != "metrics"} for n, st in js.stats.items()}
        summary = summarize(js, self.cfg)
        return TrainRun(name, metrics, max(attach, default=js.t0), t_end, link_bytes, len(js.records), wrong,
                        guard_valid=summary["guard_valid"], exit_codes=codes, agents=agents,
                        guard_verdict=str(summary["guard_verdict"]),
                        guard_reason="; ".join(summary["guard_reasons"][:2]))

    async def baseline(self) -> TrainRun:
        """The same script on plain torch.distributed (Gloo) across the same shaped links."""
        work = Path(tempfile.mkdtemp(prefix="ddp-", dir=self.dir))
        scripts = Scripts(self.cfg, self.backend, self.script_env, self.console)
        t0 = time.time()
        sent0 = await asyncio.to_thread(self.backend.sent_bytes)
        scripts.start({BASELINE_ENV: "gloo", METRICS_ENV: "", "WANSYNC_SCHEME": "ddp"}, work)
        try:
            codes = await scripts.wait(self.cfg.options.train["run_timeout_s"])
        finally:
            scripts.stop()
        sent1 = await asyncio.to_thread(self.backend.sent_bytes)
        metrics: dict[int, list[dict[str, float]]] = {}
        for rank in range(self.cfg.topo.nodes):
            path = work / f"metrics-{rank}.jsonl"
            metrics[rank] = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        starts = [m["t"] for ms in metrics.values() for m in ms if m.get("attached")]
        moved = sum(sent1.get(k, 0) - sent0.get(k, 0) for k in sent1)
        run = TrainRun("ddp", metrics, max(starts, default=t0), time.time(), link_bytes=moved, exit_codes=codes)
        run.guard_valid, run.guard_reason = baseline_verdict(run, self.cfg.topo.nodes)
        run.guard_verdict = {True: "valid", False: "invalid", None: "unjudged"}[run.guard_valid]
        self.runs.append(run)
        return run

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def baseline_verdict(run: TrainRun, nodes: int) -> tuple[bool | None, str]:
    """Is the baseline a fair one? Its bytes must have crossed the shaped links (at least what a ring
    all-reduce moves: 2 (n - 1) / n of the model per rank and step, 90 % of it in wire bytes), and its
    ranks must not have waited for a CPU longer than they ran (as the guard judges agents)."""
    ends = [m for ms in run.metrics.values() for m in ms if "steps" in m]
    if len(ends) < nodes:
        return None, "unjudged: not every rank reported its figures"
    flat = max(float(m.get("flat", 0)) for m in ends)
    steps = min(float(m["steps"]) for m in ends)
    want = 0.9 * steps * 2 * (nodes - 1) * flat * 4 if flat else 0.0
    if run.link_bytes < want:
        return False, (f"invalid: {run.link_bytes / 1e6:.1f} MB crossed the shaped links, a ring all-reduce moves "
                       f"{want / 0.9 / 1e6:.1f} MB (did Gloo route around them?)")
    for m in ends:
        cpu, wait, runs = m.get("cpu_s", 0.0), m.get("runq_s", 0.0), m.get("runs", 0.0)
        if cpu > 0 and wait / cpu > GUARD_MAX_RUNQ_PER_CPU and runs and wait / runs > GUARD_MAX_RUNQ_PER_RUN_S:
            return False, (f"invalid: rank {int(m.get('rank', -1))} waited for a CPU {wait / cpu:.1f}x as long as "
                           "it ran (machine overloaded)")
    if not flat:
        return None, "unjudged: the ranks did not say how many values they sync"
    return True, "valid"


def write_runs(path: Path, runs: list[TrainRun], target: float | None) -> None:
    """Append the runs to the results file: `accuracy` records (what `wansync plot` draws against
    time) and one `train_run` summary each."""
    with open(path, "a") as fh:
        def write(record: dict[str, Any]) -> None:
            fh.write(json.dumps({"schema": SCHEMA_VERSION, "t": time.time(), **record}) + "\n")

        for r in runs:
            for rank, ms in r.metrics.items():
                for m in ms:
                    if "accuracy" in m:
                        write({"type": "accuracy", "scheme": r.name, "node": rank, "t_rel": m["t"] - r.t0,
                               "step": m.get("step"), "accuracy": m["accuracy"]})
            write({"type": "train_run", "scheme": r.name, "target": target, "time_to_target_s": r.time_to(target),
                   "final_accuracy": r.last(), "step_s": r.step_s(), "sync_share": r.sync_share(),
                   "link_bytes": r.link_bytes, "syncs": r.syncs, "syncs_wrong": r.syncs_wrong,
                   "valid": r.guard_valid, "verdict": r.guard_verdict, "reason": r.guard_reason})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def table(console: Console, runs: list[TrainRun], target: float | None) -> None:
    """What each scheme bought: time to the target accuracy, accuracy at the end, step time and its
    share spent synchronizing, bytes moved, and the speedup over the baseline (the first run named ddp)."""
    base = next((r for r in runs if r.name == "ddp"), None)
    tab = Table(title=f"training (target accuracy {target if target is not None else 'none'})")
    for col in ("scheme", "time to target s", "final accuracy", "step s", "sync share", "MB on links",
                "syncs", "wrong", "speedup vs ddp"):
        tab.add_column(col, justify="right" if col != "scheme" else "left")
    for r in runs:
        tt, step = r.time_to(target), r.step_s()
        base_tt = base.time_to(target) if base is not None else None
        speed = (f"{base_tt / tt:.2f}x" if tt and base_tt else
                 f"{base.step_s() / step:.2f}x (step)" if base is not None and base.step_s() and step else "-")
        share = r.sync_share()
        acc = r.last()
        tab.add_row(r.name, _fmt(tt), _fmt(acc, 3), _fmt(step, 3), f"{share:.0%}" if share is not None else "-",
                    f"{r.link_bytes / 1e6:.1f}" if r.link_bytes else "-", str(r.syncs or "-"),
                    str(r.syncs_wrong), speed if r is not base else "1.00x")
    console.print(tab)


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


async def train(cfg: RunConfig, console: Console | None = None) -> list[TrainRun]:
    """Start a scheduler and one agent per node (with the hand-off channel), train the script under
    every scheme (and the baseline), print the table; everything started is stopped on every way out."""
    from .backend import TcBackend
    from .cluster import LocalAgents, Session, conduct, here, run_secret

    console = console or Console(stderr=True)
    o = cfg.options
    backend = TcBackend(cfg.topo, cfg.trace, console) if o.wan["backend"] == "tc" else AppBackend()
    if backend.name == "app" and o.agents["shaping"] == "none":  # unshaped loopback (hand-off costs)
        backend.agent_shaping = "none"
    jobs = TrainJobs(cfg, backend, console)
    try:
        cfg = dataclasses.replace(cfg, options=o.replace(agents__handoff_dir=str(jobs.dir)))
        jobs.cfg = cfg
        cluster = "train-" + secrets.token_hex(4)
        secret, env = run_secret(cfg)
        agents = LocalAgents(cfg, cluster, {**env, **jobs.agent_env}, backend)

        async def baseline() -> None:
            if o.train["baseline"] == "ddp":
                console.print("ddp: the same script on torch.distributed (Gloo) over the same links", highlight=False)
                await jobs.baseline()

        await conduct(cfg, Session(cluster, secret, agents, backend, job=jobs, after=baseline,
                                   machines=here(cfg.topo.nodes)), console,
                      show_table=False)
        return report(console, jobs.runs, o)
    finally:
        jobs.close()


def report(console: Console, runs: list[TrainRun], o: Any) -> list[TrainRun]:
    """The end of a training run (here or on hosts): the table, and the runs in the results file."""
    base = next((r for r in runs if r.name == "ddp"), None)
    target = o.train["target"] if o.train["target"] is not None else (base.last() if base else None)
    table(console, runs, target)
    if o.output["out"] is not None:
        write_runs(Path(o.output["out"]), runs, target)
    return runs
