"""`wansync deploy`: the same run as `wansync run`, on real machines over SSH.

For each host of the inventory (node i on the i-th host): connect (keys and known_hosts as OpenSSH),
check its Python, install this very wansync from an offline wheelhouse unless the same build is
there (install prefix: WORKDIR/venv), make a run directory (WORKDIR/runs/RUN, mode 0700) holding
the cluster secret (0600: never on a command line), TLS material, the computed trace and the
run's options file that the scheduler and agent there read; optionally
shape its NIC (`--shape tc`: emulation/nicshape.py); start the scheduler on the first host (or here,
`--scheduler-here`) and one agent per host, each under `python -m wansync.hostrun` (pid file, log,
ends with the SSH session). Progress streams here as `wansync run` shows it, the dashboard is
forwarded over SSH. On every way out (success, failure, Ctrl-C, SIGTERM) the results and every
host's logs are copied into `--out DIR`, processes are ended, shaping removed and run directories
deleted. `wansync deploy --clean` does the same for runs whose launcher died.

Lost hosts: a host whose agent dies mid-run is a lost agent to the scheduler (it goes on without it,
as `wansync run` does with a killed agent); the launcher names the host and does not restart it.

The package splits it by concern: hosts (connections, Python), install (the wheelhouse), rundir
(each host's directory and options file), shaping (--shape tc and its trace replay), processes
(scheduler and agents there), teardown (collection and cleaning), course (the order of it all).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from rich.console import Console

from ..inventory import HostSpec, InventoryError, load, parse_hosts
from ..loops import set_loop
from ..options import Options, OptionsError
from ..remote import RemoteError
from ..runspec import resolve
from .course import Deployment
from .hosts import DeployError
from .teardown import clean

__all__ = ["Deployment", "DeployError", "host_specs", "main"]


def host_specs(args: argparse.Namespace) -> list[HostSpec]:
    if (args.inventory is None) == (args.hosts is None):
        raise OptionsError("give --inventory FILE or -H USER@HOST,... (one of them)")
    defaults = {"identity": args.identity} if args.identity else {}
    try:
        specs = load(args.inventory) if args.inventory is not None else parse_hosts(args.hosts, defaults)
    except InventoryError as exc:
        raise OptionsError(str(exc)) from None
    if args.identity:
        for s in specs:
            s.identity = s.identity or args.identity
    return specs


def main(args: argparse.Namespace, options: Options) -> int:
    """`wansync deploy`: `options` are the run's (validated); `args` the launcher's own (hosts, keys)."""
    from overlay.auth import SecretError, load_secret

    console = Console(stderr=True)
    specs = host_specs(args)
    if args.clean:
        try:
            return asyncio.run(clean(specs, args, console))
        except (DeployError, RemoteError) as exc:
            print(f"wansync deploy --clean: {exc}", file=sys.stderr)
            return 1
    if options.wan["nodes"] is None and options.wan["topology"].startswith(("uniform", "hetero")):
        options = options.replace(wan__nodes=len(specs))
    secret = None
    if options.security["secret_file"] is not None:
        try:
            secret = load_secret(options.security["secret_file"], env={})
        except SecretError as exc:
            raise OptionsError(str(exc)) from None
    if options.train["script"] is None and (options.train["files"] or options.train["packages"]):
        raise OptionsError("--train-file and --train-package are for --train SCRIPT")
    if options.train["script"] is not None:  # deploy --train: a wrong script is refused before anything starts
        from .training import check_script

        check_script(options)
    out_dir = options.output["out"]
    cfg = resolve(options.replace(output__out=None), secret=secret)  # --out is a directory here
    if (options.workload["compute_model"] or "").startswith("csv:"):  # the agents would open a path only here
        raise OptionsError("--compute-model csv:FILE is read by every agent, and the hosts do not have the file; use "
                           "constant, normal or lognormal (seeded: every host draws the same)")
    if cfg.topo.nodes != len(specs):
        raise OptionsError(f"the topology has {cfg.topo.nodes} nodes but {len(specs)} hosts are given "
                           "(one agent per host, node i on the i-th)")
    set_loop(options.agents["loop"], options.wan["backend"])
    dep = Deployment(cfg, specs, console, out=None if out_dir is None else Path(out_dir), shape=args.shape,
                     scheduler_here=args.scheduler_here, scheduler_address=args.scheduler_address,
                     known_hosts=args.known_hosts, accept_new_host_keys=args.accept_new_host_keys,
                     wheel_dir=args.wheelhouse)

    async def main_task() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGTERM, task.cancel)  # unwinds like Ctrl-C: teardown runs
        return await dep.run()

    try:
        return asyncio.run(main_task())
    except (DeployError, RemoteError) as exc:
        print(f"wansync deploy: {exc}", file=sys.stderr)
        return 1
    except asyncio.CancelledError:
        print("wansync deploy: stopped", file=sys.stderr)
        return 143
