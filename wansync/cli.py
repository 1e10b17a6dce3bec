"""The `wansync` command line: run, agent, simulate."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from emulation.topology import Topology, TopologyError, build

DEFAULT_SCHEMES = "star,ring,mst,ktree"
TRACE_HORIZON_S = 6 * 3600.0


def _topology(args: argparse.Namespace) -> Topology:
    topo = build(args.topology, args.nodes, seed=args.seed)
    return topo.scaled(args.scale)


def _trace(args: argparse.Namespace, topo: Topology):  # noqa: ANN202
    from emulation.trace import Trace, redraw

    if not getattr(args, "dynamic", False):
        return Trace()
    return redraw(topo.links, args.period, TRACE_HORIZON_S, seed=args.seed).scaled(args.scale)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", default="internet2",
                   help="internet2 | uniform[:Mbps] | hetero[:lo-hi] | FILE.toml/.json (default internet2)")
    p.add_argument("--nodes", type=int, default=None, help="cluster size (full-mesh topologies; default 9)")
    p.add_argument("--seed", type=int, default=1, help="seed of rate draws and traces")
    p.add_argument("--scale", type=float, default=0.05,
                   help="shrinks model bytes, chunk size, link delays and trace periods together (default 0.05)")
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                   help="event loop (default asyncio: as fast as uvloop on one link here, half its CPU when shaping)")
    p.add_argument("--dynamic", action="store_true", help="redraw every directed link's rate every --period s")
    p.add_argument("--period", type=float, default=180.0, help="redraw period at full scale (default 180 s)")
    p.add_argument("-v", "--verbose", action="store_true")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="wansync", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="local cluster: a scheduler and one agent process per node, every scheme")
    _common(r)
    r.add_argument("--schemes", default=DEFAULT_SCHEMES, help=f"comma-separated (default {DEFAULT_SCHEMES})")
    r.add_argument("--model", default="resnet50", help="model name or parameter count (default resnet50)")
    r.add_argument("--rounds", type=int, default=5, help="measured rounds per scheme (default 5)")
    r.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first, to learn the network (default 1)")
    r.add_argument("--compute", type=float, default=0.0, help="compute seconds per round (default 0)")
    r.add_argument("--hub", type=int, default=None, help="star/ktree root (default: best measured node)")
    r.add_argument("--k", type=int, default=2, help="ktree fan-out (default 2)")
    r.add_argument("--out", type=Path, default=None, help="JSON-lines results file")
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

    a = sub.add_parser("agent", help="one node (started by `run`, or by hand on a real host)")
    _common(a)
    a.add_argument("--node", type=int, required=True)
    a.add_argument("--scheduler", required=True, help="HOST:PORT of the scheduler")
    a.add_argument("--cluster", required=True, help="cluster id (must match the scheduler's)")
    a.add_argument("--listen", default="127.0.0.1:0", help="data-plane HOST:PORT (default 127.0.0.1:0)")
    a.add_argument("--no-shaping", action="store_true", help="real WAN: do not emulate link rates or delays")
    a.add_argument("--primary-busy-bound", type=int, default=2, help="PRIMARY_BUSY_BOUND (chunks in transit)")
    a.add_argument("--aux-queue-length", type=int, default=5, help="AUXILIARY_QUEUE_LENGTH")
    a.add_argument("--probe-num", type=int, default=4, help="PROBE_CHUNK_NUM")
    a.add_argument("--probe-bytes", type=int, default=None,
                   help="PROBE_CHUNK_SIZE in bytes (default 2 MB x --scale)")

    m = sub.add_parser("simulate", help="predict round times and link loads with the flow-level simulator")
    _common(m)
    m.set_defaults(scale=1.0)
    m.add_argument("--schemes", default=DEFAULT_SCHEMES, help=f"comma-separated (default {DEFAULT_SCHEMES})")
    m.add_argument("--model", default="alexnet", help="model name or parameter count (default alexnet)")
    m.add_argument("--hub", type=int, default=None)
    m.add_argument("--k", type=int, default=2)

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
        if args.cmd == "simulate":
            return _simulate(args)
    except TopologyError as exc:
        print(f"wansync: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.cmd != "agent":  # a terminal's Ctrl-C reaches every agent too: only the launcher speaks
            print("wansync: interrupted", file=sys.stderr)
        return 130
    return 2


def _run(args: argparse.Namespace) -> int:
    from scheduler import planners

    from .cluster import RunConfig, run, set_loop

    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    for s in schemes:
        planners.resolve(s)
    if args.rounds < 1:
        raise SystemExit("wansync: --rounds must be >= 1")
    topo = _topology(args)
    cfg = RunConfig(topology=args.topology, topo=topo, schemes=schemes, model=args.model, scale=args.scale,
                    rounds=args.rounds, seed=args.seed, out=args.out, loop=args.loop, compute_s=args.compute,
                    warmup=args.warmup, hub=args.hub, k=args.k, dynamic=args.dynamic, period_s=args.period,
                    trace=_trace(args, topo), update_time_s=args.update_time, update_rate=args.update_rate,
                    primary_busy_bound=args.primary_busy_bound, aux_queue_length=args.aux_queue_length,
                    probe_num=args.probe_num,
                    options={k: v for k, v in (("roots", args.roots), ("aux_mode", args.aux_mode),
                                               ("reroot", args.netstorm_reroot),
                                               ("both_directions", args.both_directions)) if v})
    cfg.params  # noqa: B018 - validates --model early
    set_loop(args.loop)
    jobs = asyncio.run(run(cfg))
    exact = all(r.ok and r.digests_agree and r.versions_agree for js in jobs for r in js.records)
    if not exact:
        print("wansync: some rounds did not end with the exact sum (see the results file)", file=sys.stderr)
    return 0 if exact else 1


def _simulate(args: argparse.Namespace) -> int:
    import time

    from rich.console import Console
    from rich.table import Table

    from agents.workload import chunk_params, model_params

    from .predict import predict

    t0 = time.perf_counter()
    topo = _topology(args)
    params, chunk = model_params(args.model, args.scale), chunk_params(args.scale)
    options: dict = {"k": args.k} | ({} if args.hub is None else {"hub": args.hub})
    schemes = [x.strip() for x in args.schemes.split(",") if x.strip()]
    preds = predict(topo, _trace(args, topo), schemes, params, chunk, options)
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
    agent = Agent(args.node, args.cluster, (host, int(port)), topo, trace=_trace(args, topo),
                  shaped=not args.no_shaping, host=lhost or "127.0.0.1", listen_port=int(lport or 0),
                  probe_bytes=probe_bytes, probe_num=args.probe_num, primary_busy_bound=args.primary_busy_bound,
                  aux_queue_length=args.aux_queue_length)
    asyncio.run(agent.run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
