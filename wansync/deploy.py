"""`wansync deploy`: the same run as `wansync run`, on real machines over SSH.

For each host of the inventory (node i on the i-th host): connect (keys and known_hosts as OpenSSH),
check its Python, install this very wansync from an offline wheelhouse unless the same build is
there (install prefix: WORKDIR/venv), make a run directory (WORKDIR/runs/RUN, mode 0700) holding
the cluster secret (0600: never on a command line), TLS material, the computed trace; optionally
shape its NIC (`--shape tc`: emulation/nicshape.py); start the scheduler on the first host (or here,
`--scheduler-here`) and one agent per host, each under `python -m wansync.hostrun` (pid file, log,
ends with the SSH session). Progress streams here as `wansync run` shows it, the dashboard is
forwarded over SSH. On every way out (success, failure, Ctrl-C, SIGTERM) the results and every
host's logs are copied into `--out DIR`, processes are ended, shaping removed and run directories
deleted. `wansync deploy --clean` does the same for runs whose launcher died.

Lost hosts: a host whose agent dies mid-run is a lost agent to the scheduler (it goes on without it,
as `wansync run` does with a killed agent); the launcher names the host and does not restart it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import shlex
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh
from rich.console import Console

from emulation.nicshape import NicShaper, ShapeError, check_replaceable, parse_mtu, parse_route_dev

from .cluster import CONTROL_PREFIX, AppBackend, RunConfig, Session, agent_command, conduct, set_loop
from .inventory import HostSpec, InventoryError, load, parse_hosts
from .remote import Remote, RemoteError, q
from .wheels import WheelError, Wheelhouse, prepare

log = logging.getLogger("wansync.deploy")

SHAPES = ("app", "tc", "none")
TEARDOWN_S = 60.0  # per host: collect, unshape, delete; an unreachable host is named and left to --clean


def add_parser(sub: Any, common: Callable, run_options: Callable, netstorm_options: Callable) -> None:
    d = sub.add_parser("deploy", help="the same run on real machines over SSH: install, start, shape, collect, "
                                      "clean up")
    common(d)
    run_options(d)
    for action in d._actions:  # the same option, a directory here: results, every host's logs and facts
        if action.dest == "out":
            action.help = "results directory: results.jsonl and logs/ (default ./wansync-deploy-DATE-TIME)"
    g = d.add_argument_group("hosts")
    g.add_argument("--inventory", type=Path, default=None, metavar="FILE", help="hosts.toml (README: Running on "
                                                                                 "real machines)")
    g.add_argument("-H", "--hosts", default=None, metavar="USER@HOST,...",
                   help="hosts in node order, instead of an inventory (as horovodrun -H)")
    g.add_argument("--known-hosts", type=Path, default=None, metavar="FILE",
                   help="host keys to check against (default ~/.ssh/known_hosts)")
    g.add_argument("--accept-new-host-keys", action="store_true",
                   help="trust hosts never seen before and add them to known_hosts (a changed key is refused)")
    g.add_argument("--identity", default=None, metavar="KEY", help="SSH private key for every host (default: "
                                                                   "ssh-agent, ~/.ssh/id_*)")
    g.add_argument("--wheelhouse", type=Path, default=None, metavar="DIR",
                   help="install from these wheels (wansync + dependencies) instead of building them here")
    g.add_argument("--scheduler-here", action="store_true",
                   help="run the scheduler in this process instead of on the first host")
    g.add_argument("--scheduler-address", default=None, metavar="HOST",
                   help="with --scheduler-here: the address hosts dial to reach it (default: this machine's "
                        "address as each SSH connection sees it)")
    g.add_argument("--shape", choices=SHAPES, default="app",
                   help="app: agents emulate the topology's links (default, as `wansync run`); tc: per-destination "
                        "htb classes on each host's NIC, rates from the topology/trace; none: the real network")
    g.add_argument("--no-shaping", dest="shape", action="store_const", const="none", help="= --shape none")
    g.add_argument("--secret-file", type=Path, default=None, metavar="FILE",
                   help="cluster secret to copy to the hosts (default: a fresh one per run)")
    g.add_argument("--clean", action="store_true",
                   help="remove what runs whose launcher died left on the hosts (processes, shaping, run dirs)")
    g.add_argument("--force", action="store_true", help="--clean: also runs whose launcher is still alive")
    netstorm_options(d)
    d.set_defaults(out=None)


# --- what a run needs on each host --------------------------------------------------------------------------
@dataclass
class Host:
    """One host of a running deployment: its connection and what was found and done there."""

    node: int
    remote: Remote
    workdir: str = ""
    run_dir: str = ""
    python: str = ""
    version: str = ""
    installed: str = ""  # "installed", "up to date"
    address: str = ""
    shaper: NicShaper | None = None
    sudo: str = ""  # "sudo -n " where tc needs it
    procs: dict[str, asyncssh.SSHClientProcess] = field(default_factory=dict)

    @property
    def spec(self) -> HostSpec:
        return self.remote.spec

    @property
    def name(self) -> str:
        return self.remote.name

    @property
    def venv_python(self) -> str:
        return f"{self.workdir}/venv/bin/python"

    def hostrun(self, label: str, cmd: list[str], echo: bool = False) -> str:
        """cmd under the supervisor, in the run dir: pid file, log, ends with the SSH session."""
        r = self.run_dir
        wrapper = [self.venv_python, "-m", "wansync.hostrun", "--pid-file", f"{r}/{label}.pid", "--log",
                   f"{r}/{label}.log"] + (["--echo"] if echo else [])
        return f"cd {shlex.quote(r)} && exec {q(*wrapper, '--', *cmd)}"


class DeployError(RuntimeError):
    """A deployment could not go on; the message names the host(s)."""


async def _each(hosts: list[Host], fn: Callable[[Host], Any]) -> list[Any]:
    """fn on every host at once; every failure is reported (one line each), not just the first."""
    results = await asyncio.gather(*(fn(h) for h in hosts), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    for e in errors:
        if not isinstance(e, (RemoteError, DeployError, ShapeError)):
            raise e
    if errors:
        raise DeployError("\n".join(str(e) for e in errors))
    return results


class Deployment:
    def __init__(self, cfg: RunConfig, specs: list[HostSpec], args: argparse.Namespace, console: Console,
                 wheelhouse: Wheelhouse | None = None) -> None:
        self.cfg = cfg
        self.args = args
        self.console = console
        self.run_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.cluster = "deploy-" + secrets.token_hex(4)
        self.out = Path(args.out) if args.out else Path(f"wansync-deploy-{time.strftime('%Y%m%d-%H%M%S')}")
        self.hosts = [Host(i, Remote(s, known_hosts=args.known_hosts, accept_new=args.accept_new_host_keys))
                      for i, s in enumerate(specs)]
        self.wheelhouse = wheelhouse
        self.secret = cfg.secret or secrets.token_urlsafe(32).encode()
        self.scheduler_proc: asyncssh.SSHClientProcess | None = None
        self.dead: dict[int, str] = {}
        self.tasks: set[asyncio.Task] = set()
        self.trace_task: asyncio.Task | None = None
        self.exit_code = 1
        self.collected = False
        self.listening: asyncio.Future | None = None
        self.sched_err: list[str] = []  # the scheduler's last lines on stderr (why it failed)
        self._tearing_down = False

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    # --- the whole course ---------------------------------------------------------------------------------
    async def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        connected: list[Host] = []
        try:
            await _each(self.hosts, self._connect)
            connected = self.hosts
            await _each(self.hosts, self._check_python)
            await self._install()
            await _each(self.hosts, self._prepare_run_dir)
            if self.args.shape == "tc":
                await self._shape()
            if self.args.scheduler_here:
                await self._run_here()
            else:
                await self._run_on_first_host()
            return self.exit_code
        finally:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._teardown(connected or [h for h in self.hosts if h.remote.conn]))

    async def _connect(self, h: Host) -> None:
        await h.remote.connect()
        h.workdir = h.remote.path(h.spec.workdir).rstrip("/")
        h.run_dir = f"{h.workdir}/runs/{self.run_id}"
        h.address = h.spec.address or h.remote.peer_address
        if not h.remote.root:
            h.sudo = "sudo -n " if h.spec.sudo else ""

    async def _check_python(self, h: Host) -> None:
        py = h.spec.python
        out = await h.remote.run(f"command -v {shlex.quote(py)} || echo MISSING", what="looking for Python")
        if "MISSING" in out:
            raise h.remote.fail(f"no Python: `{py}` not found on its PATH (install python3 >= 3.11, or set python = "
                                "\"/path/to/python3\" for it in the inventory)")
        h.python = out.strip().splitlines()[-1]
        ver = (await h.remote.run(q(h.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"),
                                  what="asking Python its version")).strip()
        major, minor = (int(x) for x in ver.split("."))
        if (major, minor) < (3, 11):
            raise h.remote.fail(f"Python {ver} at {h.python} is too old: wansync needs >= 3.11 (set python = ... in "
                                "the inventory)")
        h.version = ver

    # --- install --------------------------------------------------------------------------------------------
    async def _install(self) -> None:
        wh = self.wheelhouse
        if wh is None:
            self.say("building the wheelhouse (wansync + dependencies; dependencies are cached)")
            try:
                wh = self.wheelhouse = await asyncio.to_thread(prepare, self.args.wheelhouse)
            except WheelError as exc:
                raise DeployError(f"wheelhouse: {exc}") from None
        wrong = [h for h in self.hosts if h.version != wh.python]
        if wrong:
            raise DeployError("\n".join(f"host {h.name}: Python {h.version}, but the wheelhouse is for {wh.python}: "
                                        f"set python = \"python{wh.python}\" for it in the inventory, or give "
                                        f"--wheelhouse built with Python {h.version}" for h in wrong))
        await _each(self.hosts, self._install_on)

    async def _install_on(self, h: Host) -> None:
        wh = self.wheelhouse
        assert wh is not None
        stamp = f"{h.workdir}/venv/.wansync-build"
        have = (await h.remote.run(f"cat {shlex.quote(stamp)} 2>/dev/null || true")).strip()
        if have == wh.build_id:
            h.installed = "up to date"
            return
        t = time.monotonic()
        wheels = f"{h.run_dir}/wheels"
        await h.remote.run(f"umask 077 && mkdir -p {shlex.quote(wheels)}", what="making the run directory")
        await h.remote.put([(w, f"{wheels}/{w.name}", 0o644) for w in wh.wheels])
        pip = f"{shlex.quote(h.venv_python)} {shlex.quote(f'{wheels}/{wh.pip.name}')}/pip"
        own = shlex.quote(f"{wheels}/{wh.wansync.name}")
        flags = ("-q --disable-pip-version-check --no-index --no-cache-dir --no-compile "
                 f"--find-links {shlex.quote(wheels)}")
        script = "\n".join([
            "set -e", "unset PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS", "export PIP_CONFIG_FILE=/dev/null",
            f"[ -x {shlex.quote(h.venv_python)} ] || {q(h.python, '-m', 'venv', '--without-pip', h.workdir + '/venv')}",
            f"{pip} install {flags} {own}",
            f"{pip} install {flags} --no-deps --force-reinstall {own}",
            f"echo {wh.build_id} > {shlex.quote(stamp)}", f"rm -rf {shlex.quote(wheels)}"])
        await h.remote.run(script, what=f"installing wansync into {h.workdir}/venv", timeout_s=900)
        h.installed = "installed"
        self.say(f"{h.name}: installed wansync (build {wh.build_id}) into {h.workdir}/venv in "
                 f"{time.monotonic() - t:.0f} s")

    # --- the run directory ----------------------------------------------------------------------------------
    async def _prepare_run_dir(self, h: Host) -> None:
        r = h.run_dir
        await h.remote.run(f"umask 077 && mkdir -p {shlex.quote(r)}/tls && chmod 700 {shlex.quote(r)}",
                           what="making the run directory")
        files: list[tuple[Path | bytes, str, int]] = [(self.secret, f"{r}/secret", 0o600)]
        tls = self.cfg.tls
        if tls is not None:
            files += [(Path(h.spec.tls_cert or tls.cert), f"{r}/tls/cert.pem", 0o644),
                      (Path(h.spec.tls_key or tls.key), f"{r}/tls/key.pem", 0o600),
                      (Path(tls.ca), f"{r}/tls/ca.pem", 0o644)]
        if self.cfg.trace is not None and self.cfg.trace.events:
            with tempfile.TemporaryDirectory() as tmp:
                self.cfg.trace.write(Path(tmp) / "trace.json")
                files.append(((Path(tmp) / "trace.json").read_bytes(), f"{r}/trace.json", 0o644))
        if getattr(self.args, "scenario", None) is not None:
            files.append((Path(self.args.scenario).read_bytes(), f"{r}/scenario.toml", 0o644))
        await h.remote.put(files)

    # --- shaping (--shape tc) -------------------------------------------------------------------------------
    async def _shape(self) -> None:
        addrs = [h.address for h in self.hosts]
        if len(set(addrs)) != len(addrs):
            raise DeployError("--shape tc classifies by peer address: every host needs its own address "
                              f"(got {', '.join(addrs)})")
        await _each(self.hosts, self._shape_host)
        self.say("shaping: " + "; ".join(f"{h.name} {h.shaper.dev}: {len(h.shaper.rates)} classes"
                                         for h in self.hosts if h.shaper))

    def _rates_from(self, node: int, at_s: float | None = None) -> dict[str, float]:
        topo = self.cfg.topo
        rates = {}
        for j in topo.neighbors(node):
            rate = topo.links[(node, j)].rate_mbps
            if at_s is not None and self.cfg.trace is not None:
                for e in self.cfg.trace.for_link(node, j):
                    if e.t > at_s:
                        break
                    rate = e.rate_mbps
            rates[self.hosts[j].address] = rate
        return rates

    async def _shape_host(self, h: Host) -> None:
        if not h.remote.root and not h.sudo:
            raise h.remote.fail("--shape tc needs root there: log in as root, or set sudo = true (passwordless sudo "
                                "for tc) in the inventory")
        rates = self._rates_from(h.node)
        if not rates:
            return
        dev = h.spec.nic
        if dev is None:
            devs = set()
            for peer in rates:
                route = await h.remote.run(q("ip", "-o", "route", "get", peer), what=f"finding the route to {peer}")
                devs.add(parse_route_dev(route)[0])
            if len(devs) != 1:
                raise h.remote.fail(f"its peers are reached through {len(devs)} interfaces ({', '.join(sorted(devs))}):"
                                    " name the one to shape with nic = ... in the inventory")
            dev = devs.pop()
        mtu = parse_mtu(await h.remote.run(q("ip", "-o", "link", "show", "dev", dev), what=f"reading {dev}'s MTU"))
        try:
            check_replaceable(await h.remote.run(f"{h.sudo}tc qdisc show dev {shlex.quote(dev)}"), dev)
            shaper = NicShaper(dev, rates, mtu=mtu)
        except ShapeError as exc:
            raise h.remote.fail(str(exc)) from None
        await h.remote.put([(json.dumps(shaper.to_json()).encode(), f"{h.run_dir}/shape.json", 0o644)])
        await h.remote.run(f"{h.sudo}tc -batch -", input="\n".join(shaper.setup()) + "\n",
                           what=f"shaping {dev} (tc htb, {len(rates)} classes)")
        h.shaper = shaper

    def _on_job(self, t0: float) -> None:
        """Replay the trace on the NICs from a job's t0 (as agents replay it in the application)."""
        if self.args.shape != "tc" or self.cfg.trace is None or not self.cfg.trace.events:
            return
        if self.trace_task is not None:
            self.trace_task.cancel()
        self.trace_task = asyncio.ensure_future(self._replay(t0))

    async def _replay(self, t0: float) -> None:
        times = sorted({0.0} | {e.t for e in self.cfg.trace.events})  # type: ignore[union-attr]
        for t in times:
            await asyncio.sleep(max(0.0, t0 + t - time.time()))
            for h in self.hosts:
                if h.shaper is not None and h.node not in self.dead:
                    self._spawn(h.remote.run(f"{h.sudo}tc -batch -", check=False,
                                             input="\n".join(h.shaper.change(self._rates_from(h.node, t))) + "\n"))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # --- processes --------------------------------------------------------------------------------------------
    def agent_cmd(self, h: Host, sched_host: str, sched_port: int) -> list[str]:
        cfg, r = self.cfg, h.run_dir
        cfg.trace_file = Path(f"{r}/trace.json") if cfg.trace is not None and cfg.trace.events else None
        cmd = agent_command(cfg, h.node, sched_port, self.cluster)
        cmd[0] = h.venv_python
        cmd[cmd.index("--scheduler") + 1] = f"{sched_host}:{sched_port}"
        if cfg.tls is not None:
            for flag, name in (("--tls-cert", "cert"), ("--tls-key", "key"), ("--tls-ca", "ca")):
                cmd[cmd.index(flag) + 1] = f"{r}/tls/{name}.pem"
        if "--secret-file" in cmd:
            cmd[cmd.index("--secret-file") + 1] = f"{r}/secret"
        else:
            cmd += ["--secret-file", f"{r}/secret"]
        cmd += ["--listen", f"{h.spec.listen}:{h.spec.agent_port}", "--advertise", f"{h.address}:{h.spec.agent_port}"]
        if self.args.shape == "tc":
            cmd.append("--delay-only")
        elif self.args.shape == "none":
            cmd.append("--no-shaping")
        return cmd

    def scheduler_cmd(self, h: Host) -> list[str]:
        a, r = self.args, h.run_dir
        cmd = [h.venv_python, "-m", "wansync.cli", "scheduler", "--control-lines", "--listen",
               f"{h.spec.listen}:{h.spec.scheduler_port}", "--cluster", self.cluster, "--secret-file", f"{r}/secret",
               "--out", f"{r}/results.jsonl", "--topology", a.topology, "--seed", str(a.seed), "--scale",
               str(a.scale), "--loop", a.loop, "--schemes", ",".join(self.cfg.schemes), "--model", str(a.model),
               "--rounds", str(a.rounds), "--warmup", str(a.warmup), "--compute", str(a.compute), "--k", str(a.k),
               "--heartbeat-timeout", str(a.heartbeat_timeout), "--update-time", str(a.update_time),
               "--update-rate", str(a.update_rate), "--primary-busy-bound", str(a.primary_busy_bound),
               "--aux-queue-length", str(a.aux_queue_length), "--probe-num", str(a.probe_num),
               "--aux-mode", a.aux_mode, "--register-timeout", "120"]
        cmd += ["--nodes", str(self.cfg.topo.nodes)] if a.nodes is not None else []
        for flag, v in (("--hub", a.hub), ("--chunk", a.chunk), ("--hold-budget-mb", a.hold_budget_mb),
                        ("--roots", a.roots)):
            if v is not None:
                cmd += [flag, str(v)]
        for flag, v in (("--netstorm-reroot", a.netstorm_reroot), ("--both-directions", a.both_directions)):
            if v:
                cmd.append(flag)
        if self.cfg.trace is not None and self.cfg.trace.events:
            cmd += ["--trace-file", f"{r}/trace.json"]
        for f in a.fault or ():
            cmd += ["--fault", f]
        if a.scenario is not None:
            cmd += ["--scenario", f"{r}/scenario.toml"]
        if self.cfg.tls is not None:
            cmd += ["--tls-cert", f"{r}/tls/cert.pem", "--tls-key", f"{r}/tls/key.pem", "--tls-ca", f"{r}/tls/ca.pem"]
        cmd += ["--http", "127.0.0.1:0"] if self.cfg.http is not None else ["--no-http"]
        return cmd

    async def _start_agents(self, sched_host: Callable[[Host], str], port: int) -> None:
        async def start(h: Host) -> None:
            proc = await h.remote.start(h.hostrun(f"agent-{h.node}", self.agent_cmd(h, sched_host(h), port)))
            h.procs["agent"] = proc
            self._spawn(self._watch_agent(h, proc))
        await _each(self.hosts, start)

    async def _watch_agent(self, h: Host, proc: asyncssh.SSHClientProcess) -> None:
        err = ""
        try:
            err = await proc.stderr.read()
            await proc.wait()
            status, sig = proc.exit_status, proc.exit_signal
            why = (f"exit {status}" if status is not None and status >= 0 else f"signal {sig[0]}" if sig
                   else "SSH connection lost (host down or unreachable)")
        except (OSError, asyncssh.Error) as exc:
            why = f"SSH connection lost ({exc})"
        if proc.exit_status == 0:
            return
        tail = [x for x in str(err).strip().splitlines() if x.strip()][-2:]  # the command's last word, hostrun's
        self.dead[h.node] = ": ".join([why] + tail)
        if not self._tearing_down:
            self.say(f"[yellow]host {h.name} (node {h.node}): agent ended ({self.dead[h.node]}); the scheduler goes "
                     "on without it (not restarted)[/]")

    def signal(self, node: int, sig: int) -> None:
        """A fault's kill/freeze: the signal, on the node's host, to its agent process (pid file)."""
        h = self.hosts[node]
        pidfile = f"{h.run_dir}/agent-{node}.pid"
        self._spawn(self._signal(h, pidfile, sig))

    async def _signal(self, h: Host, pidfile: str, sig: int) -> None:
        try:
            name = signal.Signals(sig).name
            await h.remote.run(f"kill -s {name.removeprefix('SIG')} \"$(cat {shlex.quote(pidfile)})\"",
                               what=f"{name} to node {h.node}'s agent")
            self.say(f"host {h.name}: {signal.Signals(sig).name} to node {h.node}'s agent")
        except RemoteError as exc:
            self.say(f"[red]{exc}[/]")

    # --- the scheduler on the first host -------------------------------------------------------------------
    async def _run_on_first_host(self) -> None:
        h0 = self.hosts[0]
        self.listening = asyncio.get_running_loop().create_future()
        proc = await h0.remote.start(h0.hostrun("scheduler", self.scheduler_cmd(h0), echo=True))
        self.scheduler_proc = proc
        out = asyncio.ensure_future(self._scheduler_stdout(proc))
        err = asyncio.ensure_future(self._relay(proc.stderr, sys.stderr))
        waiter = asyncio.ensure_future(proc.wait())
        done, _ = await asyncio.wait({self.listening, waiter}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if self.listening not in done:
            await asyncio.gather(out, err, return_exceptions=True)
            why = "; ".join(self.sched_err[-2:]) or f"exit {proc.exit_status}"
            raise DeployError(f"host {h0.name}: the scheduler did not start: {why} (its log: {self.out / 'logs'})")
        port = self.listening.result()
        await self._start_agents(lambda h: h0.address, port)
        registered = False
        while not waiter.done():  # agents dying before every one registered fail the run at once
            await asyncio.wait({waiter}, timeout=0.5)
            registered = registered or self.registered
            if self.dead and (not registered or len(self.hosts) - len(self.dead) < 2):
                when = "before every one registered" if not registered else "and fewer than two are left"
                raise DeployError(f"agents ended {when}: " + "; ".join(
                    f"host {self.hosts[n].name} (node {n}): {why}" for n, why in sorted(self.dead.items())))
        await asyncio.gather(out, err, return_exceptions=True)
        self.exit_code = proc.exit_status if proc.exit_status is not None and proc.exit_status >= 0 else 1

    registered = False

    async def _scheduler_stdout(self, proc: asyncssh.SSHClientProcess) -> None:
        async for line in proc.stdout:
            if not line.startswith(CONTROL_PREFIX):
                sys.stdout.write(line)
                sys.stdout.flush()
                continue
            try:
                msg = json.loads(line[len(CONTROL_PREFIX):])
            except ValueError:
                continue
            if "listening" in msg and self.listening is not None and not self.listening.done():
                self.listening.set_result(int(msg["listening"]))
            elif "signal" in msg:
                self.signal(int(msg["node"]), int(msg["signal"]))
            elif "job_t0" in msg:
                self.registered = True
                self._on_job(float(msg["job_t0"]))
            elif "dashboard" in msg:
                self._spawn(self._forward_dashboard(str(msg["dashboard"])))

    async def _relay(self, stream: Any, to: Any) -> None:
        async for line in stream:
            if line.startswith("dashboard: "):  # its address there: the forwarded one here is printed instead
                continue
            if line.strip():
                self.sched_err = (self.sched_err + [line.strip()])[-5:]
            to.write(line)
            to.flush()

    async def _forward_dashboard(self, url: str) -> None:
        from scheduler.http import parse_hostport

        assert self.cfg.http is not None
        host, port = parse_hostport(self.cfg.http)
        rport = int(url.rstrip("/").rsplit(":", 1)[1])
        try:
            local = await self.hosts[0].remote.forward(host, port, rport)
        except OSError as exc:
            self.say(f"[yellow]dashboard: cannot listen on {self.cfg.http} here ({exc}); on {self.hosts[0].name} it is "
                     f"{url}[/]")
            return
        self.say(f"dashboard: http://{host}:{local}/  (JSON: /api, Prometheus: /metrics; forwarded over SSH from "
                 f"{self.hosts[0].name})")

    # --- the scheduler here -------------------------------------------------------------------------------
    async def _run_here(self) -> None:
        deployment = self

        class SshAgents:
            async def start(self, port: int) -> None:
                addr = deployment.args.scheduler_address
                await deployment._start_agents(lambda h: addr or h.remote.local_address, port)

            def dead(self) -> list[tuple[int, str]]:
                return sorted(deployment.dead.items())

            def signal(self, node: int, sig: int) -> None:
                deployment.signal(node, sig)

            async def stop(self) -> None:
                await deployment._stop_processes()

        class TraceBackend(AppBackend):
            def on_job(self, t0: float) -> None:
                deployment._on_job(t0)

        listen = self.hosts[0].spec
        self.cfg.out = self.out / "results.jsonl"
        session = Session(self.cluster, self.secret, SshAgents(), TraceBackend(), host="0.0.0.0",
                          port=listen.scheduler_port, register_timeout_s=120)
        try:
            jobs = await conduct(self.cfg, session, self.console)
        except OSError as exc:
            raise DeployError(f"the scheduler here cannot listen on 0.0.0.0:{listen.scheduler_port}: "
                              f"{exc.strerror or exc}") from None
        except (TimeoutError, RuntimeError) as exc:  # agents did not register, or their processes ended
            raise DeployError(str(exc)) from None
        exact = all(r.ok and r.digests_agree and r.versions_agree for js in jobs for r in js.records)
        self.exit_code = 0 if exact else 1

    # --- teardown ----------------------------------------------------------------------------------------------
    async def _stop_processes(self) -> None:
        """Close every process's stdin (hostrun ends its command), wait a little, then kill by pid file."""
        self._tearing_down = True
        procs = ([self.scheduler_proc] if self.scheduler_proc is not None else []) + \
            [p for h in self.hosts for p in h.procs.values()]
        for p in procs:
            with contextlib.suppress(Exception):
                p.stdin.write_eof()
        await asyncio.wait([asyncio.ensure_future(p.wait()) for p in procs], timeout=10) if procs else None

    async def _teardown(self, hosts: list[Host]) -> None:
        self._tearing_down = True
        if self.trace_task is not None:
            self.trace_task.cancel()
        await self._stop_processes()
        for t in list(self.tasks):
            t.cancel()
        results = await asyncio.gather(*(asyncio.wait_for(self._clean_host(h), TEARDOWN_S) for h in hosts),
                                       return_exceptions=True)
        for h, r in zip(hosts, results, strict=True):
            if isinstance(r, BaseException):
                why = "no answer in time" if isinstance(r, TimeoutError) else str(r)
                self.say(f"[red]host {h.name}: teardown incomplete ({why}); `wansync deploy --clean` removes the "
                         "rest[/]")
        for h in self.hosts:
            h.remote.close()
        self.say(f"results and logs: {self.out}/")

    async def _clean_host(self, h: Host) -> None:
        if h.remote.conn is None or not h.run_dir:
            return
        r = shlex.quote(h.run_dir)
        await h.remote.run(f"cd {r} 2>/dev/null || exit 0; for f in *.pid; do [ -f \"$f\" ] && "
                           f"kill -KILL \"$(cat \"$f\")\" 2>/dev/null; rm -f \"$f\"; done; true", check=False)
        if h.shaper is not None:
            await h.remote.run(f"{h.sudo}tc -batch -", input="\n".join(h.shaper.teardown()) + "\n",
                               what=f"removing the shaping of {h.shaper.dev}")
        logs = [x for x in await h.remote.listdir(h.run_dir) if x.endswith((".log", ".jsonl"))]
        local = self.out / "logs"
        await h.remote.get([(f"{h.run_dir}/{x}", (self.out if x == "results.jsonl" else local) /
                             (x if x == "results.jsonl" else f"{h.name}-{x}")) for x in logs])
        await h.remote.run(f"rm -rf {r}", what="removing the run directory")
        (self.out / "logs" / f"{h.name}.json").write_text(json.dumps({
            "node": h.node, "host": h.spec.host, "address": h.address, "python": h.python, "python_version": h.version,
            "install": h.installed, "workdir": h.workdir, "run_dir": h.run_dir,
            "shaped": None if h.shaper is None else h.shaper.to_json(), "agent_end": self.dead.get(h.node)}) + "\n")


# --- wansync deploy --clean ------------------------------------------------------------------------------------
def _launcher_alive(run_id: str) -> bool:
    """Run ids are HOSTNAME-PID-HEX: alive if that launcher is this machine's and its pid lives."""
    parts = run_id.rsplit("-", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def clean(specs: list[HostSpec], args: argparse.Namespace, console: Console) -> int:
    """Every run directory on every host whose launcher is gone: processes killed, shaping removed, deleted."""
    hosts = [Host(i, Remote(s, known_hosts=args.known_hosts, accept_new=args.accept_new_host_keys))
             for i, s in enumerate(specs)]
    await _each(hosts, lambda h: h.remote.connect())
    removed = 0
    try:
        for h in hosts:
            h.workdir = h.remote.path(h.spec.workdir).rstrip("/")
            if not h.remote.root:
                h.sudo = "sudo -n " if h.spec.sudo else ""
            for run_id in await h.remote.listdir(f"{h.workdir}/runs"):
                if _launcher_alive(run_id) and not args.force:
                    console.print(f"{h.name}: run {run_id} kept: its launcher is alive (--force removes it)")
                    continue
                h.run_dir = f"{h.workdir}/runs/{run_id}"
                shape = await h.remote.run(f"cat {shlex.quote(h.run_dir)}/shape.json 2>/dev/null || true")
                if shape.strip():
                    h.shaper = NicShaper(**{k: v for k, v in json.loads(shape).items() if k != "classids"})
                r = shlex.quote(h.run_dir)
                await h.remote.run(f"cd {r} && for f in *.pid; do [ -f \"$f\" ] && kill -KILL \"$(cat \"$f\")\" "
                                   "2>/dev/null; done; true", check=False)
                if h.shaper is not None:
                    await h.remote.run(f"{h.sudo}tc -batch -", input="\n".join(h.shaper.teardown()) + "\n",
                                       check=False)
                await h.remote.run(f"rm -rf {r}")
                console.print(f"{h.name}: removed run {run_id}" + (f" (and the shaping of {h.shaper.dev})"
                                                                    if h.shaper else ""))
                h.shaper = None
                removed += 1
    finally:
        for h in hosts:
            h.remote.close()
    if not removed:
        console.print("nothing to clean")
    return 0


# --- entry point ---------------------------------------------------------------------------------------------
def host_specs(args: argparse.Namespace) -> list[HostSpec]:
    if (args.inventory is None) == (args.hosts is None):
        raise SystemExit("wansync deploy: give --inventory FILE or -H USER@HOST,... (one of them)")
    defaults = {"identity": args.identity} if args.identity else {}
    try:
        specs = load(args.inventory) if args.inventory is not None else parse_hosts(args.hosts, defaults)
    except InventoryError as exc:
        raise SystemExit(f"wansync deploy: {exc}") from None
    if args.identity:
        for s in specs:
            s.identity = s.identity or args.identity
    return specs


def main(args: argparse.Namespace) -> int:
    from overlay.auth import SecretError, load_secret

    from .cli import run_config

    console = Console(stderr=True)
    specs = host_specs(args)
    if args.clean:
        try:
            return asyncio.run(clean(specs, args, console))
        except (DeployError, RemoteError) as exc:
            print(f"wansync deploy --clean: {exc}", file=sys.stderr)
            return 1
    if args.nodes is None:
        args.nodes = len(specs) if args.topology.startswith(("uniform", "hetero")) else None
    secret = None
    if args.secret_file is not None:
        try:
            secret = load_secret(args.secret_file)
        except SecretError as exc:
            raise SystemExit(f"wansync: {exc}") from None
    out_dir = args.out
    args.out = None
    cfg = run_config(args, secret=secret)
    args.out = out_dir
    if (cfg.compute_model or "").startswith("csv:"):  # the agents would open a path only this machine has
        raise SystemExit("wansync deploy: --compute-model csv:FILE is read by every agent, and the hosts do not have "
                         "the file; use constant, normal or lognormal (seeded: every host draws the same)")
    if cfg.topo.nodes != len(specs):
        raise SystemExit(f"wansync deploy: the topology has {cfg.topo.nodes} nodes but {len(specs)} hosts are given "
                         "(one agent per host, node i on the i-th)")
    set_loop(args.loop)
    dep = Deployment(cfg, specs, args, console)

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
