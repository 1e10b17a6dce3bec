"""One deployment from start to end: connect, check, install, prepare, shape, run, and tear down on
every way out (success, failure, Ctrl-C, SIGTERM)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from rich.console import Console

from ..backend import AppBackend
from ..inventory import HostSpec
from ..remote import Remote
from ..runspec import RunConfig
from ..train import TrainJobs
from ..wheels import Wheelhouse
from .hosts import Host, each
from .install import install
from .processes import Processes
from .rundir import host_options, prepare_run_dir
from .shaping import HostShaping
from .teardown import collect_and_clean
from .training import RemoteScripts, requirements, ship


class Deployment:
    def __init__(self, cfg: RunConfig, specs: list[HostSpec], console: Console, *, out: Path | None = None,
                 shape: str = "app", scheduler_here: bool = False, scheduler_address: str | None = None,
                 known_hosts: Path | None = None, accept_new_host_keys: bool = False,
                 wheel_dir: Path | None = None, wheelhouse: Wheelhouse | None = None) -> None:
        self.cfg, self.console, self.shape = cfg, console, shape
        self.scheduler_here, self.scheduler_address = scheduler_here, scheduler_address
        self.run_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.cluster = "deploy-" + secrets.token_hex(4)
        self.out = out or Path(f"wansync-deploy-{time.strftime('%Y%m%d-%H%M%S')}")
        self.hosts = [Host(i, Remote(s, known_hosts=known_hosts, accept_new=accept_new_host_keys))
                      for i, s in enumerate(specs)]
        self.wheel_dir, self.wheelhouse = wheel_dir, wheelhouse
        self.secret = cfg.secret or secrets.token_urlsafe(32).encode()
        self.tasks: set[asyncio.Task] = set()
        self.processes = Processes(cfg, self.hosts, console, self.out, self.spawn, self._on_job)
        self.train: TrainJobs | None = None  # deploy --train: wansync train's jobs, scripts started over SSH
        if cfg.options.train["script"] is not None:
            self.train = TrainJobs(cfg, AppBackend(), console, scripts=lambda jobs: RemoteScripts(jobs, self.hosts))
            self.scheduler_here = True  # the scripts' training is driven from here
        self.shaping = HostShaping(cfg, self.hosts, self.say, self.spawn, self.processes.dead)

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _on_job(self, t0: float) -> None:
        if self.shape == "tc":
            self.shaping.on_job(t0)

    async def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        connected: list[Host] = []
        try:
            await each(self.hosts, lambda h: h.connect(self.run_id))
            connected = self.hosts
            await each(self.hosts, Host.check_python)
            self.wheelhouse = await install(self.hosts, self.wheelhouse, self.wheel_dir, self.say,
                                            extra=requirements(self.cfg.options))
            await each(self.hosts, lambda h: prepare_run_dir(
                h, self.cfg, self.secret, host_options(self.cfg, h, self.cluster, self.shape)))
            if self.train is not None:
                train = self.train
                await each(self.hosts, lambda h: ship(h, self.cfg.options, train.token))
            if self.shape == "tc":
                await self.shaping.shape()
            if self.scheduler_here:
                return await self.processes.run_here(self.cluster, self.secret, self.scheduler_address, self.train)
            return await self.processes.run_on_first_host()
        finally:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._teardown(connected or [h for h in self.hosts if h.remote.conn]))

    async def _teardown(self, hosts: list[Host]) -> None:
        self.shaping.stop()
        await self.processes.stop()
        for t in list(self.tasks):
            t.cancel()
        await collect_and_clean(hosts, self.out, self.processes.dead, self.console)
        if self.train is not None:
            self.train.close()
        for h in self.hosts:
            h.remote.close()
        self.say(f"results and logs: {self.out}/")
