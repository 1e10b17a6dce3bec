"""`wansync run`: a scheduler here, one `wansync agent` process per node, every scheme in turn.

The run composes parts that each do one thing: the scheduler (through its public API: start,
run_job, send, events), the backend that shapes links (backend.py), the agent processes (procs.py),
the results file (results.py), the terminal (progress.py), the fidelity guard (guard.py), faults
(emulation/faults.py) and the dashboard (scheduler/http.py). Every child is reaped on normal exit,
on Ctrl-C and on errors: agents also leave by themselves when their scheduler connection closes.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

from agents.workload import chunk_params, model_params
from emulation.faults import AppLinkControl, Fault, FaultInjector, LinkControl
from emulation.topology import Topology
from emulation.trace import Trace
from overlay.auth import SECRET_ENV, TlsFiles, generate_secret
from scheduler.live import LiveState
from scheduler.service import JobState, Scheduler

from .backend import AppBackend, TcBackend
from .guard import cpu_forecast, cpu_warning, fidelity_cell, job_guard
from .planinfo import info_line
from .predict import RoundPredictor
from .procs import reap, wait_or_die
from .progress import RunProgress
from .results import Recorder, Results

# asyncio, not uvloop: both carry an unshaped link at ~0.85x a raw socket here (transport bench), but
# with the shaper uvloop's ms-granular timers cost about twice the CPU for the same fidelity
DEFAULT_LOOP = "asyncio"


@dataclass
class RunConfig:
    topology: str
    topo: Topology
    schemes: list[str]
    model: str
    scale: float
    rounds: int
    seed: int = 1
    out: Path | None = None
    loop: str = DEFAULT_LOOP
    compute_s: float = 0.0
    compute_model: str | None = None  # a seeded per-node compute model (core.compute); overrides compute_s
    progress: str = "bsp"  # scheduler.progress: bsp, ssp (staleness), queue (group)
    staleness: int = 2
    group: int = 2
    progress_options: dict[str, Any] = field(default_factory=dict)  # mcast-bsp/-ssp: select, p, k, eta, caps
    warmup: int = 1
    hub: int | None = None
    k: int = 2
    dynamic: bool = False
    period_s: float = 180.0
    trace: Trace | None = None
    options: dict[str, Any] = field(default_factory=dict)  # planner options (NetStorm: roots, aux_mode, reroot)
    update_time_s: float = 5.0  # NetStorm's UPDATE_TIME at full scale
    update_rate: float = 0.1
    heartbeat_timeout: float = 1.5  # an agent silent this long is declared lost (frozen, partitioned)
    primary_busy_bound: int = 2
    aux_queue_length: int = 5
    probe_num: int = 4
    rounds_by_scheme: dict[str, int] = field(default_factory=dict)  # overrides `rounds` per scheme
    extra_agent_args: list[str] = field(default_factory=list)
    http: str | None = None  # dashboard/API/metrics HOST:PORT (port 0: a free one); None: no HTTP server
    backend: str = "app"  # app: token buckets in the agents; tc: the kernel (emulation/tc.py)
    faults: list[Fault] = field(default_factory=list)  # --fault / --scenario (emulation/faults.py)
    link_control: LinkControl | None = None  # who realises link faults (default: EMU messages to agents)
    trace_file: Path | None = None  # set by run(): the computed trace every agent loads (--trace-file)
    tls: TlsFiles | None = None  # --tls-cert/--tls-key/--tls-ca: mutual TLS on control and data connections
    chunk_override: int | None = None  # --chunk, in parameters (4 bytes each); None: chunk_params(scale)
    hold_budget_mb: float | None = None  # --hold-budget-mb, handed to every agent; None: the agent's default
    agent_gc: str = "tuned"  # --agent-gc: every agent's collector policy (agents/gcpolicy.py)
    secret: bytes | None = None  # --secret-file's secret; None: a fresh one per run
    secret_file: Path | None = None  # where it came from (agents read it there if it is not text)

    @property
    def params(self) -> int:
        return model_params(self.model, self.scale)

    @property
    def chunk(self) -> int:
        return self.chunk_override if self.chunk_override is not None else chunk_params(self.scale)


CHUNK_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_chunk(text: str) -> int:
    """--chunk: bytes with a unit (200KB, 4MiB, 200000B; KB = 1000, KiB = 1024) or a plain integer
    count of parameters (float32, 4 bytes each). Returns parameters; ValueError says what is wrong."""
    t = text.strip().replace(" ", "")
    i = len(t)
    while i > 0 and t[i - 1].isalpha():
        i -= 1
    number, unit = t[:i], t[i:].lower()
    if not unit:
        if not number.isdigit():
            raise ValueError(f"--chunk {text!r}: a plain number is a parameter count and must be a whole number "
                             "(or give bytes with a unit: B, KB, MB, GB, KiB, MiB, GiB)")
        n = int(number)
        if n <= 0:
            raise ValueError(f"--chunk {text!r}: must be > 0")
        return n
    if unit not in CHUNK_UNITS:
        raise ValueError(f"--chunk {text!r}: unknown unit {t[i:]!r} (B, KB, MB, GB, KiB, MiB, GiB; "
                         "no unit: parameters)")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"--chunk {text!r}: {number!r} is not a number") from None
    nbytes = value * CHUNK_UNITS[unit]
    if not nbytes > 0 or nbytes != int(nbytes):
        raise ValueError(f"--chunk {text!r}: must be a positive whole number of bytes")
    if int(nbytes) % 4:
        raise ValueError(f"--chunk {text!r} = {int(nbytes)} bytes: not a multiple of 4 (parameters are float32)")
    return int(nbytes) // 4


def agent_command(cfg: RunConfig, node: int, port: int, cluster: str) -> list[str]:
    cmd = [sys.executable, "-m", "wansync.cli", "agent", "--node", str(node), "--scheduler", f"127.0.0.1:{port}",
           "--cluster", cluster, "--topology", cfg.topology, "--seed", str(cfg.seed), "--scale", str(cfg.scale),
           "--loop", cfg.loop]
    if cfg.topology in ("uniform", "hetero") or cfg.topology.startswith(("uniform:", "hetero:")):
        cmd += ["--nodes", str(cfg.topo.nodes)]
    if cfg.trace_file is not None:  # the launcher's computed trace: agents never redraw it themselves
        cmd += ["--trace-file", str(cfg.trace_file)]
    elif cfg.dynamic:
        cmd += ["--dynamic", "--period", str(cfg.period_s)]
    cmd += ["--primary-busy-bound", str(cfg.primary_busy_bound), "--aux-queue-length", str(cfg.aux_queue_length),
            "--probe-num", str(cfg.probe_num)]
    if cfg.tls is not None:
        cmd += ["--tls-cert", cfg.tls.cert, "--tls-key", cfg.tls.key, "--tls-ca", cfg.tls.ca]
    if cfg.secret is not None and cfg.secret_file is not None and not _text_secret(cfg.secret):
        cmd += ["--secret-file", str(cfg.secret_file)]  # binary: an environment variable cannot carry it
    if cfg.hold_budget_mb is not None:
        cmd += ["--hold-budget-mb", f"{cfg.hold_budget_mb:g}"]
    cmd += ["--gc", cfg.agent_gc]
    if cfg.chunk_override is not None:  # probes stay half a chunk, as NetStorm's 2 MB to 4 MB at any scale
        cmd += ["--probe-bytes", str(cfg.chunk_override * 4 // 2)]
    return cmd + cfg.extra_agent_args  # the cluster secret goes in the environment, never in argv (ps)


def run_secret(cfg: RunConfig) -> tuple[bytes, dict[str, str]]:
    """The run's cluster secret (--secret-file's, or a fresh one) and the agents' environment: the
    secret goes there, never in argv (one that is not text goes as its file's path: agent_command)."""
    secret = generate_secret().encode() if cfg.secret is None else cfg.secret
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if _text_secret(secret):
        env[SECRET_ENV] = secret.decode()
    return secret, env


def _text_secret(secret: bytes) -> bool:
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


class LocalAgents:
    """`wansync run`: one agent process per node on this machine, shaped by the backend."""

    def __init__(self, cfg: RunConfig, cluster: str, env: dict[str, str], backend: AppBackend) -> None:
        self.cfg, self.cluster, self.env, self.backend = cfg, cluster, env, backend
        self.procs: list[subprocess.Popen] = []

    async def start(self, port: int) -> None:
        for n in range(self.cfg.topo.nodes):
            cmd = self.backend.agent_command(agent_command(self.cfg, n, port, self.cluster), n, port)
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=self.env))

    def dead(self) -> list[tuple[int, str]]:
        return [(i, f"exit {p.returncode}") for i, p in enumerate(self.procs) if p.poll() is not None]

    def signal(self, node: int, sig: int) -> None:
        if node >= len(self.procs):
            raise RuntimeError(f"no process for node {node}")
        os.kill(self.procs[node].pid, sig)

    async def stop(self) -> None:
        reap(self.procs)


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


async def run(cfg: RunConfig, console: Console | None = None, *, show_table: bool = True) -> list[JobState]:
    """Start a scheduler here and one agent process per node, run every scheme in turn, and reap
    everything on the way out, whatever the way out."""
    console = console or Console(stderr=True)
    cluster = "run-" + secrets.token_hex(4)
    secret, agent_env = run_secret(cfg)
    backend = TcBackend(cfg.topo, cfg.trace, console) if cfg.backend == "tc" else AppBackend()
    # every agent runs on this machine: say at start when the application backend cannot keep up
    if cfg.backend == "app" and (forecast := cpu_forecast(cfg.topo, cfg.trace, cfg.schemes, cfg.params, cfg.chunk)):
        console.print(f"[yellow]{cpu_warning(forecast, root=os.geteuid() == 0)}[/]", soft_wrap=True, highlight=False)
    agents = LocalAgents(cfg, cluster, agent_env, backend)
    if cfg.trace is not None and cfg.trace.events:  # the computed trace every local agent loads
        fd, name = tempfile.mkstemp(prefix="wansync-trace-", suffix=".json")
        os.close(fd)
        cfg.trace_file = Path(name)
        cfg.trace.write(cfg.trace_file)
    try:
        return await conduct(cfg, Session(cluster, secret, agents, backend), console, show_table=show_table)
    finally:
        if cfg.trace_file is not None:
            cfg.trace_file.unlink(missing_ok=True)


async def conduct(cfg: RunConfig, session: Session, console: Console, *, show_table: bool = True) -> list[JobState]:
    """Run every scheme on a scheduler with `topo.nodes` registered agents: record, summarize, print.
    Shared by `wansync run` (agents here), `wansync scheduler` (agents elsewhere) and `wansync deploy
    --scheduler-here` (agents over SSH); everything it started is stopped on every way out."""
    results = Results(cfg.out)
    results.write({"type": "run", "topology": cfg.topo.name, "nodes": cfg.topo.nodes, "schemes": cfg.schemes,
                   "model": cfg.model, "params": cfg.params, "chunk_params": cfg.chunk, "scale": cfg.scale,
                   "chunk_override": cfg.chunk_override is not None,
                   "rounds": cfg.rounds, "warmup": cfg.warmup, "loop": cfg.loop, "seed": cfg.seed,
                   "dynamic": cfg.dynamic, "links": cfg.topo.to_dict()["links"],
                   "trace": None if cfg.trace is None else cfg.trace.spec,
                   "faults": [f.describe() for f in cfg.faults], "cluster": session.cluster})
    predictor = RoundPredictor(cfg.topo, cfg.trace, primary_busy_bound=cfg.primary_busy_bound,
                               aux_queue_length=cfg.aux_queue_length)
    sched = Scheduler(session.cluster, cfg.topo.nodes, predict=predictor.round_s,
                      update_time=cfg.update_time_s * cfg.scale, update_rate=cfg.update_rate, secret=session.secret,
                      tls=cfg.tls, heartbeat_timeout=cfg.heartbeat_timeout)
    live = LiveState(sched)
    Recorder(results, sched, live)
    progress = RunProgress(console, sched, live)
    backend, agents = session.backend, session.agents
    sched.subscribe(lambda kind, data: kind == "job" and backend.on_job(data["t0"]))
    jobs: list[JobState] = []
    injector = _fault_injector(cfg, sched, agents, results, backend)
    dashboard = None
    try:
        dashboard = await _start_dashboard(cfg.http, sched, live, console)
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
            for scheme in cfg.schemes:
                options: dict[str, Any] = {"k": cfg.k, **cfg.options}
                if cfg.hub is not None:
                    options["hub"] = cfg.hub
                js = await wait_or_die(sched.run_job(scheme, rounds=cfg.rounds_by_scheme.get(scheme, cfg.rounds),
                                                     params=cfg.params, chunk_params=cfg.chunk,
                                                     compute_s=cfg.compute_s, options=options, warmup=cfg.warmup,
                                                     progress=cfg.progress, staleness=cfg.staleness,
                                                     group=cfg.group, compute=cfg.compute_model,
                                                     seed=cfg.seed, progress_options=cfg.progress_options),
                                       agents.dead, survive=True, console=console, total=cfg.topo.nodes)
                jobs.append(js)
                summary = summarize(js, cfg)
                results.write({"type": "job", **summary})
                sched.note_event("guard", scheme=scheme, job=js.job, valid=summary["guard_valid"],
                                 verdict=summary["guard_verdict"], worst_ratio=summary["guard_worst_ratio"],
                                 bad_links=summary["guard_bad_links"][:5], reasons=summary["guard_reasons"][:5])
                for node, st in js.stats.items():
                    results.write({"type": "node_stats", "job": js.job, "scheme": scheme, "node": node, **st})
        if show_table:
            print_table(console, jobs, cfg)
        return jobs
    finally:
        if injector is not None:
            await injector.stop()  # heals what is still active: a frozen agent must be able to exit
        if dashboard is not None:
            await dashboard.stop()
        await sched.shutdown()
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


def summarize(js: JobState, cfg: RunConfig) -> dict[str, Any]:
    recs = [r for r in js.records if not r.warmup] or js.records
    times = [r.round_s for r in recs]
    med = statistics.median(times)
    links = []
    for node, st in js.stats.items():
        for dst, link in st["links"].items():
            links.append((link["bytes"], f"{node}->{dst}", link.get("busy_s", 0.0)))
    links.sort(reverse=True)
    g = job_guard(js)
    lag = max((st["loop_lag_p99_s"] for st in js.stats.values()), default=0.0)
    lag_busy = max((st.get("loop_lag_busy_p99_s", 0.0) for st in js.stats.values()), default=0.0)
    cpu = {n: st["cpu_s"] / st["wall_s"] if st["wall_s"] else 0.0 for n, st in js.stats.items()}
    preds = [r.prediction_s for r in recs if r.prediction_s is not None]
    return {"job": js.job, "scheme": js.scheme, "progress": cfg.progress, "rounds": len(recs), "round_s_median": med,
            "prediction_s_median": statistics.median(preds) if preds else None, "round_s_min": min(times),
            "round_s_max": max(times), "algbw_MBps": cfg.params * 4 / med / 1e6,
            "all_exact": all(r.ok and r.digests_agree and r.versions_agree for r in js.records),
            "versions": sorted({r.version for r in js.records}), "policy_s": js.policy_s,
            "busiest_links": [{"link": n, "bytes": b, "busy_s": s} for b, n, s in links[:3]],
            # guard_valid: true only if judged valid; false if invalid; null if unjudged
            "guard_valid": g.valid, "guard_verdict": g.verdict, "guard_reasons": g.reasons,
            "guard_worst_ratio": g.worst_ratio, "guard_bad_links": g.bad, "guard_judged": g.judged,
            "loop_lag_p99_s": lag, "loop_lag_busy_p99_s": lag_busy, "cpu_share": cpu,
            "loop_cpu_share": {n: st.get("loop_cpu_share") for n, st in js.stats.items()},
            # overheads (NetStorm §6): topology-request wait, policy compute and bytes, held frames, aux share
            "trp_wait_s_median": statistics.median(r.trp_wait_s for r in recs), "replans": js.replans,
            "aux_updates": js.aux_updates,
            "stashed_frames": sum(st.get("stashed_frames", 0) for st in js.stats.values()),
            "aux_share": (sum(st.get("aux_bytes", 0) for st in js.stats.values())
                          / max(1, sum(st.get("sent_bytes", 0) for st in js.stats.values()))),
            "view_coverage": recs[-1].coverage, "plan_info": dict(js.plan.info)}


def print_table(console: Console, jobs: list[JobState], cfg: RunConfig) -> None:
    mb = cfg.params * 4 / 1e6
    t = Table(title=f"{cfg.topo.name}, {cfg.topo.nodes} nodes, {cfg.model} x{cfg.scale} = {mb:.1f} MB, "
                    f"{cfg.rounds} rounds (+{cfg.warmup} warm-up) per scheme")
    for col in ("scheme", "median s", "min s", "max s", "sim s", "algbw MB/s", "exact", "busiest links (MB)",
                "fidelity"):
        t.add_column(col, justify="right" if col.endswith(("s", "MB/s")) else "left")
    for js in jobs:
        s = summarize(js, cfg)
        busiest = ", ".join(f"{x['link']} {x['bytes'] / 1e6:.1f}" for x in s["busiest_links"])
        fid = fidelity_cell(s)
        sim = "-" if s["prediction_s_median"] is None else f"{s['prediction_s_median']:.3f}"
        t.add_row(js.scheme, f"{s['round_s_median']:.3f}", f"{s['round_s_min']:.3f}", f"{s['round_s_max']:.3f}", sim,
                  f"{s['algbw_MBps']:.2f}", "yes" if s["all_exact"] else "[bold red]NO[/]", busiest, fid)
    Console(width=max(console.width, 150)).print(t)
    for js in jobs:
        if line := info_line(js.scheme, js.plan.info):
            console.print(line, highlight=False, soft_wrap=True)


def set_loop(loop: str) -> None:
    if loop == "uvloop":
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    elif loop != "asyncio":
        raise ValueError(f"--loop must be uvloop or asyncio, got {loop!r}")
    os.environ["WANSYNC_LOOP"] = loop
