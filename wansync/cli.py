"""The `wansync` command line: run, scheduler, agent, deploy, simulate, plot, emu."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from agents import gcpolicy
from emulation.faults import FaultError
from emulation.topology import Topology, TopologyError, build
from emulation.trace import TraceError

from .stopping import Stopped, until_signal

if TYPE_CHECKING:
    from overlay.auth import TlsFiles

    from .cluster import RunConfig

DEFAULT_SCHEMES = "star,ring,mst,ktree,netstorm"  # the four baselines and the system this project is about
SSP_SCHEMES = "mcast,mcast-l3"  # SSP multicasts each worker's parameters: one unicast per receiver, or replicated
CHUNK_HELP = ("chunk size, overriding the scaled default (1 M parameters x --scale): bytes with a unit "
              "(200KB, 4MiB, 200000B; KB = 1000, KiB = 1024 bytes) or a plain integer = a parameter count "
              "(float32, 4 bytes each); a whole number of parameters")
TRACE_HORIZON_S = 6 * 3600.0
MCAST_PROGRESS = ("mcast-bsp", "mcast-ssp")  # multicasts to chosen receivers (SelMcast)


def _topology(args: argparse.Namespace) -> Topology:
    topo = build(args.topology, args.nodes, seed=args.seed)
    return topo.scaled(args.scale)


def _trace(args: argparse.Namespace, topo: Topology):  # noqa: ANN202
    """--trace-file (computed by the launcher, already scaled) > --trace SPEC > --dynamic (redraw:PERIOD)."""
    from emulation.trace import Trace
    from emulation.trace import build as build_trace

    caps = [(n, "up") for n in topo.uplink_mbps] + [(n, "down") for n in topo.downlink_mbps]
    if getattr(args, "trace_file", None):
        return Trace.read(args.trace_file).check(topo.links, f"trace file {args.trace_file}", caps)
    spec = getattr(args, "trace", None)
    if spec is not None and getattr(args, "dynamic", False):
        raise TraceError("trace: give --trace or --dynamic/--period (an alias of --trace redraw:PERIOD), not both")
    if spec is None:
        if not getattr(args, "dynamic", False):
            return Trace()
        spec = f"redraw:{args.period:g}"
    base = {k: s.rate_mbps for k, s in topo.links.items()}
    return build_trace(spec, base, horizon_s=TRACE_HORIZON_S, seed=args.seed, topology=topo).scaled(args.scale)


def _faults(args: argparse.Namespace, topo: Topology) -> list:
    from emulation.faults import check, load_scenario, parse

    faults = [parse(s) for s in args.fault or ()]
    if args.scenario is not None:
        faults += load_scenario(args.scenario)
    return check(faults, topo.nodes, topo.links)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", default="internet2",
                   help="internet2 | uniform[:Mbps] | hetero[:lo-hi] | geo:NAME[:x=F] (measured, e.g. geo:aws10) | "
                        "waxman:N[:seed=S] | crew:N[:seed=S] | FILE.toml/.json (default internet2)")
    p.add_argument("--nodes", type=int, default=None, help="cluster size (full-mesh topologies; default 9)")
    p.add_argument("--seed", type=int, default=1, help="seed of rate draws and traces")
    p.add_argument("--scale", type=float, default=0.05,
                   help="shrinks model bytes, chunk size, link delays and trace periods together (default 0.05)")
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                   help="event loop (default asyncio: as fast as uvloop on one link here, half its CPU when shaping)")
    p.add_argument("--dynamic", action="store_true", help="redraw every directed link's rate every --period s")
    p.add_argument("--period", type=float, default=180.0, help="redraw period at full scale (default 180 s)")
    p.add_argument("--trace", default=None, metavar="SPEC",
                   help="fluctuation: constant | redraw:PERIOD | walk:period=10,step=0.2,lo=20,hi=155 | "
                        "markov:mean_up=60,mean_down=5 | steps:T=F,... | steps:FILE | csv:FILE (time,src,dst,rate); "
                        "seeded by --seed, times scaled by --scale (--dynamic = redraw:--period)")
    p.add_argument("--trace-file", type=Path, default=None, metavar="PATH",
                   help="a computed trace (JSON, already scaled), as `run` hands its agents")
    p.add_argument("-v", "--verbose", action="store_true")


def _tls_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("TLS (optional, for runs across real WANs; all three or none)")
    g.add_argument("--tls-cert", default=None, metavar="PEM", help="this node's certificate (signed by --tls-ca)")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="its private key")
    g.add_argument("--tls-ca", default=None, metavar="PEM", help="CA that signs every node's certificate")


def _security(args: argparse.Namespace) -> tuple[bytes | None, TlsFiles | None]:
    """(cluster secret, TLS files) for `wansync agent`: a node never runs open to strangers by accident."""
    from overlay.auth import SECRET_ENV, SecretError, TlsFiles, load_secret

    try:
        secret = load_secret(args.secret_file)
        tls = TlsFiles.from_args(args.tls_cert, args.tls_key, args.tls_ca)
    except SecretError as exc:
        raise SystemExit(f"wansync: {exc}") from None
    if secret is None and not args.insecure:
        raise SystemExit(f"wansync: no cluster secret: give --secret-file FILE or set ${SECRET_ENV} "
                         "(or --insecure, on a trusted network only)")
    if secret is not None and args.insecure:
        raise SystemExit("wansync: --insecure given, but a cluster secret is configured too")
    return secret, tls


def _mcast_options(args: argparse.Namespace) -> dict:
    """SelMcast's options for --progress mcast-bsp / mcast-ssp (scheduler/progress/mcast.py)."""
    if args.progress not in MCAST_PROGRESS:
        return {}
    k = None if str(args.sync_every).lower() == "none" else args.sync_every
    try:
        k = None if k is None else int(k)
    except ValueError:
        raise SystemExit(f"wansync: --sync-every must be an integer >= 0 or none, got {args.sync_every!r}") from None
    if (k is not None and k < 0) or (args.min_receivers is not None and args.min_receivers < 0) \
            or not 0 <= args.eta <= 1:
        raise SystemExit("wansync: --sync-every and --min-receivers must be >= 0, --eta in [0, 1]")
    return {"select": args.select, "p": args.min_receivers, "k": k, "eta": args.eta, "seed": args.seed,
            "caps": args.caps_from}


def _compute_model(args: argparse.Namespace, schemes: list[str]) -> str | None:
    """--compute-model checked here (a csv trace made absolute for the agent processes), and the
    progress model's fit with the schemes: ssp multicasts one worker's tensor, the others reduce."""
    from scheduler.planners import resolve
    from sim.compute import ComputeError, ComputeModel

    if args.staleness < 0 or args.group < 1:
        raise SystemExit("wansync: --staleness must be >= 0 and --group >= 1")
    for scheme in schemes:
        if resolve(scheme).one_source != (args.progress in ("ssp", *MCAST_PROGRESS)):
            raise SystemExit(f"wansync: scheme {scheme} does not fit --progress {args.progress}: ssp, mcast-bsp and "
                             "mcast-ssp take one-source schemes (mcast, mcast-l3), bsp and queue take reduces")
    spec = args.compute_model
    if spec is None:
        return None
    if spec.startswith("csv:"):
        spec = "csv:" + str(Path(spec[4:]).resolve())
    try:
        ComputeModel(spec, args.seed)
    except ComputeError as exc:
        raise SystemExit(f"wansync: --compute-model: {exc}") from None
    return spec


def _run_options(r: argparse.ArgumentParser) -> None:
    """What a run does (schemes, model, rounds, faults, results, dashboard): `run`, `scheduler`, `deploy`."""
    r.add_argument("--schemes", default=None,
                   help=f"comma-separated (default {DEFAULT_SCHEMES}; with --progress ssp: {SSP_SCHEMES})")
    r.add_argument("--model", default="resnet50", help="model name or parameter count (default resnet50)")
    r.add_argument("--rounds", type=int, default=5, help="measured rounds per scheme (default 5)")
    r.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first, to learn the network (default 1)")
    r.add_argument("--compute", type=float, default=0.0, help="compute seconds per round (default 0)")
    r.add_argument("--compute-model", default=None, metavar="SPEC",
                   help="per-node compute time per iteration, seeded by --seed (overrides --compute): "
                        "constant:S | normal:mean=S,sd=S[,spread=F] | lognormal:mean=S,cv=F[,spread=F][,spike=Q] | "
                        "cnn:mean=S | transformer:mean=S | csv:FILE "
                        "(node,iteration,seconds); spread: each node's own mean within +-F of mean")
    r.add_argument("--progress", choices=("bsp", "ssp", "queue", "crew", "selective", *MCAST_PROGRESS), default="bsp",
                   help="how workers synchronize: bsp (a reduce of all per round, default), ssp (each worker's "
                        "parameters multicast after every iteration, at most --staleness ahead of the slowest; "
                        "schemes mcast, mcast-l3), queue (reduces of the first --group ready workers), crew (the "
                        "same queue with CREW's failure rules: a lost member's task abandoned, a lost aggregator's "
                        "block moved), selective "
                        "(selective reduce: groups of > --group ready workers by bandwidth, waiting for faster ones; "
                        "bandwidths from the node caps, e.g. --topology switch:N:unit=U), mcast-bsp and mcast-ssp "
                        "(multicasts to the receivers --select picks: SelMcast)")
    r.add_argument("--staleness", type=int, default=2, metavar="S", help="SSP's bound s (default 2)")
    r.add_argument("--group", type=int, default=2, metavar="P", help="ready queue: workers per reduce (default 2)")
    sm = r.add_argument_group("SelMcast (--progress mcast-bsp, mcast-ssp)")
    sm.add_argument("--select", choices=("selmcast", "orpheus", "all"), default="selmcast",
                    help="who picks each multicast's receivers (default selmcast)")
    sm.add_argument("--min-receivers", type=int, default=None, metavar="P", help="p (default 0.3 x workers)")
    sm.add_argument("--sync-every", default="4", metavar="K",
                    help="consistency bound k: every pair at least once in k + 1 rounds; 'none': off (default 4)")
    sm.add_argument("--eta", type=float, default=0.75, help="SSP stickiness (default 0.75)")
    sm.add_argument("--caps-from", choices=("declared", "measured"), default="declared",
                    help="the ports' bandwidth: as nodes declare it (default) or as the view measured it")
    r.add_argument("--hub", type=int, default=None, help="star/ktree root (default: best measured node)")
    r.add_argument("--k", type=int, default=2, help="ktree fan-out (default 2)")
    r.add_argument("--chunk", default=None, metavar="SIZE", help=CHUNK_HELP)
    r.add_argument("--out", type=Path, default=None, help="JSON-lines results file")
    r.add_argument("--heartbeat-timeout", type=float, default=1.5, metavar="S",
                   help="declare an agent lost after S seconds without a heartbeat (default 1.5; a killed "
                        "agent is noticed at once, a frozen or cut-off one after S)")
    _tls_args(r)
    r.add_argument("--hold-budget-mb", type=float, default=None, metavar="MB",
                   help="every agent's memory for frames of rounds after its current one (agent default 256)")
    r.add_argument("--agent-gc", choices=gcpolicy.POLICIES, default="tuned",
                   help="every agent's garbage-collector policy (agent --gc; default tuned)")
    r.add_argument("--fault", action="append", default=[], metavar="SPEC",
                   help="inject a fault (repeatable): KIND:WHAT@WHEN, e.g. 'kill:node=3@t=20', "
                        "'blackhole:link=2-5@round=3,for=10', 'collapse:link=0-1,factor=7@t=2,for=5' "
                        "(kinds: kill, freeze, down, blackhole, collapse)")
    r.add_argument("--scenario", type=Path, default=None, metavar="FILE",
                   help="TOML file of [[faults]] tables with the fields of --fault")
    r.add_argument("--http", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="serve the live dashboard, JSON API and /metrics here (default 127.0.0.1:0, a free port)")
    r.add_argument("--no-http", action="store_true", help="no dashboard, API or metrics server")


def _netstorm_options(r: argparse.ArgumentParser) -> None:
    ns = r.add_argument_group("NetStorm (schemes netstorm, netstorm-std, netstorm-lite)")
    ns.add_argument("--roots", type=int, default=None, help="number of roots N (default: all nodes)")
    ns.add_argument("--aux-mode", choices=("global_prune", "per_pair_disjoint"), default="global_prune")
    ns.add_argument("--netstorm-reroot", action="store_true", help="let roots and shares move on later plans")
    ns.add_argument("--both-directions", action="store_true", help="weigh tree edges by push and pull delay")
    ns.add_argument("--update-time", type=float, default=5.0,
                    help="UPDATE_TIME: re-plan at most this often, seconds at full scale (default 5)")
    ns.add_argument("--update-rate", type=float, default=0.1,
                    help="UPDATE_RATE: re-plan only if a link's rate moved by more than this (default 0.1)")
    ns.add_argument("--primary-busy-bound", type=int, default=2)
    ns.add_argument("--aux-queue-length", type=int, default=5)
    ns.add_argument("--probe-num", type=int, default=4, help="PROBE_CHUNK_NUM: probes per estimate")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before the work began (imports, options): no traceback either
        return 130
    except Stopped as exc:  # SIGTERM or Ctrl-C during the work, which unwound (wansync/stopping.py)
        return exc.code


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="wansync", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="local cluster: a scheduler and one agent process per node, every scheme")
    _common(r)
    _run_options(r)
    r.add_argument("--secret-file", type=Path, default=None, metavar="FILE",
                   help="use this cluster secret (>= 16 bytes; chmod 600) instead of a fresh one per run, so a "
                        "tool outside the launcher can authenticate to the scheduler and agents")
    r.add_argument("--backend", choices=("app", "tc"), default="app",
                   help="who shapes links: app (token buckets in the agents, default) or tc (the kernel: one "
                        "network namespace per node, veth + htb per link; root only)")
    _netstorm_options(r)

    sc = sub.add_parser("scheduler", help="the scheduler alone, for agents started elsewhere (real hosts): "
                                          "waits for every node, runs every scheme, records, prints")
    _common(sc)
    _run_options(sc)
    sc.add_argument("--listen", default="0.0.0.0:7070", metavar="HOST:PORT",
                    help="control port agents dial (default 0.0.0.0:7070)")
    sc.add_argument("--cluster", default="wansync", help="cluster id agents give (--cluster; default wansync)")
    sc.add_argument("--secret-file", type=Path, default=None, metavar="FILE",
                    help="cluster secret (>= 16 bytes; chmod 600; default: $WANSYNC_SECRET)")
    sc.add_argument("--insecure", action="store_true",
                    help="no cluster secret: anyone who can reach the port may join (trusted networks only)")
    sc.add_argument("--register-timeout", type=float, default=300.0, metavar="S",
                    help="give up if not every node registered within S seconds (default 300)")
    sc.add_argument("--control-lines", action="store_true", help=argparse.SUPPRESS)  # wansync deploy's channel
    _netstorm_options(sc)

    from .deploy import add_parser as add_deploy_parser

    add_deploy_parser(sub, _common, _run_options, _netstorm_options)

    a = sub.add_parser("agent", help="one node (started by `run`, or by hand on a real host)")
    _common(a)
    a.add_argument("--node", type=int, required=True)
    a.add_argument("--scheduler", required=True, help="HOST:PORT of the scheduler")
    a.add_argument("--cluster", required=True, help="cluster id (must match the scheduler's)")
    a.add_argument("--listen", default="127.0.0.1:0", help="data-plane HOST:PORT (default 127.0.0.1:0)")
    a.add_argument("--advertise", default=None, metavar="HOST:PORT",
                   help="the address peers dial, registered with the scheduler (default: --listen's); behind "
                        "NAT (cloud VMs) the public address, with --listen 0.0.0.0:PORT; port 0: --listen's")
    a.add_argument("--no-shaping", action="store_true", help="real WAN: do not emulate link rates or delays")
    a.add_argument("--delay-only", action="store_true",
                   help="the kernel shapes rates (tc backend): emulate only link delay and jitter, ignore the trace")
    a.add_argument("--primary-busy-bound", type=int, default=2, help="PRIMARY_BUSY_BOUND (chunks in transit)")
    a.add_argument("--aux-queue-length", type=int, default=5, help="AUXILIARY_QUEUE_LENGTH")
    a.add_argument("--probe-num", type=int, default=4, help="PROBE_CHUNK_NUM")
    a.add_argument("--probe-bytes", type=int, default=None,
                   help="PROBE_CHUNK_SIZE in bytes (default 2 MB x --scale)")
    a.add_argument("--secret-file", default=None, metavar="FILE",
                   help="cluster secret (>= 16 bytes; default: $WANSYNC_SECRET); neighbours and the scheduler "
                        "must prove they hold it (HMAC challenge-response both ways)")
    a.add_argument("--insecure", action="store_true",
                   help="run without a cluster secret: anyone who can reach the ports may join (trusted networks)")
    a.add_argument("--scheduler-wait", type=float, default=30.0, metavar="S",
                   help="if the scheduler goes away, wait this long for it to come back and register again "
                        "(default 30)")
    a.add_argument("--hold-budget-mb", type=float, default=256.0,
                   help="memory for frames of rounds after the current one (default 256); over it they are "
                        "refused unacknowledged and resent when their round begins")
    a.add_argument("--gc", choices=gcpolicy.POLICIES, default="tuned",
                   help="garbage collector: tuned (default: startup objects frozen, young generation collected "
                        "every 10,000 allocations; fewer event-loop stalls under load) or Python's default")
    _tls_args(a)

    e = sub.add_parser("emu", help="kernel emulation housekeeping (tc backend)")
    e.add_argument("action", choices=("clean", "status"),
                   help="clean: remove namespaces and links of runs whose launcher is gone; status: list them")
    e.add_argument("--force", action="store_true", help="clean: also runs whose launcher is still alive")
    e.add_argument("-v", "--verbose", action="store_true")

    pl = sub.add_parser("plot", help="PNG figures from a results file: round times, link throughput, speedup")
    pl.add_argument("results", type=Path, help="JSON-lines results file of `wansync run --out`")
    pl.add_argument("--out-dir", type=Path, default=None, help="where the PNGs go (default: beside the results)")
    pl.add_argument("-v", "--verbose", action="store_true")

    m = sub.add_parser("simulate", help="predict round times and link loads with the flow-level simulator")
    _common(m)
    m.set_defaults(scale=1.0)
    m.add_argument("--schemes", default=DEFAULT_SCHEMES, help=f"comma-separated (default {DEFAULT_SCHEMES})")
    m.add_argument("--model", default="alexnet", help="model name or parameter count (default alexnet)")
    m.add_argument("--chunk", default=None, metavar="SIZE", help=CHUNK_HELP)
    m.add_argument("--hub", type=int, default=None)
    m.add_argument("--k", type=int, default=2)
    m.add_argument("--costs", choices=("agents", "none"), default="agents",
                   help="agents (default): our data plane's per-chunk costs (sim/costs.py); none: links alone "
                        "(GPU clusters, whose endpoints are not our agents)")

    args = ap.parse_args(argv)
    # Ctrl-C must reach us (and so reap the agents) even if a shell started us with SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.cmd == "run":
            return _run(args)
        if args.cmd == "agent":
            return _agent(args)
        if args.cmd == "scheduler":
            return _scheduler(args)
        if args.cmd == "deploy":
            from .deploy import main as deploy_main

            return deploy_main(args)
        if args.cmd == "simulate":
            return _simulate(args)
        if args.cmd == "emu":
            return _emu(args)
        if args.cmd == "plot":
            return _plot(args)
    except (TopologyError, TraceError, FaultError) as exc:
        print(f"wansync: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Stopped) as exc:
        if args.cmd != "agent":  # a terminal's Ctrl-C reaches every agent too: only the launcher speaks
            print("wansync: interrupted" if isinstance(exc, KeyboardInterrupt) else f"wansync: {exc}",
                  file=sys.stderr)
        return exc.code if isinstance(exc, Stopped) else 130
    return 2


def run_config(args: argparse.Namespace, *, backend: str = "app", secret: bytes | None = None) -> RunConfig:
    """The RunConfig of `run`, `scheduler` and `deploy` from their shared options, checked before
    anything starts (SystemExit with one line on what is wrong)."""
    from scheduler import planners

    from .cluster import RunConfig

    chosen = args.schemes or (SSP_SCHEMES if args.progress in ("ssp", *MCAST_PROGRESS) else DEFAULT_SCHEMES)
    schemes = [s.strip() for s in chosen.split(",") if s.strip()]
    for s in schemes:
        planners.resolve(s)
    if args.rounds < 1:
        raise SystemExit("wansync: --rounds must be >= 1")
    if args.hold_budget_mb is not None and not args.hold_budget_mb > 0:
        raise SystemExit("wansync: --hold-budget-mb must be > 0")
    chunk = _chunk_arg(args)
    topo = _topology(args)
    compute_model = _compute_model(args, schemes)
    cfg = RunConfig(topology=args.topology, topo=topo, schemes=schemes, model=args.model, scale=args.scale,
                    backend=backend,
                    rounds=args.rounds, seed=args.seed, out=args.out, loop=args.loop, compute_s=args.compute,
                    compute_model=compute_model, progress=args.progress, staleness=args.staleness, group=args.group,
                    progress_options=_mcast_options(args),
                    warmup=args.warmup, hub=args.hub, k=args.k, dynamic=args.dynamic, period_s=args.period,
                    trace=_trace(args, topo), update_time_s=args.update_time, update_rate=args.update_rate,
                    heartbeat_timeout=args.heartbeat_timeout,
                    primary_busy_bound=args.primary_busy_bound, aux_queue_length=args.aux_queue_length,
                    probe_num=args.probe_num, http=_http_arg(args), faults=_faults(args, topo),
                    chunk_override=chunk, hold_budget_mb=args.hold_budget_mb, agent_gc=args.agent_gc, secret=secret,
                    secret_file=args.secret_file,
                    options={k: v for k, v in (("roots", args.roots), ("aux_mode", args.aux_mode),
                                               ("reroot", args.netstorm_reroot),
                                               ("both_directions", args.both_directions)) if v})
    cfg.params  # noqa: B018 - validates --model early
    from overlay.auth import SecretError, TlsFiles

    try:
        cfg.tls = TlsFiles.from_args(args.tls_cert, args.tls_key, args.tls_ca)
    except SecretError as exc:
        raise SystemExit(f"wansync: {exc}") from None
    return cfg


def _run(args: argparse.Namespace) -> int:
    from .cluster import run, set_loop

    secret = None
    if args.secret_file is not None:
        from overlay.auth import SecretError, load_secret

        try:  # >= 16 bytes; a warning if group or others may read it
            secret = load_secret(args.secret_file)
        except SecretError as exc:
            raise SystemExit(f"wansync: {exc}") from None
    if args.backend == "tc":
        from emulation.tc import unavailable

        if reason := unavailable():
            print(f"wansync: --backend tc unavailable here: {reason}", file=sys.stderr)
            return 2
    # the cluster secret itself is generated per run (wansync/cluster.py) unless --secret-file
    cfg = run_config(args, backend=args.backend, secret=secret)
    set_loop(args.loop)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    jobs = asyncio.run(until_signal(run(cfg)))
    return _exit_code(jobs)


def _exit_code(jobs: list) -> int:
    exact = all(r.ok and r.digests_agree and r.versions_agree for js in jobs for r in js.records)
    if not exact:
        print("wansync: some rounds did not end with the exact sum (see the results file)", file=sys.stderr)
    return 0 if exact else 1


def _scheduler(args: argparse.Namespace) -> int:
    """`wansync scheduler`: the composition of `run`, with agents that register from elsewhere."""
    from rich.console import Console

    from scheduler.http import parse_hostport

    from .cluster import ExternalAgents, Session, conduct, control_line, set_loop

    secret, _tls = _security(args)
    cfg = run_config(args, secret=secret)
    try:
        host, port = parse_hostport(args.listen)
    except ValueError as exc:
        raise SystemExit(f"wansync: --listen: {exc}") from None
    set_loop(args.loop)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    console = Console(stderr=True)
    agents = ExternalAgents(control_lines=args.control_lines)

    def listening(p: int) -> None:
        console.print(f"scheduler: cluster {args.cluster}, control port {host}:{p}, waiting for {cfg.topo.nodes} "
                      "agents", highlight=False, soft_wrap=True)
        if args.control_lines:  # wansync deploy starts the agents once it knows
            control_line(listening=p)

    session = Session(args.cluster, secret, agents, agents.backend(), host=host, port=port,
                      register_timeout_s=args.register_timeout, on_listening=listening,
                      on_dashboard=(lambda url: control_line(dashboard=url)) if args.control_lines else None)
    try:
        jobs = asyncio.run(until_signal(conduct(cfg, session, console)))
    except OSError as exc:  # the control port: in use, or an address this host does not have
        print(f"wansync: scheduler cannot listen on {args.listen}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except TimeoutError as exc:
        print(f"wansync: {exc}", file=sys.stderr)
        return 1
    return _exit_code(jobs)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C: agents are reaped and tc namespaces removed on the way out."""
    raise SystemExit(128 + signum)


def _emu(args: argparse.Namespace) -> int:
    """`wansync emu clean|status`: leftovers of tc runs (a run killed by SIGKILL cannot tidy up)."""
    from emulation import tc

    if args.action == "status":
        for prefix, names in sorted(tc.leftovers().items()):
            print(f"{prefix}: {len(names)} namespaces/links, launcher {'alive' if tc.owner_alive(prefix) else 'gone'}")
        return 0
    if os.geteuid() != 0:
        print("wansync: emu clean needs root", file=sys.stderr)
        return 2
    done = tc.clean(force=args.force)
    for prefix, names in sorted(done.items()):
        print(f"removed run {prefix}: {len(names)} namespaces/links")
    kept = sorted(set(tc.leftovers()) - set(done))
    if kept:
        print(f"kept live runs: {', '.join(kept)} (--force removes them too)")
    if not done and not kept:
        print("nothing to clean")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    import time

    from rich.console import Console
    from rich.table import Table

    from agents.workload import chunk_params, model_params

    from .planinfo import info_line
    from .predict import predict

    t0 = time.perf_counter()
    topo = _topology(args)
    params = model_params(args.model, args.scale)
    chunk = _chunk_arg(args) or chunk_params(args.scale)
    options: dict = {"k": args.k} | ({} if args.hub is None else {"hub": args.hub})
    schemes = [x.strip() for x in args.schemes.split(",") if x.strip()]
    from sim import MEASURED, NONE

    preds = predict(topo, _trace(args, topo), schemes, params, chunk, options,
                    costs=MEASURED if args.costs == "agents" else NONE)
    t = Table(title=f"predicted on {topo.name} ({topo.nodes} nodes, {len(topo.links)} directed links), "
                    f"{args.model} x{args.scale} = {params * 4 / 1e6:.1f} MB, planners on the configured rates")
    for col in ("scheme", "round s", "algbw MB/s", "busiest links (MB)", "engine", "plan s", "simulate s"):
        t.add_column(col)
    for p in preds:
        busiest = sorted(p.prediction.link_bytes.items(), key=lambda kv: -kv[1])[:3]
        t.add_row(p.scheme, f"{p.prediction.round_s:.3f}", f"{params * 4 / p.prediction.round_s / 1e6:.2f}",
                  ", ".join(f"{a}->{b} {n / 1e6:.1f}" for (a, b), n in busiest), p.prediction.mode,
                  f"{p.plan_s:.3f}", f"{p.simulate_s:.3f}")
    Console(width=150).print(t)
    for p in preds:
        if line := info_line(p.scheme, p.plan.info):
            print(line)
    print(f"total {time.perf_counter() - t0:.2f} s")
    return 0


def _agent(args: argparse.Namespace) -> int:
    from agents.agent import PROBE_CHUNK_BYTES, Agent

    from .cluster import set_loop

    topo = _topology(args)
    if not 0 <= args.node < topo.nodes:
        print(f"wansync: --node {args.node} outside 0..{topo.nodes - 1}", file=sys.stderr)
        return 2
    host, _, port = args.scheduler.rpartition(":")
    lhost, _, lport = args.listen.rpartition(":")
    set_loop(args.loop)
    probe_bytes = args.probe_bytes if args.probe_bytes is not None else int(PROBE_CHUNK_BYTES * args.scale)
    secret, tls = _security(args)
    advertise = None
    if args.advertise is not None:
        ahost, sep, aport = args.advertise.rpartition(":")
        if not sep or not ahost or not aport.isdigit() or not 0 <= int(aport) < 65536:
            print(f"wansync: --advertise {args.advertise!r}: expected HOST:PORT", file=sys.stderr)
            return 2
        advertise = (ahost.strip("[]"), int(aport))
    agent = Agent(args.node, args.cluster, (host, int(port)), topo, trace=_trace(args, topo),
                  shaped=not args.no_shaping, host=lhost or "127.0.0.1", listen_port=int(lport or 0),
                  rate_shaping=not args.delay_only,
                  probe_bytes=probe_bytes, probe_num=args.probe_num, primary_busy_bound=args.primary_busy_bound,
                  aux_queue_length=args.aux_queue_length, secret=secret, tls=tls,
                  hold_budget=int(args.hold_budget_mb * (1 << 20)), scheduler_wait_s=args.scheduler_wait,
                  advertise=advertise)
    gcpolicy.apply(args.gc)  # the agent is built: what exists now lives as long as the process
    try:
        asyncio.run(until_signal(agent.run()))
    except ConnectionError as exc:  # refused, unauthenticated, or no scheduler: one line on why
        print(f"wansync: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the data port: in use, or an address this host does not have
        print(f"wansync: node {args.node}: cannot listen on {args.listen}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _chunk_arg(args: argparse.Namespace) -> int | None:
    """--chunk in parameters (None: the scaled default); a clear error for a malformed size."""
    from .cluster import parse_chunk

    if args.chunk is None:
        return None
    try:
        return parse_chunk(args.chunk)
    except ValueError as exc:
        raise SystemExit(f"wansync: {exc}") from None


def _http_arg(args: argparse.Namespace) -> str | None:
    """--http HOST:PORT checked before any process starts; None with --no-http."""
    from scheduler.http import parse_hostport

    if args.no_http:
        return None
    try:
        parse_hostport(args.http)
    except ValueError as exc:
        raise SystemExit(f"wansync: --http: {exc}") from None
    return args.http


def _plot(args: argparse.Namespace) -> int:
    from .plot import PlotError, plot

    try:
        written, skipped = plot(args.results, args.out_dir)
    except PlotError as exc:
        print(f"wansync plot: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    for why in skipped:
        print(f"wansync plot: skipped {why}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
