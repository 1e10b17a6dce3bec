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
GUARD_MIN_RATIO = 0.97
GUARD_MIN_BACKLOG_S = 0.5  # shorter backlogs are dominated by the bucket's initial burst


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

    @property
    def params(self) -> int:
        return model_params(self.model, self.scale)

    @property
    def chunk(self) -> int:
        return chunk_params(self.scale)


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
    return cmd + cfg.extra_agent_args  # the cluster secret goes in the environment, never in argv (ps)


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
    secret = generate_secret()  # one per run, handed to the agents in their environment
    agent_env = {**os.environ, SECRET_ENV: secret}
    results = Results(cfg.out)
    results.write({"type": "run", "topology": cfg.topo.name, "nodes": cfg.topo.nodes, "schemes": cfg.schemes,
                   "model": cfg.model, "params": cfg.params, "chunk_params": cfg.chunk, "scale": cfg.scale,
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
                      secret=secret.encode(), tls=cfg.tls, heartbeat_timeout=cfg.heartbeat_timeout)
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
                                 worst_ratio=summary["guard_worst_ratio"], bad_links=summary["guard_bad_links"][:5])
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


def guard_verdict(js: JobState) -> tuple[bool, float, list[str]]:
    """(valid, worst achieved ratio, offending links) over links backlogged long enough to judge."""
    worst, bad = 1.0, []
    for node, st in js.stats.items():
        for dst, link in st["links"].items():
            if "achieved_ratio" not in link or link.get("backlog_s", 0) < GUARD_MIN_BACKLOG_S:
                continue
            worst = min(worst, link["achieved_ratio"])
            if link["achieved_ratio"] < GUARD_MIN_RATIO:
                bad.append(f"{node}->{dst} {link['achieved_ratio']:.1%}")
    return not bad, worst, bad


def summarize(js: JobState, cfg: RunConfig) -> dict[str, Any]:
    recs = [r for r in js.records if not r.warmup] or js.records
    times = [r.round_s for r in recs]
    med = statistics.median(times)
    links = []
    for node, st in js.stats.items():
        for dst, link in st["links"].items():
            links.append((link["bytes"], f"{node}->{dst}", link.get("busy_s", 0.0)))
    links.sort(reverse=True)
    valid, worst, bad = guard_verdict(js)
    lag = max((st["loop_lag_p99_s"] for st in js.stats.values()), default=0.0)
    cpu = {n: st["cpu_s"] / st["wall_s"] if st["wall_s"] else 0.0 for n, st in js.stats.items()}
    preds = [r.prediction_s for r in recs if r.prediction_s is not None]
    return {"job": js.job, "scheme": js.scheme, "rounds": len(recs), "round_s_median": med,
            "prediction_s_median": statistics.median(preds) if preds else None, "round_s_min": min(times),
            "round_s_max": max(times), "algbw_MBps": cfg.params * 4 / med / 1e6,
            "all_exact": all(r.ok and r.digests_agree and r.versions_agree for r in js.records),
            "versions": sorted({r.version for r in js.records}), "policy_s": js.policy_s,
            "busiest_links": [{"link": n, "bytes": b, "busy_s": s} for b, n, s in links[:3]],
            "guard_valid": valid, "guard_worst_ratio": worst, "guard_bad_links": bad,
            "loop_lag_p99_s": lag, "cpu_share": cpu,
            # overheads (NetStorm §6): topology-request wait, policy compute and bytes, held frames, aux share
            "trp_wait_s_median": statistics.median(r.trp_wait_s for r in recs), "replans": js.replans,
            "aux_updates": js.aux_updates,
            "stashed_frames": sum(st.get("stashed_frames", 0) for st in js.stats.values()),
            "aux_share": (sum(st.get("aux_bytes", 0) for st in js.stats.values())
                          / max(1, sum(st.get("sent_bytes", 0) for st in js.stats.values()))),
            "view_coverage": recs[-1].coverage}


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
        fid = (f"ok (worst {s['guard_worst_ratio']:.1%})" if s["guard_valid"]
               else f"[bold red]INVALID: CPU-bound ({'; '.join(s['guard_bad_links'][:3])})[/]")
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
