"""`wansync run`: a scheduler here, one `wansync agent` process per node, every scheme in turn.

Every child is reaped on normal exit, on Ctrl-C and on errors: agents also leave by themselves
when their scheduler connection closes.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agents.workload import chunk_params, model_params
from emulation.faults import AppLinkControl, Fault, FaultInjector, LinkControl
from emulation.tc import TcNetwork
from emulation.topology import Topology
from emulation.trace import Trace
from overlay.auth import SECRET_ENV, TlsFiles, generate_secret
from scheduler.live import LiveState
from scheduler.service import JobState, Scheduler

from .predict import RoundPredictor

SCHEMA_VERSION = 2  # 2: adds `throughput` and `event` records (README: Results file)
# asyncio, not uvloop: both carry an unshaped link at ~0.85x a raw socket here (transport bench), but
# with the shaper uvloop's ms-granular timers cost about twice the CPU for the same fidelity
DEFAULT_LOOP = "asyncio"
# The fidelity guard (README: Fidelity guard). Books: a link or node cap backlogged >= GUARD_MIN_BACKLOG_S
# must have carried >= GUARD_MIN_RATIO of what its rate allowed
GUARD_MIN_RATIO = 0.97
GUARD_MIN_BACKLOG_S = 0.5  # shorter backlogs are dominated by the bucket's initial burst
# The loop, per agent, whatever the books say. Senders schedule LOOKAHEAD_S (20 ms) of wire time ahead:
# a loop that wakes them 20 ms late has certainly let the wire run dry while data waited (the books
# judge anything shorter directly). On an idle 2-core machine with 9 agents the busy p99 is 1.5-3 ms;
# CPU-starved ones show 12-42 ms. So: lag p99 while the node had traffic <= 20 ms
GUARD_MAX_LAG_S = 0.020
# judged over >= 200 busy ticks (2 s): over fewer a p99 is one or two samples, i.e. the worst hiccup
GUARD_MIN_LAG_TICKS = 200
# A loop thread busy >= 90 % of the job has no slack left to wake timers on time (it queues behind itself)
GUARD_MAX_LOOP_CPU = 0.90
# The loop thread waited for a CPU (runnable, not running: the machine's run queue) longer than it ran:
# whatever it did, it did late on average; and >= 2 ms per wake-up on average is a tenth of the lag limit
GUARD_MAX_RUNQ_PER_CPU = 1.0
GUARD_MAX_RUNQ_PER_RUN_S = 0.002
VERDICTS = ("valid", "invalid", "unjudged")


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


class Results:
    """The JSON-lines results file: one record per round per scheme, link samples, guard verdicts."""

    def __init__(self, path: Path | None) -> None:
        self.fh: TextIO | None = path.open("w") if path else None

    def write(self, record: dict[str, Any]) -> None:
        if self.fh is not None:
            self.fh.write(json.dumps({"schema": SCHEMA_VERSION, "t": time.time(), **record}, default=str) + "\n")

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


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


def tc_agent_command(cmd: list[str], net: TcNetwork, node: int, port: int) -> list[str]:
    """The same agent inside its namespace: scheduler over the unshaped control bridge, data on its
    netns address (so agent-to-agent bytes cross the shaped veths), delay only in the application."""
    cmd = list(cmd)
    cmd[cmd.index("--scheduler") + 1] = f"{net.ctl_host}:{port}"
    return net.exec_prefix(node) + cmd + ["--listen", f"{net.data_addr(node)}:0", "--delay-only"]


async def apply_trace_tc(net: TcNetwork, topo: Topology, trace: Trace, t0: float) -> None:
    """The run's trace, applied to the kernel (`tc class change`) from a job's t0, as agents would."""
    await asyncio.to_thread(net.set_rates, {k: s.rate_mbps for k, s in topo.links.items()})
    events = sorted(trace.events)
    i = 0
    while i < len(events):
        t = events[i].t
        batch = {}
        while i < len(events) and events[i].t == t:
            batch[(events[i].src, events[i].dst)] = events[i].rate_mbps
            i += 1
        await asyncio.sleep(max(0.0, t0 + t - time.time()))
        await asyncio.to_thread(net.set_rates, batch)


async def run(cfg: RunConfig, console: Console | None = None, *, show_table: bool = True) -> list[JobState]:
    console = console or Console(stderr=True)
    cluster = "run-" + secrets.token_hex(4)
    secret, agent_env = run_secret(cfg)
    results = Results(cfg.out)
    results.write({"type": "run", "topology": cfg.topo.name, "nodes": cfg.topo.nodes, "schemes": cfg.schemes,
                   "model": cfg.model, "params": cfg.params, "chunk_params": cfg.chunk, "scale": cfg.scale,
                   "chunk_override": cfg.chunk_override is not None,
                   "rounds": cfg.rounds, "warmup": cfg.warmup, "loop": cfg.loop, "seed": cfg.seed,
                   "dynamic": cfg.dynamic, "links": cfg.topo.to_dict()["links"],
                   "trace": None if cfg.trace is None else cfg.trace.spec,
                   "faults": [f.describe() for f in cfg.faults]})
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
                        transient=False, disable=not console.is_terminal)
    tasks: dict[int, Any] = {}
    predictor = RoundPredictor(cfg.topo, cfg.trace, primary_busy_bound=cfg.primary_busy_bound,
                               aux_queue_length=cfg.aux_queue_length)

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind == "round":
            if data["prediction_s"]:
                data["prediction_err_pct"] = 100.0 * (data["round_s"] - data["prediction_s"]) / data["prediction_s"]
            results.write(data)
            tid = tasks.get(data["job"])
            if tid is not None:
                progress.update(tid, advance=1, info=_progress_info(live, data, 0.0))
            if not console.is_terminal:
                console.print(f"  {data['scheme']:>6} round {data['round']}: {data['round_s']:.3f}s "
                              f"{'ok' if data['ok'] and data['digests_agree'] else 'WRONG'}"
                              f"{' (warm-up)' if data['warmup'] else ''}")
        elif kind == "samples":
            for src, dst, nbytes, seconds in data["samples"]:
                results.write({"type": "link_sample", "src": src, "dst": dst, "bytes": nbytes, "seconds": seconds})
        elif kind == "plan":
            results.write({"type": "plan", "version": data["version"], "scheme": data["scheme"],
                           "plan": data["plan"].to_wire()})
        elif kind == "timeline":
            results.write({"type": "event", "kind": data["kind"], "at": data["t"],
                           "data": {k: v for k, v in data.items() if k not in ("t", "kind")}})

    sched = Scheduler(cluster, cfg.topo.nodes, on_event=on_event, predict=predictor.round_s,
                      update_time=cfg.update_time_s * cfg.scale, update_rate=cfg.update_rate,
                      secret=secret, tls=cfg.tls, heartbeat_timeout=cfg.heartbeat_timeout)
    live = LiveState(sched)
    live.listeners.append(lambda kind, it: kind == "point" and results.write(
        {"type": "throughput", "src": it["src"], "dst": it["dst"], "at": it["t"], "mbps": it["mbps"],
         "bytes": it["bytes"]}))
    dashboard = await _start_dashboard(cfg.http, sched, live, console)
    ticker = asyncio.create_task(_tick_progress(progress, tasks, live))
    procs: list[subprocess.Popen] = []
    jobs: list[JobState] = []
    injector = _fault_injector(cfg, sched, procs, results)
    if cfg.trace is not None and cfg.trace.events:
        fd, name = tempfile.mkstemp(prefix="wansync-trace-", suffix=".json")
        os.close(fd)
        cfg.trace_file = Path(name)
        cfg.trace.write(cfg.trace_file)
    net: TcNetwork | None = None
    trace_task: list[asyncio.Task] = []
    try:
        if cfg.backend == "tc":
            net = TcNetwork(cfg.topo)
            await asyncio.to_thread(net.setup)
            console.print(f"tc backend: run {net.prefix}, {cfg.topo.nodes} namespaces, one shaped veth pair per "
                          "link; no netem in this kernel, so link delay and jitter stay in the agents")

            def on_job(kind: str, data: dict[str, Any], net: TcNetwork = net) -> None:
                if kind == "job" and sched.current is not None and cfg.trace is not None and cfg.trace.events:
                    for t in trace_task:
                        t.cancel()
                    trace_task[:] = [asyncio.ensure_future(apply_trace_tc(net, cfg.topo, cfg.trace,
                                                                          sched.current.t0))]
            sched.subscribe(on_job)
        port = await sched.start(net.ctl_host if net is not None else "127.0.0.1")
        for n in range(cfg.topo.nodes):
            cmd = agent_command(cfg, n, port, cluster)
            procs.append(subprocess.Popen(tc_agent_command(cmd, net, n, port) if net is not None else cmd,
                                          stdin=subprocess.DEVNULL, env=agent_env))
        await _wait_or_die(sched.wait_agents(60), procs)
        if injector is not None:
            if net is not None and cfg.link_control is None and hasattr(net, "set_blackhole"):
                injector.links = net  # type: ignore[assignment]  # the kernel realises link faults
            injector.start()
        with progress:
            for scheme in cfg.schemes:
                rounds = cfg.rounds_by_scheme.get(scheme, cfg.rounds)
                tasks[sched.job_id + 1] = progress.add_task(f"{scheme:>6}", total=rounds + cfg.warmup, info="")
                options: dict[str, Any] = {"k": cfg.k, **cfg.options}
                if cfg.hub is not None:
                    options["hub"] = cfg.hub
                js = await _wait_or_die(sched.run_job(scheme, rounds=rounds, params=cfg.params,
                                                      chunk_params=cfg.chunk, compute_s=cfg.compute_s,
                                                      options=options, warmup=cfg.warmup), procs,
                                  survive=True, console=console)
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
        if cfg.trace_file is not None:
            cfg.trace_file.unlink(missing_ok=True)
        for t in trace_task:
            t.cancel()
        ticker.cancel()
        if dashboard is not None:
            await dashboard.stop()
        await sched.shutdown()
        reap(procs)
        if net is not None:
            net.teardown()
        results.close()


def _fault_injector(cfg: RunConfig, sched: Scheduler, procs: list[subprocess.Popen],
                    results: Results) -> FaultInjector | None:
    """Faults of the run, fed the scheduler's job and round events; every step is a `fault` record
    in the results file and an event on the scheduler's timeline (the dashboard shows it)."""
    if not cfg.faults:
        return None

    def send(node: int, msg: dict[str, Any]) -> None:
        agent = sched.agents.get(node)
        if agent is None:
            raise RuntimeError(f"node {node} is not registered")
        agent.conn.send(msg)

    def rate_of(src: int, dst: int) -> float:
        rate = cfg.topo.links[(src, dst)].rate_mbps
        if cfg.trace is not None and sched.current is not None:  # agents replay the trace from each job's t0
            t = time.time() - sched.current.t0
            for e in cfg.trace.for_link(src, dst):
                if e.t > t:
                    break
                rate = e.rate_mbps
        return rate

    def report(rec: dict[str, Any]) -> None:
        results.write(rec)
        sched.note_event("fault", **{("fault" if k == "kind" else k): v for k, v in rec.items() if k != "type"})

    injector = FaultInjector(cfg.faults, links=cfg.link_control or AppLinkControl(send),
                             pid_of=lambda n: procs[n].pid if n < len(procs) else None, rate_of=rate_of,
                             report=report)
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


async def _tick_progress(progress: Progress, tasks: dict[int, Any], live: LiveState) -> None:
    """Terminal line per scheme: last and running round time, plan version, the slowest link in use."""
    while True:
        await asyncio.sleep(0.5)
        job = live.job
        tid = tasks.get(job["job"]) if job else None
        if job is None or tid is None or job["done"] >= job["rounds"]:
            continue
        last = next((r for r in reversed(live.rounds) if r["job"] == job["job"]), None)
        progress.update(tid, info=_progress_info(live, last, time.time() - job["last_end"]))


def _progress_info(live: LiveState, last: dict[str, Any] | None, running_s: float) -> str:
    info = f"last {last['round_s']:.2f}s{'' if last['ok'] else ' WRONG'} " if last else ""
    info += f"now {running_s:.1f}s v{live.sched.version}"
    slow = live.slowest_link()
    return info + (f" slowest {slow[0]}->{slow[1]} {slow[2]:.0f} Mb/s" if slow is not None else "")


async def _wait_or_die(aw: Any, procs: list[subprocess.Popen], *, survive: bool = False,
                       console: Console | None = None) -> Any:
    """Await `aw`; if agent processes die, fail at once instead of hanging, unless `survive` (a
    running job: the scheduler aborts the round and goes on without them, as long as two remain)."""
    task = asyncio.ensure_future(aw)
    told: set[int] = set()
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if done:
            return task.result()
        dead = [(i, p.returncode) for i, p in enumerate(procs) if p.poll() is not None]
        if dead and (not survive or len(procs) - len(dead) < 2):
            task.cancel()
            raise RuntimeError(f"agent process(es) exited: {', '.join(f'node {i} (exit {rc})' for i, rc in dead)}")
        for i, rc in dead:
            if i not in told and console is not None:
                told.add(i)
                console.print(f"[yellow]agent {i} exited (code {rc}); the scheduler goes on without it[/]")


def reap(procs: list[subprocess.Popen], grace_s: float = 3.0) -> None:
    """Give agents `grace_s` to leave by themselves (after SHUTDOWN), then SIGTERM, then SIGKILL."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)  # a frozen agent (a fault) cannot leave otherwise
    deadline = time.time() + grace_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(1.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@dataclass
class GuardVerdict:
    """The fidelity guard's word on one job: `valid` only if something was judged and all of it held."""

    verdict: str  # "valid", "invalid" or "unjudged"
    worst_ratio: float | None  # worst achieved/configured ratio among judged links and caps
    bad: list[str]  # judged links and caps below GUARD_MIN_RATIO, e.g. "0->1 93.5%", "uplink of 3 90.0%"
    reasons: list[str]  # why invalid or unjudged (empty when valid)
    judged: int  # links and caps judged (backlogged long enough)

    @property
    def valid(self) -> bool | None:
        """True if valid, False if invalid, None if unjudged (never valid by default)."""
        return {"valid": True, "invalid": False}.get(self.verdict)


def guard_verdict(stats: Mapping[Any, Mapping[str, Any]], participants: Iterable[Any] | None = None
                  ) -> GuardVerdict:
    """Judge a job from its agents' STATS: the books of every link and node cap backlogged at least
    GUARD_MIN_BACKLOG_S (>= GUARD_MIN_RATIO of their rate), and every agent's event loop (lag while
    busy, CPU share of its thread, time waiting for a CPU). Any failure: invalid. Otherwise valid
    only if at least one book was judged and every participant reported; else unjudged."""
    bad: list[str] = []
    starved: list[str] = []
    worst: float | None = None
    judged = 0
    longest = 0.0
    unshaped: list[str] = []

    def book(label: str, entry: Mapping[str, Any]) -> None:
        nonlocal worst, judged, longest
        if "achieved_ratio" not in entry:
            return
        backlog = float(entry.get("backlog_s", 0.0))
        longest = max(longest, backlog)
        if backlog < GUARD_MIN_BACKLOG_S:
            return
        judged += 1
        ratio = float(entry["achieved_ratio"])
        worst = ratio if worst is None else min(worst, ratio)
        if ratio < GUARD_MIN_RATIO:
            bad.append(f"{label} {ratio:.1%}")

    for node, st in sorted(stats.items(), key=lambda kv: str(kv[0])):
        if st.get("app_rate_shaping") is False:
            unshaped.append(str(node))
        for dst, link in st.get("links", {}).items():
            book(f"{node}->{dst}", link)
        for name, cap in st.get("caps", {}).items():
            book(f"{name} of {node}", cap)
        lag, ticks = st.get("loop_lag_busy_p99_s"), int(st.get("loop_busy_ticks", 0))
        if lag is not None and ticks >= GUARD_MIN_LAG_TICKS and lag > GUARD_MAX_LAG_S:
            starved.append(f"node {node}: event-loop lag p99 {lag * 1e3:.1f} ms while busy "
                           f"(> {GUARD_MAX_LAG_S * 1e3:g} ms)")
        if float(st.get("wall_s", 0.0)) >= GUARD_MIN_BACKLOG_S:
            cpu = float(st.get("loop_cpu_share", 0.0))
            if cpu >= GUARD_MAX_LOOP_CPU:
                starved.append(f"node {node}: event loop busy {cpu:.0%} of the job (>= {GUARD_MAX_LOOP_CPU:.0%})")
            wait = float(st.get("runq_wait_share", 0.0))
            per_run = float(st.get("runq_wait_per_run_s", 0.0))
            if cpu > 0 and wait / cpu > GUARD_MAX_RUNQ_PER_CPU and per_run > GUARD_MAX_RUNQ_PER_RUN_S:
                starved.append(f"node {node}: event loop waited for a CPU {wait / cpu:.1f}x as long as it ran, "
                               f"{per_run * 1e3:.1f} ms per wake-up (machine overloaded)")
    reasons: list[str] = []
    if bad:
        reasons.append(f"{len(bad)} backlogged link(s)/cap(s) below {GUARD_MIN_RATIO:.0%} of their rate: "
                       + ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else ""))
    reasons += starved
    if reasons:
        return GuardVerdict("invalid", worst, bad, reasons, judged)
    missing = sorted(set(participants or ()) - set(stats), key=str)
    if missing:
        reasons.append(f"no STATS from node(s) {', '.join(map(str, missing))}")
    if not stats:
        reasons.append("no agent reported STATS")
    elif judged == 0:
        if unshaped and len(unshaped) == len(stats):
            reasons.append("rates shaped by the kernel (tc backend): no application-level books to judge")
        else:
            reasons.append(f"too short to judge: no link or cap was backlogged >= {GUARD_MIN_BACKLOG_S:g} s "
                           f"(longest {longest:.2f} s); run more rounds or a larger --scale")
    if reasons:
        return GuardVerdict("unjudged", worst, bad, reasons, judged)
    return GuardVerdict("valid", worst, bad, [], judged)


def job_guard(js: JobState) -> GuardVerdict:
    return guard_verdict(js.stats, js.plan.participants)


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
    return {"job": js.job, "scheme": js.scheme, "rounds": len(recs), "round_s_median": med,
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
            "view_coverage": recs[-1].coverage}


def live_guard(jobs: Iterable[JobState], *, reason: str | None = None) -> dict[str, Any]:
    """The benchmarks' figures for the live runs they used: `live_guard_valid` is true only if every
    one was judged valid (none at all: false); counts per verdict, and the first reasons otherwise."""
    verdicts = {v: 0 for v in VERDICTS}
    reasons: list[str] = []
    for js in jobs:
        g = job_guard(js)
        verdicts[g.verdict] += 1
        reasons += [f"{js.scheme}: {r}" for r in g.reasons[:1]]
    ok = sum(verdicts.values()) > 0 and verdicts["valid"] == sum(verdicts.values()) and reason is None
    out: dict[str, Any] = {"live_guard_valid": ok, "live_guard_verdicts": verdicts}
    if not ok:
        out["live_guard_reason"] = reason or ("; ".join(reasons[:3]) if reasons else "no live run to judge")
    return out


def fidelity_cell(s: Mapping[str, Any]) -> str:
    """The table's fidelity column: ok, INVALID (why) or UNJUDGED (why), never ok by default."""
    worst = "" if s.get("guard_worst_ratio") is None else f"worst {s['guard_worst_ratio']:.1%}, "
    if s["guard_verdict"] == "valid":
        return f"ok ({worst}{s['guard_judged']} judged)"
    why = "; ".join(s["guard_reasons"][:2])
    if s["guard_verdict"] == "invalid":
        return f"[bold red]INVALID: {why}[/]"
    return f"[yellow]UNJUDGED: {why}[/]"


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


def set_loop(loop: str) -> None:
    if loop == "uvloop":
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    elif loop != "asyncio":
        raise ValueError(f"--loop must be uvloop or asyncio, got {loop!r}")
    os.environ["WANSYNC_LOOP"] = loop
