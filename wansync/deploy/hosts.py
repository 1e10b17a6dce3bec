"""The hosts of a running deployment: one `Host` per node, its connection and what was found there."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import asyncssh

from emulation.nicshape import NicShaper, ShapeError

from ..inventory import HostSpec
from ..remote import Remote, RemoteError, q


class DeployError(RuntimeError):
    """A deployment could not go on; the message names the host(s)."""


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

    def hostrun(self, label: str, cmd: list[str], echo: bool = False, env_file: str | None = None,
                cwd: str | None = None) -> str:
        """cmd under the supervisor, in the run dir: pid file, log, ends with the SSH session;
        `env_file`: KEY=VALUE lines for its environment (a token never on a command line)."""
        r = self.run_dir
        wrapper = [self.venv_python, "-m", "wansync.hostrun", "--pid-file", f"{r}/{label}.pid", "--log",
                   f"{r}/{label}.log"] + (["--echo"] if echo else []) + \
            (["--env-file", env_file] if env_file else []) + (["--cwd", cwd] if cwd else [])
        return f"cd {shlex.quote(r)} && exec {q(*wrapper, '--', *cmd)}"

    async def connect(self, run_id: str) -> None:
        await self.remote.connect()
        self.locate(run_id)
        self.address = self.spec.address or self.remote.peer_address

    def locate(self, run_id: str) -> None:
        """Its workdir, the run's directory there, and whether tc goes through sudo."""
        self.workdir = self.remote.path(self.spec.workdir).rstrip("/")
        self.run_dir = f"{self.workdir}/runs/{run_id}"
        if not self.remote.root:
            self.sudo = "sudo -n " if self.spec.sudo else ""

    async def check_python(self) -> None:
        py = self.spec.python
        out = await self.remote.run(f"command -v {shlex.quote(py)} || echo MISSING", what="looking for Python")
        if "MISSING" in out:
            raise self.remote.fail(f"no Python: `{py}` not found on its PATH (install python3 >= 3.11, or set "
                                   "python = \"/path/to/python3\" for it in the inventory)")
        self.python = out.strip().splitlines()[-1]
        ver = (await self.remote.run(q(self.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"),
                                     what="asking Python its version")).strip()
        major, minor = (int(x) for x in ver.split("."))
        if (major, minor) < (3, 11):
            raise self.remote.fail(f"Python {ver} at {self.python} is too old: wansync needs >= 3.11 (set python = "
                                   "... in the inventory)")
        self.version = ver


async def each(hosts: list[Host], fn: Callable[[Host], Any]) -> list[Any]:
    """fn on every host at once; every failure is reported (one line each), not just the first."""
    results = await asyncio.gather(*(fn(h) for h in hosts), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    for e in errors:
        if not isinstance(e, (RemoteError, DeployError, ShapeError)):
            raise e
    if errors:
        raise DeployError("\n".join(str(e) for e in errors))
    return results
