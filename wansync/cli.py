"""The `wansync` command line: run, scheduler, agent, deploy, simulate, plot, emu.

Every run option is declared once in wansync.options and becomes a flag of the commands that offer
it; each command turns its flags (or its --options file) into one `Options`, validated once. Only
what is a process's own (an agent's node id, the addresses it listens on) stays a plain flag here.
The agent's path imports neither the scheduler nor the simulator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from .options import (
    ADVISE,
    AGENT,
    DEPLOY,
    RUN,
    SCHEDULER,
    SIMULATE,
    TRAIN,
    Options,
    OptionsError,
    add_arguments,
    options_from,
)
from .stopping import Stopped, until_signal

DEPLOY_OUT_HELP = "results directory: results.jsonl and logs/ (default ./wansync-deploy-DATE-TIME)"


class CliError(Exception):
    """One line on what is wrong; exit status 2 (usage) or 1 (could not run)."""

    def __init__(self, msg: str, status: int = 2) -> None:
        super().__init__(msg)
        self.status = status


def parser() -> argparse.ArgumentParser:
    # no abbreviations: a script's `--mode` must reach the script, not become wansync's `--model`
    ap = argparse.ArgumentParser(prog="wansync", description=__doc__.split("\n")[0], allow_abbrev=False)
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="local cluster: a scheduler and one agent process per node, every scheme")
    add_arguments(r, RUN)
    _verbose(r)

    t = sub.add_parser("train", help="your own training script (wansync.torch) once per node beside its agent, "
                                     "under every scheme; time to accuracy against plain DDP on the same WAN")
    t.add_argument("script_path", metavar="SCRIPT", help="the training script (python); arguments wansync does not "
                   "know are the script's (everything after `--` is)")
    add_arguments(t, TRAIN)
    _verbose(t)

    sc = sub.add_parser("scheduler", help="the scheduler alone, for agents started elsewhere (real hosts): "
                                          "waits for every node, runs every scheme, records, prints")
    add_arguments(sc, SCHEDULER)
    sc.add_argument("--listen", default="0.0.0.0:7070", metavar="HOST:PORT",
                    help="control port agents dial (default 0.0.0.0:7070)")
    sc.add_argument("--control-lines", action="store_true", help=argparse.SUPPRESS)  # wansync deploy's channel
    _verbose(sc)

    d = sub.add_parser("deploy", help="the same run on real machines over SSH: install, start, shape, collect, "
                                      "clean up")
    add_arguments(d, DEPLOY, overrides={"--out": DEPLOY_OUT_HELP})
    from .inventory import add_host_arguments

    add_host_arguments(d)
    _verbose(d)

    a = sub.add_parser("agent", help="one node (started by `run`, or by hand on a real host)")
    add_arguments(a, AGENT)
    own = a.add_argument_group("this agent")
    own.add_argument("--node", type=int, required=True)
    own.add_argument("--scheduler", required=True, help="HOST:PORT of the scheduler")
    own.add_argument("--listen", default="127.0.0.1:0", help="data-plane HOST:PORT (default 127.0.0.1:0)")
    own.add_argument("--advertise", default=None, metavar="HOST:PORT",
                     help="the address peers dial, registered with the scheduler (default: --listen's); behind "
                          "NAT (cloud VMs) the public address, with --listen 0.0.0.0:PORT; port 0: --listen's")
    _verbose(a)

    e = sub.add_parser("emu", help="kernel emulation housekeeping (tc backend)")
    e.add_argument("action", choices=("clean", "status"),
                   help="clean: remove namespaces and links of runs whose launcher is gone; status: list them")
    e.add_argument("--force", action="store_true", help="clean: also runs whose launcher is still alive")
    _verbose(e)

    pl = sub.add_parser("plot", help="PNG figures from a results file: round times, link throughput, speedup")
    pl.add_argument("results", type=Path, help="JSON-lines results file of `wansync run --out`")
    pl.add_argument("--out-dir", type=Path, default=None, help="where the PNGs go (default: beside the results)")
    _verbose(pl)

    m = sub.add_parser("simulate", help="predict round times and link loads with the flow-level simulator")
    add_arguments(m, SIMULATE)
    m.add_argument("--costs", choices=("agents", "none"), default="agents",
                   help="agents (default): our data plane's per-chunk costs (sim/costs.py); none: links alone "
                        "(GPU clusters, whose endpoints are not our agents)")
    _verbose(m)

    adv = sub.add_parser("advise", help="rank the schemes auto chooses among on a WAN, with predicted round times "
                                        "and the LP bound, without agents")
    add_arguments(adv, ADVISE)
    adv.add_argument("--from", dest="from_url", default=None, metavar="URL",
                     help="a running cluster's dashboard (http://HOST:PORT): advise on the view it measured, "
                          "not on --topology")
    adv.add_argument("--costs", choices=("agents", "none"), default="agents",
                     help="agents (default): our data plane's per-chunk costs; none: links alone (GPU clusters)")
    adv.add_argument("--cpus", type=int, default=None, metavar="N",
                     help="the agents share one machine with N CPUs, as in `wansync run` (packing and BLINK then "
                          "cut chunks that machine handles); default: agents on hosts of their own")
    adv.add_argument("--json", action="store_true", help="print the ranking as one JSON object")
    _verbose(adv)

    rp = sub.add_parser("reproduce", help="a paper's experiments over seeds: raw runs as JSON lines, summaries with "
                                          "intervals, figures (docs/reproduce.md)")
    rp.add_argument("paper", choices=("netstorm", "packing", "selmcast", "selective", "crew"))
    rp.add_argument("--quick", action="store_true", help="the short campaign: fewer cells, smaller settings")
    rp.add_argument("--seeds", type=int, default=None, help="seeds per cell (default 10; --quick 3)")
    rp.add_argument("--out", type=Path, default=None, help="results directory (default ./wansync-reproduce-PAPER); "
                                                           "runs already in its runs.jsonl are not run again")
    rp.add_argument("--only", default=None, metavar="EXP,...", help="only these experiments")
    _verbose(rp)
    for p in sub.choices.values():  # read at parse time: no subcommand takes an abbreviation either
        p.allow_abbrev = False
    return ap


def _reproduce(args: argparse.Namespace) -> int:
    from .reproduce.runner import main as reproduce_main

    return reproduce_main(args)


def _verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before the work began (imports, options): no traceback either
        return 130
    except Stopped as exc:  # SIGTERM or Ctrl-C during the work, which unwound (wansync/stopping.py)
        return exc.code


def _main(argv: list[str] | None = None) -> int:
    ap = parser()
    args, rest = ap.parse_known_args(argv)
    if args.cmd == "train":  # what wansync does not know is the script's (after `--`, all of it is)
        args.script_args = [a for a in rest if a != "--"] if rest[:1] != ["--"] else rest[1:]
    elif args.cmd == "deploy" and getattr(args, "train_script", None) is not None:  # the same for deploy --train
        args.script_arg = [*getattr(args, "script_arg", []), *(rest[1:] if rest[:1] == ["--"] else
                                                                [a for a in rest if a != "--"])]
    elif rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    # Ctrl-C must reach us (and so reap the agents) even if a shell started us with SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    commands = {"train": _train, "run": _run, "agent": _agent, "scheduler": _scheduler, "deploy": _deploy,
                "simulate": _simulate, "advise": _advise, "emu": _emu, "plot": _plot,
                "reproduce": _reproduce}
    try:
        return commands[args.cmd](args)
    except (OptionsError, CliError) as exc:
        print(f"wansync{'' if args.cmd in ('run', 'agent', 'scheduler') else ' ' + args.cmd}: {exc}",
              file=sys.stderr)
        return getattr(exc, "status", 2)
    except (KeyboardInterrupt, Stopped) as exc:
        if args.cmd != "agent":  # a terminal's Ctrl-C reaches every agent too: only the launcher speaks
            print("wansync: interrupted" if isinstance(exc, KeyboardInterrupt) else f"wansync: {exc}",
                  file=sys.stderr)
        return exc.code if isinstance(exc, Stopped) else 130


def _secret(options: Options, *, from_env: bool) -> bytes | None:
    """The cluster secret: --secret-file's, or (scheduler, agent) $WANSYNC_SECRET; a node never runs
    open to strangers by accident (no secret needs --insecure)."""
    from overlay.auth import SECRET_ENV, SecretError, load_secret

    path = options.security["secret_file"]
    try:
        secret = load_secret(path, env=None if from_env else {})
    except SecretError as exc:
        raise CliError(str(exc)) from None
    if from_env and secret is None and not options.security["insecure"]:
        raise CliError(f"no cluster secret: give --secret-file FILE or set ${SECRET_ENV} "
                       "(or --insecure, on a trusted network only)")
    if from_env and secret is not None and options.security["insecure"]:
        raise CliError("--insecure given, but a cluster secret is configured too")
    return secret


def _local_run(options: Options) -> Any:
    """What `run` and `train` do before they start anything here: the kernel backend is usable, the
    run resolves (the cluster secret itself is generated per run unless --secret-file), the loop is
    chosen and SIGTERM unwinds."""
    from .loops import set_loop
    from .runspec import resolve

    if options.wan["backend"] == "tc":
        from emulation.tc import unavailable

        if reason := unavailable():
            raise CliError(f"--backend tc unavailable here: {reason}")
    cfg = resolve(options, secret=_secret(options, from_env=False))
    set_loop(options.agents["loop"], options.wan["backend"])
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return cfg


def _run(args: argparse.Namespace) -> int:
    from .cluster import run

    cfg = _local_run(options_from(args))
    jobs = asyncio.run(until_signal(run(cfg)))
    return _exit_code(jobs)


def _train(args: argparse.Namespace) -> int:
    from .train import TrainError, train

    options = options_from(args)
    options = options.replace(train__script=args.script_path,
                              train__args=[*options.train["args"], *args.script_args])
    if not Path(options.train["script"]).is_file():
        raise CliError(f"no such script: {options.train['script']}")
    if options.train["baseline"] is not None and options.wan["backend"] != "tc":
        raise CliError("--baseline ddp needs --backend tc: on the application backend nothing shapes Gloo's bytes, "
                       "so the comparison would not be on the same WAN")
    cfg = _local_run(options)
    try:
        runs = asyncio.run(until_signal(train(cfg)))
    except TrainError as exc:
        raise CliError(str(exc), 1) from None
    wrong = sum(r.syncs_wrong for r in runs)
    if wrong:
        print(f"wansync train: {wrong} syncs did not check out (see the results file)", file=sys.stderr)
    return 1 if wrong else 0


def _exit_code(jobs: list) -> int:
    exact = all(r.ok and r.digests_agree and r.versions_agree for js in jobs for r in js.records)
    if not exact:
        print("wansync: some rounds did not end with the exact sum (see the results file)", file=sys.stderr)
    return 0 if exact else 1


def _scheduler(args: argparse.Namespace) -> int:
    """`wansync scheduler`: the composition of `run`, with agents that register from elsewhere."""
    from rich.console import Console

    from scheduler.http import parse_hostport

    from .cluster import ExternalAgents, Session, conduct, control_line
    from .loops import set_loop
    from .runspec import resolve

    options = options_from(args)
    secret = _secret(options, from_env=True)
    cfg = resolve(options, secret=secret)
    try:
        host, port = parse_hostport(args.listen)
    except ValueError as exc:
        raise CliError(f"--listen: {exc}") from None
    set_loop(options.agents["loop"], options.wan["backend"])
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    console = Console(stderr=True)
    agents = ExternalAgents(control_lines=args.control_lines)
    cluster = options.cluster["name"]

    def listening(p: int) -> None:
        console.print(f"scheduler: cluster {cluster}, control port {host}:{p}, waiting for {cfg.topo.nodes} "
                      "agents", highlight=False, soft_wrap=True)
        if args.control_lines:  # wansync deploy starts the agents once it knows
            control_line(listening=p)

    session = Session(cluster, secret, agents, agents.backend(), host=host, port=port,
                      register_timeout_s=options.cluster["register_timeout_s"], on_listening=listening,
                      on_dashboard=(lambda url: control_line(dashboard=url)) if args.control_lines else None)
    try:
        jobs = asyncio.run(until_signal(conduct(cfg, session, console)))
    except OSError as exc:  # the control port: in use, or an address this host does not have
        raise CliError(f"scheduler cannot listen on {args.listen}: {exc.strerror or exc}", 1) from None
    except TimeoutError as exc:
        raise CliError(str(exc), 1) from None
    return _exit_code(jobs)


def _deploy(args: argparse.Namespace) -> int:
    from .deploy import main as deploy_main

    return deploy_main(args, options_from(args))


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

    from sim import MEASURED, NONE

    from .planinfo import info_line
    from .predict import predict
    from .runspec import RunConfig, topology_of, trace_of

    t0 = time.perf_counter()
    base = Options.read(args.options) if args.options else Options.make(wan__scale=1.0, workload__model="alexnet")
    options = Options.from_args(args, base).validate()
    topo = topology_of(options)
    cfg = RunConfig(options, topo)
    params, chunk = cfg.params, cfg.chunk
    preds = predict(topo, trace_of(options, topo), cfg.schemes, params, chunk, options.planner_options(),
                    costs=MEASURED if args.costs == "agents" else NONE)
    model, scale = options.workload["model"], options.wan["scale"]
    t = Table(title=f"predicted on {topo.name} ({topo.nodes} nodes, {len(topo.links)} directed links), "
                    f"{model} x{scale} = {params * 4 / 1e6:.1f} MB, planners on the configured rates")
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


def _advise(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sim import MEASURED, NONE

    from .advise import AdviseError, advise, advise_topology, view_from_api
    from .options import ONE_SOURCE_PROGRESS
    from .runspec import RunConfig, topology_of

    base = Options.read(args.options) if args.options else Options.make(wan__scale=1.0, workload__model="alexnet")
    options = Options.from_args(args, base).validate()
    multicasts = options.progress["model"] in ONE_SOURCE_PROGRESS
    topo = topology_of(options)
    cfg = RunConfig(options, topo)
    kw = {"progress": options.progress["model"], "multicasts": multicasts, "options": options.planner_options(),
          "costs": MEASURED if args.costs == "agents" else NONE, "schemes": options.schemes["schemes"] or None}
    try:
        if args.from_url:
            view, coverage = view_from_api(args.from_url)
            adv = advise(view, cfg.params, cfg.chunk, source=args.from_url, coverage=coverage, **kw)
        else:
            if args.cpus is not None and args.cpus < 1:
                raise CliError(f"--cpus must be at least 1, got {args.cpus}", 2)
            adv = advise_topology(topo, cfg.params, cfg.chunk, cpus=args.cpus, **kw)
    except AdviseError as exc:
        raise CliError(str(exc), 2) from None
    if args.json:
        print(json.dumps(adv.as_json()))
        return 0
    model, scale = options.workload["model"], options.wan["scale"]
    t = Table(title=f"advice for {adv.source} ({adv.nodes} nodes), {model} x{scale} = {adv.params * 4 / 1e6:.1f} MB, "
                    f"--progress {adv.progress}" + (f", view {adv.coverage:.0%} measured" if adv.coverage is not None
                                                    else ""))
    for col in ("rank", "scheme", "round s", "x best", "x T_LP", "algbw MB/s", "plan s", "simulate s", "note"):
        t.add_column(col)
    best = adv.best.round_s if adv.best else None
    for i, c in enumerate(adv.ranked, 1):
        if c.round_s is None:
            t.add_row("-", c.scheme, "-", "-", "-", "-", f"{c.plan_s:.3f}", f"{c.sim_s:.3f}", c.skipped or "")
            continue
        t.add_row(str(i), c.scheme, f"{c.round_s:.3f}", f"{c.round_s / best:.2f}" if best else "-",
                  f"{c.round_s / adv.t_lp_s:.2f}" if adv.t_lp_s else "-", f"{adv.params * 4 / c.round_s / 1e6:.2f}",
                  f"{c.plan_s:.3f}", f"{c.sim_s:.3f}", "")
    Console(width=150).print(t)
    if adv.t_lp_s:
        print(f"T_LP (no reduce can be faster on these rates): {adv.t_lp_s:.3f} s")
    print(f"advice: {adv.best.scheme if adv.best else 'none (no scheme could be planned)'}"
          + (" — what --schemes auto runs once its view knows these rates" if adv.best else ""))
    return 0 if adv.best else 1


def _agent(args: argparse.Namespace) -> int:
    """One node: the run's options (file and flags) and its own node id and addresses. It loads the
    overlay, the emulator and the agent; never the scheduler or the simulator."""
    from agents import gcpolicy
    from agents.agent import Agent

    from .loops import set_loop
    from .profiling import profiled
    from .runspec import dispatch_of, tls_of, wan_of

    options = options_from(args)
    topo, trace = wan_of(options)
    if not 0 <= args.node < topo.nodes:
        raise CliError(f"--node {args.node} outside 0..{topo.nodes - 1}")
    host, _, port = args.scheduler.rpartition(":")
    lhost, _, lport = args.listen.rpartition(":")
    if not host or not port.isdigit() or not (lport or "0").isdigit():
        raise CliError(f"--scheduler {args.scheduler!r} / --listen {args.listen!r}: expected HOST:PORT")
    a = options.agents
    set_loop(a["loop"], options.wan["backend"])
    secret, tls = _secret(options, from_env=True), tls_of(options)
    advertise = None
    if args.advertise is not None:
        ahost, sep, aport = args.advertise.rpartition(":")
        if not sep or not ahost or not aport.isdigit() or not 0 <= int(aport) < 65536:
            raise CliError(f"--advertise {args.advertise!r}: expected HOST:PORT")
        advertise = (ahost.strip("[]"), int(aport))
    handoff = None
    if a["handoff_dir"] is not None:
        from overlay.handoff import TOKEN_ENV

        if not os.environ.get(TOKEN_ENV):
            raise CliError(f"--handoff-dir needs the run's token in ${TOKEN_ENV}")
        handoff = (a["handoff_dir"], os.environ[TOKEN_ENV])
    agent = Agent(args.node, options.cluster["name"], (host, int(port)), topo, trace=trace,
                  shaped=a["shaping"] != "none", host=lhost or "127.0.0.1", listen_port=int(lport or 0),
                  rate_shaping=a["shaping"] == "app", dispatch=dispatch_of(options), secret=secret, tls=tls,
                  hold_budget=int(a["hold_budget_mb"] * (1 << 20)), scheduler_wait_s=a["scheduler_wait_s"],
                  advertise=advertise, handoff=handoff, script_stall_s=a["script_stall_s"])
    gcpolicy.apply(a["gc"])  # the agent is built: what exists now lives as long as the process
    try:
        with profiled(f"agent-{args.node}"):  # only with $WANSYNC_PROFILE (wansync.profiling)
            asyncio.run(until_signal(agent.run()))
    except ConnectionError as exc:  # refused, unauthenticated, or no scheduler: one line on why
        raise CliError(str(exc), 1) from None
    except OSError as exc:  # the data port: in use, or an address this host does not have
        raise CliError(f"node {args.node}: cannot listen on {args.listen}: {exc.strerror or exc}", 1) from None
    return 0


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
