"""`wansync run`: a scheduler here, one `wansync agent` process per node, every scheme in turn.

The run composes parts that each do one thing: the scheduler (through its public API: start,
run_job, send, events), the backend that shapes links (backend.py), the agent processes (procs.py),
the results file (results.py), the terminal (progress.py), the fidelity guard (guard.py), faults
(emulation/faults.py) and the dashboard (scheduler/http.py). Every child is reaped on normal exit,
on Ctrl-C and on errors: agents also leave by themselves when their scheduler connection closes.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from emulation.faults import AppLinkControl, FaultInjector
from overlay.auth import SECRET_ENV, generate_secret
from scheduler.live import LiveState
from scheduler.service import JobState, Scheduler

from .backend import AppBackend, TcBackend
from .guard import cpu_forecast, cpu_warning
from .options import Options
from .predict import RoundPredictor
from .procs import reap, wait_or_die
from .progress import RunProgress
from .report import print_table, summarize
from .results import Recorder, Results
from .runspec import RunConfig, dispatch_of, run_record


def agent_options(cfg: RunConfig, cluster: str, *, shaping: str = "app", trace_file: Path | None = None,
                  secret_file: Path | None = None) -> Options:
    """The options every agent of this run reads: the run's, with its cluster id, how agents shape, the
    computed trace (agents never redraw it themselves) and the secret's file where they need one (a
    remote host's copy, or a secret that is not text); a text secret reaches them in the environment."""
    o = cfg.options
    probe = o.agents["probe_bytes"]
    if probe is None and o.workload["chunk"] is not None:  # probes stay half a chunk, as NetStorm's 2 of 4 MB
        probe = cfg.chunk * 4 // 2
    if secret_file is None and (cfg.secret is None or text_secret(cfg.secret)):
        secret_path = None  # in the agents' environment (run_secret): they need no file
    else:  # a host's copy, or one an environment cannot carry: the agents read the file
        secret_path = str(secret_file or o.security["secret_file"])
    values: dict[str, Any] = {"cluster__name": cluster, "agents__shaping": shaping, "agents__probe_bytes": probe,
                              "security__secret_file": secret_path}
    if trace_file is not None:
        values.update(wan__trace_file=str(trace_file), wan__trace=None, wan__dynamic=False)
    return o.replace(**values)


def run_secret(cfg: RunConfig) -> tuple[bytes, dict[str, str]]:
    """The run's cluster secret (--secret-file's, or a fresh one) and the agents' environment: the
    secret goes there, never in argv or the options file; one that is not text is read from its
    --secret-file, which the options name."""
    secret = generate_secret().encode() if cfg.secret is None else cfg.secret
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if text_secret(secret):
        env[SECRET_ENV] = secret.decode()
    return secret, env


def text_secret(secret: bytes) -> bool:
    try:
        secret.decode()
    except UnicodeDecodeError:
        return False
    return "\0" not in secret.decode()


class Agents(Protocol):
    """Who runs a run's agents: processes started here (`LocalAgents`), processes started elsewhere
    by hand (`wansync scheduler`), or over SSH (`wansync deploy`). The scheduler side is the same."""

    async def start(self, port: int) -> None:
        """Start them, now that the scheduler listens on `port` (nothing, if they start elsewhere)."""

    def dead(self) -> list[tuple[int, str]]:
        """Nodes whose agent process ended, with why (only the ones this launcher can see)."""

    def signal(self, node: int, sig: int) -> None:
        """Faults kill/freeze: signal node's agent process, wherever it runs (RuntimeError if it cannot)."""

    async def stop(self) -> None:
        """Reap every agent process on every way out (they also leave when the scheduler goes)."""


def agent_options_file(cfg: RunConfig, cluster: str, **kw: Any) -> Path:
    """`agent_options` written to a private temporary file (0600) that is removed when this process
    exits: for launchers that start agents themselves (benchmarks, tests)."""
    fd, name = tempfile.mkstemp(prefix="wansync-options-", suffix=".json")
    os.close(fd)
    path = agent_options(cfg, cluster, **kw).write(Path(name))
    atexit.register(path.unlink, missing_ok=True)
    return path


class LocalAgents:
    """`wansync run`: one agent process per node on this machine, shaped by the backend; every one
    reads the same options file (written once the scheduler listens, 0600, removed at the end)."""

    def __init__(self, cfg: RunConfig, cluster: str, env: dict[str, str], backend: AppBackend,
                 trace_file: Path | None = None) -> None:
        self.cfg, self.cluster, self.env, self.backend = cfg, cluster, env, backend
        self.trace_file = trace_file
        self.procs: list[subprocess.Popen] = []
        self.options_file: Path | None = None

    async def start(self, port: int) -> None:
        self.options_file = agent_options_file(self.cfg, self.cluster, shaping=self.backend.agent_shaping,
                                               trace_file=self.trace_file)
        for n in range(self.cfg.topo.nodes):
            cmd = self.backend.agent_command(self.options_file, n, port)
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=self.env))

    def dead(self) -> list[tuple[int, str]]:
        return [(i, f"exit {p.returncode}") for i, p in enumerate(self.procs) if p.poll() is not None]

    def signal(self, node: int, sig: int) -> None:
        if node >= len(self.procs):
            raise RuntimeError(f"no process for node {node}")
        os.kill(self.procs[node].pid, sig)

    async def stop(self) -> None:
        reap(self.procs)
        if self.options_file is not None:
            self.options_file.unlink(missing_ok=True)


CONTROL_PREFIX = "WANSYNC-CTL "  # `wansync scheduler --control-lines`: requests to its launcher, on stdout


def control_line(**what: Any) -> None:
    """One request to the launcher that started this scheduler over SSH (wansync deploy): it signals
    agents on other hosts, and replays a trace on their NICs from each job's t0."""
    print(CONTROL_PREFIX + json.dumps(what), flush=True)


class _ControlLineBackend(AppBackend):
    """A scheduler started by `wansync deploy`: tells its launcher when each job starts."""

    def on_job(self, t0: float) -> None:
        control_line(job_t0=t0)


class ExternalAgents:
    """`wansync scheduler`: agents started elsewhere (by hand, or over SSH by `wansync deploy`); their
    losses are the scheduler's to see. With control_lines, kill/freeze faults become requests to the
    launcher on stdout (it signals the process on its host); without, they cannot be done from here."""

    def __init__(self, control_lines: bool = False) -> None:
        self.control_lines = control_lines

    def backend(self) -> AppBackend:
        return _ControlLineBackend() if self.control_lines else AppBackend()

    async def start(self, port: int) -> None:
        pass

    def dead(self) -> list[tuple[int, str]]:
        return []

    def signal(self, node: int, sig: int) -> None:
        if not self.control_lines:
            raise RuntimeError(f"node {node}'s agent runs on another host: `wansync scheduler` cannot signal it "
                               "(`wansync deploy` can)")
        control_line(signal=int(sig), node=node)

    async def stop(self) -> None:
        pass


@dataclass
class Session:
    """What `conduct` needs besides the run's options: who the cluster is, where the scheduler
    listens, who runs the agents and who shapes the links."""

    cluster: str
    secret: bytes | None
    agents: Agents
    backend: AppBackend = field(default_factory=AppBackend)
    host: str | None = None  # None: the backend's (127.0.0.1 for local runs)
    port: int = 0
    register_timeout_s: float = 60.0
    on_listening: Callable[[int], None] | None = None  # told the scheduler's port once it listens
    on_dashboard: Callable[[str], None] | None = None  # told the dashboard's URL once it serves
    # a scheme's job, if not the synthetic one: (scheduler, scheme, run_job) -> the job; run_job is the
    # scheduler's run_job with the run's options bound, taking what the caller decides (wansync train)
    job: Callable[[Scheduler, str, Callable[..., Any]], Awaitable[JobState]] | None = None
    after: Callable[[], Awaitable[None]] | None = None  # after every scheme, before anything is torn down
    # where the agents run, as far as this launcher knows: (nodes, the CPUs of the machine they share);
    # packing and BLINK cut no finer than those CPUs handle (scheduler/planners/cpufit.py)
    machines: list[tuple[tuple[int, ...], int]] = field(default_factory=list)


def here(nodes: int) -> list[tuple[tuple[int, ...], int]]:
    """Every agent on this machine (a local run or train): its CPUs, as this process may use them."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return [(tuple(range(nodes)), max(1, cpus))]


async def run(cfg: RunConfig, console: Console | None = None, *, show_table: bool = True,
              job: Callable[[Scheduler, str, Callable[..., Any]], Awaitable[JobState]] | None = None,
              after: Callable[[], Awaitable[None]] | None = None) -> list[JobState]:
    """Start a scheduler here and one agent process per node, run every scheme in turn, and reap
    everything on the way out, whatever the way out. job, after: Session's hooks (a benchmark that
    watches the scheduler while its jobs run)."""
    console = console or Console(stderr=True)
    cluster = "run-" + secrets.token_hex(4)
    secret, agent_env = run_secret(cfg)
    backend = TcBackend(cfg.topo, cfg.trace, console) if cfg.options.wan["backend"] == "tc" else AppBackend()
    # every agent runs on this machine: say at start when the application backend cannot keep up
    if backend.name == "app" and (forecast := cpu_forecast(cfg.topo, cfg.trace, cfg.schemes, cfg.params, cfg.chunk)):
        console.print(f"[yellow]{cpu_warning(forecast, root=os.geteuid() == 0)}[/]", soft_wrap=True, highlight=False)
    trace_file = None
    if cfg.trace is not None and cfg.trace.events:  # the computed trace every local agent loads
        fd, name = tempfile.mkstemp(prefix="wansync-trace-", suffix=".json")
        os.close(fd)
        trace_file = Path(name)
        cfg.trace.write(trace_file)
    agents = LocalAgents(cfg, cluster, agent_env, backend, trace_file)
    try:
        return await conduct(cfg, Session(cluster, secret, agents, backend, job=job, after=after,
                                          machines=here(cfg.topo.nodes)), console, show_table=show_table)
    finally:
        if trace_file is not None:
            trace_file.unlink(missing_ok=True)


async def conduct(cfg: RunConfig, session: Session, console: Console, *, show_table: bool = True) -> list[JobState]:
    """Run every scheme on a scheduler with `topo.nodes` registered agents: record, summarize, print.
    Shared by `wansync run` (agents here), `wansync scheduler` (agents elsewhere) and `wansync deploy
    --scheduler-here` (agents over SSH); everything it started is stopped on every way out."""
    o = cfg.options
    results = Results(None if o.output["out"] is None else Path(o.output["out"]))
    results.write(run_record(cfg, session.cluster))
    predictor = RoundPredictor(cfg.topo, cfg.trace, dispatch=dispatch_of(o))
    sched = Scheduler(session.cluster, cfg.topo.nodes, predict=predictor.submit,
                      update_time=o.schemes["update_time_s"] * o.wan["scale"], update_rate=o.schemes["update_rate"],
                      secret=session.secret, tls=cfg.tls, heartbeat_timeout=o.agents["heartbeat_timeout_s"],
                      probe=o.schemes["probe"] == "on", probe_budget=o.schemes["probe_budget"])
    for k, (nodes, cpus) in enumerate(session.machines):
        sched.view.share_machine(nodes, cpus, host=f"machine-{k}")
    live = LiveState(sched)
    Recorder(results, sched, live)
    progress = RunProgress(console, sched, live)
    backend, agents = session.backend, session.agents
    sched.subscribe(lambda kind, data: kind == "job" and backend.on_job(data["t0"]))
    jobs: list[JobState] = []
    injector = _fault_injector(cfg, sched, agents, results, backend)
    dashboard = None
    try:
        dashboard = await _start_dashboard(o.http, sched, live, console)
        if dashboard is not None and session.on_dashboard is not None:
            session.on_dashboard(dashboard.url)
        await backend.setup()
        port = await sched.start(session.host or backend.scheduler_host, session.port)
        if session.on_listening is not None:
            session.on_listening(port)
        await agents.start(port)
        await wait_or_die(sched.wait_agents(session.register_timeout_s), agents.dead)
        if injector is not None:
            injector.start()
        with progress:
            w, p = o.workload, o.progress
            for scheme in cfg.schemes:
                rounds = w["rounds_by_scheme"].get(scheme, w["rounds"])
                run_job = functools.partial(sched.run_job, scheme, rounds=rounds, params=cfg.params,
                                            chunk_params=cfg.chunk, compute_s=w["compute_s"],
                                            options=o.planner_options(), warmup=w["warmup"], progress=p["model"],
                                            staleness=p["staleness"], group=p["group"], compute=w["compute_model"],
                                            seed=o.wan["seed"], progress_options=o.progress_options())
                job = session.job(sched, scheme, run_job) if session.job is not None else run_job()
                js = await wait_or_die(job, agents.dead, survive=True, console=console, total=cfg.topo.nodes)
                jobs.append(js)
                summary = summarize(js, cfg)
                results.write({"type": "job", **summary})
                results.write({"type": "view", "job": js.job, "scheme": scheme, **live.view()})
                sched.note_event("guard", scheme=scheme, job=js.job, valid=summary["guard_valid"],
                                 verdict=summary["guard_verdict"], worst_ratio=summary["guard_worst_ratio"],
                                 bad_links=summary["guard_bad_links"][:5], reasons=summary["guard_reasons"][:5])
                for node, st in js.stats.items():
                    results.write({"type": "node_stats", "job": js.job, "scheme": scheme, "node": node, **st})
            if session.after is not None:
                await session.after()
        if show_table:
            print_table(console, jobs, cfg)
        return jobs
    finally:
        if injector is not None:
            await injector.stop()  # heals what is still active: a frozen agent must be able to exit
        if dashboard is not None:
            await dashboard.stop()
        await sched.shutdown()
        predictor.close()
        await agents.stop()
        backend.teardown()
        results.close()


def _fault_injector(cfg: RunConfig, sched: Scheduler, agents: Agents, results: Results,
                    backend: AppBackend) -> FaultInjector | None:
    """Faults of the run, fed the scheduler's job and round events; every step is a `fault` record
    in the results file and an event on the scheduler's timeline (the dashboard shows it)."""
    if not cfg.faults:
        return None

    def rate_of(src: int, dst: int) -> float:
        rate = cfg.topo.links[(src, dst)].rate_mbps
        if cfg.trace is not None and sched.job_t0 is not None:  # agents replay the trace from each job's t0
            t = time.time() - sched.job_t0
            for e in cfg.trace.for_link(src, dst):
                if e.t > t:
                    break
                rate = e.rate_mbps
        return rate

    def report(rec: dict[str, Any]) -> None:
        results.write(rec)
        sched.note_event("fault", **{("fault" if k == "kind" else k): v for k, v in rec.items() if k != "type"})

    links = cfg.link_control or backend.link_control() or AppLinkControl(sched.send)
    injector = FaultInjector(cfg.faults, links=links, pid_of=lambda n: None, rate_of=rate_of, report=report,
                             signal_node=agents.signal)
    sched.subscribe(injector.on_event)
    return injector


async def _start_dashboard(http: str | None, sched: Scheduler, live: LiveState, console: Console) -> Any:
    """The live page, JSON API and /metrics, served from this process; prints the URL to open."""
    if http is None:
        return None
    from scheduler.http import DashboardServer, parse_hostport

    host, port = parse_hostport(http)
    server = DashboardServer(sched, live, host=host, port=port)
    url = await server.start()
    console.print(f"dashboard: {url}  (JSON: {url}api, Prometheus: {url}metrics)", highlight=False, soft_wrap=True)
    return server
