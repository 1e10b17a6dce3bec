"""The run's processes on the hosts: the scheduler (on the first host, or here with --scheduler-here)
and one agent per host, each under `python -m wansync.hostrun` reading the run directory's options
file; their ends watched, faults' signals delivered by pid file, the scheduler's requests (control
lines on its stdout) served, its dashboard forwarded here over SSH."""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import asyncssh
from rich.console import Console

from ..backend import AppBackend
from ..cluster import CONTROL_PREFIX, Session, conduct
from ..remote import RemoteError
from ..runspec import RunConfig
from ..train import TrainError, TrainJobs, report
from .hosts import DeployError, Host, each
from .teardown import stop_processes

START_S = 120.0  # the scheduler on the first host must listen within this


class Processes:
    def __init__(self, cfg: RunConfig, hosts: list[Host], console: Console, out: Path,
                 spawn: Callable[[Coroutine[Any, Any, Any]], None], on_job: Callable[[float], None]) -> None:
        self.cfg, self.hosts, self.console, self.out = cfg, hosts, console, out
        self.spawn, self.on_job = spawn, on_job
        self.dead: dict[int, str] = {}
        self.scheduler_proc: asyncssh.SSHClientProcess | None = None
        self.listening: asyncio.Future | None = None
        self.sched_err: list[str] = []  # the scheduler's last lines on stderr (why it failed)
        self.registered = False
        self.tearing_down = False

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    # --- agents ---------------------------------------------------------------------------------------------
    def agent_cmd(self, h: Host, scheduler: str) -> list[str]:
        """The agent there: the run directory's options file and what is its own (node, addresses)."""
        return [h.venv_python, "-m", "wansync.cli", "agent", "--options", f"{h.run_dir}/options.json",
                "--node", str(h.node), "--scheduler", scheduler, "--listen", f"{h.spec.listen}:{h.spec.agent_port}",
                "--advertise", f"{h.address}:{h.spec.agent_port}"]

    async def start_agents(self, sched_host: Callable[[Host], str], port: int) -> None:
        async def start(h: Host) -> None:
            cmd = self.agent_cmd(h, f"{sched_host(h)}:{port}")
            env_file = f"{h.run_dir}/agent.env" if self.cfg.options.train["script"] is not None else None
            proc = await h.remote.start(h.hostrun(f"agent-{h.node}", cmd, env_file=env_file))
            h.procs["agent"] = proc
            self.spawn(self._watch_agent(h, proc))
        await each(self.hosts, start)

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
        if not self.tearing_down:
            self.say(f"[yellow]host {h.name} (node {h.node}): agent ended ({self.dead[h.node]}); the scheduler goes "
                     "on without it (not restarted)[/]")

    def signal(self, node: int, sig: int) -> None:
        """A fault's kill/freeze: the signal, on the node's host, to its agent process (pid file)."""
        h = self.hosts[node]
        self.spawn(self._signal(h, f"{h.run_dir}/agent-{node}.pid", sig))

    async def _signal(self, h: Host, pidfile: str, sig: int) -> None:
        try:
            name = signal.Signals(sig).name
            await h.remote.run(f"kill -s {name.removeprefix('SIG')} \"$(cat {shlex.quote(pidfile)})\"",
                               what=f"{name} to node {h.node}'s agent")
            self.say(f"host {h.name}: {name} to node {h.node}'s agent")
        except RemoteError as exc:
            self.say(f"[red]{exc}[/]")

    # --- the scheduler on the first host --------------------------------------------------------------------
    async def run_on_first_host(self) -> int:
        h0 = self.hosts[0]
        self.listening = asyncio.get_running_loop().create_future()
        cmd = [h0.venv_python, "-m", "wansync.cli", "scheduler", "--options", f"{h0.run_dir}/options.json",
               "--listen", f"{h0.spec.listen}:{h0.spec.scheduler_port}", "--control-lines"]
        proc = await h0.remote.start(h0.hostrun("scheduler", cmd, echo=True))
        self.scheduler_proc = proc
        out = asyncio.ensure_future(self._scheduler_stdout(proc))
        err = asyncio.ensure_future(self._relay(proc.stderr, sys.stderr))
        waiter = asyncio.ensure_future(proc.wait())
        done, _ = await asyncio.wait({self.listening, waiter}, timeout=START_S, return_when=asyncio.FIRST_COMPLETED)
        if self.listening not in done:
            await asyncio.gather(out, err, return_exceptions=True)
            why = "; ".join(self.sched_err[-2:]) or f"exit {proc.exit_status}"
            raise DeployError(f"host {h0.name}: the scheduler did not start: {why} (its log: {self.out / 'logs'})")
        await self.start_agents(lambda h: h0.address, self.listening.result())
        registered = False
        while not waiter.done():  # agents dying before every one registered fail the run at once
            await asyncio.wait({waiter}, timeout=0.5)
            registered = registered or self.registered
            if self.dead and (not registered or len(self.hosts) - len(self.dead) < 2):
                when = "before every one registered" if not registered else "and fewer than two are left"
                raise DeployError(f"agents ended {when}: " + "; ".join(
                    f"host {self.hosts[n].name} (node {n}): {why}" for n, why in sorted(self.dead.items())))
        await asyncio.gather(out, err, return_exceptions=True)
        return proc.exit_status if proc.exit_status is not None and proc.exit_status >= 0 else 1

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
                self.on_job(float(msg["job_t0"]))
            elif "dashboard" in msg:
                self.spawn(self._forward_dashboard(str(msg["dashboard"])))

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

        http = self.cfg.options.http
        assert http is not None
        host, port = parse_hostport(http)
        rport = int(url.rstrip("/").rsplit(":", 1)[1])
        try:
            local = await self.hosts[0].remote.forward(host, port, rport)
        except OSError as exc:
            self.say(f"[yellow]dashboard: cannot listen on {http} here ({exc}); on {self.hosts[0].name} it is "
                     f"{url}[/]")
            return
        self.say(f"dashboard: http://{host}:{local}/  (JSON: /api, Prometheus: /metrics; forwarded over SSH from "
                 f"{self.hosts[0].name})")

    # --- the scheduler here ---------------------------------------------------------------------------------
    async def run_here(self, cluster: str, secret: bytes, scheduler_address: str | None,
                       train: TrainJobs | None = None) -> int:
        """`--scheduler-here`: `conduct` in this process, its agents over SSH; `train`: every scheme's job
        is the scripts' training (deploy --train), ending with `wansync train`'s table."""
        cfg = self.cfg
        cfg.options = cfg.options.replace(output__out=str(self.out / "results.jsonl"))
        listen = self.hosts[0].spec
        session = Session(cluster, secret, _SshAgents(self, scheduler_address), _JobBackend(self.on_job),
                          host="0.0.0.0", port=listen.scheduler_port, register_timeout_s=120, job=train)
        if train is not None:
            train.cfg = cfg
        try:
            jobs = await conduct(cfg, session, self.console, show_table=train is None)
            if train is not None:
                runs = report(self.console, train.runs, cfg.options)
                return 1 if any(r.syncs_wrong for r in runs) else 0
        except TrainError as exc:
            raise DeployError(f"training: {exc}") from None
        except OSError as exc:
            raise DeployError(f"the scheduler here cannot listen on 0.0.0.0:{listen.scheduler_port}: "
                              f"{exc.strerror or exc}") from None
        except (TimeoutError, RuntimeError) as exc:  # agents did not register, or their processes ended
            raise DeployError(str(exc)) from None
        exact = all(r.ok and r.digests_agree and r.versions_agree for js in jobs for r in js.records)
        return 0 if exact else 1

    async def stop(self) -> None:
        self.tearing_down = True
        procs = ([self.scheduler_proc] if self.scheduler_proc is not None else []) + \
            [p for h in self.hosts for p in h.procs.values()]
        await stop_processes(procs)


class _SshAgents:
    """The `Agents` of `conduct` when the scheduler runs here and the agents on the hosts."""

    def __init__(self, procs: Processes, scheduler_address: str | None) -> None:
        self.procs, self.address = procs, scheduler_address

    async def start(self, port: int) -> None:
        await self.procs.start_agents(lambda h: self.address or h.remote.local_address, port)

    def dead(self) -> list[tuple[int, str]]:
        return sorted(self.procs.dead.items())

    def signal(self, node: int, sig: int) -> None:
        self.procs.signal(node, sig)

    async def stop(self) -> None:
        await self.procs.stop()


class _JobBackend(AppBackend):
    def __init__(self, on_job: Callable[[float], None]) -> None:
        self._on_job = on_job

    def on_job(self, t0: float) -> None:
        self._on_job(t0)
