"""`wansync deploy --train SCRIPT [ARGS...]`: the user's training script on the hosts, as `wansync train`
runs it here.

What travels: the script and every `--train-file PATH` (a file, or a directory copied whole) go into
the run directory's `train/` on each host, each under its own name beside the script; the script runs
with `train/` as its working directory, so the files it names relatively are found. The options file
every process there reads names the host's copies (`train.script`, `train.files`) and the agent's
hand-off directory (`channel/`, 0700); the channel's per-run token reaches the agent and the script
through a 0600 environment file hostrun reads (never a command line). The scheduler runs in the
launcher (as `--scheduler-here`): `wansync train`'s `TrainJobs` drives every scheme there, and
`RemoteScripts` starts the scripts over SSH with the environment `wansync train` gives (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, WANSYNC_CHANNEL,
WANSYNC_HANDOFF_TOKEN, the scheme and progress model). The hosts install wansync with its `torch`
extra and each `--train-package` from the offline wheelhouse.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from pathlib import Path
from typing import Any

import asyncssh

from agents.handoff import socket_path
from overlay.handoff import CHANNEL_ENV, TOKEN_ENV

from ..options import Options, OptionsError
from ..train import Scripts, TrainJobs, rank_env
from .hosts import Host, each

TRAIN_DIR = "train"  # under the run directory: the script and its files
CHANNEL_DIR = "channel"  # under the run directory: the agent's hand-off socket (0700)
AGENT_ENV = "agent.env"  # under the run directory: the channel's token for the agent (0600)
TORCH = "torch==2.13.0"  # wansync's `torch` extra (pyproject.toml), installed on the hosts
MASTER_PORT = 29500  # torchrun's default: only wt.ddp's construction-time Gloo group uses it


def check_script(options: Options) -> None:
    """Refuse a missing or wrong script, or a missing file, before anything starts."""
    t = options.train
    script = Path(t["script"])
    if not script.is_file():
        raise OptionsError(f"--train {script}: no such file" if not script.exists() else
                           f"--train {script}: not a file")
    try:
        compile(script.read_bytes(), str(script), "exec")
    except (SyntaxError, ValueError) as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise OptionsError(f"--train {script}: not a Python script{where}: {exc}") from None
    names = {script.name}
    for f in t["files"]:
        p = Path(f)
        if not p.exists():
            raise OptionsError(f"--train-file {f}: no such file or directory")
        if p.name in names:
            raise OptionsError(f"--train-file {f}: a second {p.name!r} in the script's directory")
        names.add(p.name)


def requirements(options: Options) -> tuple[str, ...]:
    """What the hosts install beside wansync for a training run (none without --train)."""
    return (TORCH, *options.train["packages"]) if options.train["script"] is not None else ()


def shipped(options: Options) -> list[tuple[Path, str]]:
    """(file here, its path under train/ there): the script, then every --train-file (directories whole)."""
    script = Path(options.train["script"])
    files = [(script, script.name)]
    for f in options.train["files"]:
        p = Path(f)
        if p.is_dir():
            files += [(x, f"{p.name}/{x.relative_to(p)}") for x in sorted(p.rglob("*")) if x.is_file()]
        else:
            files.append((p, p.name))
    return files


def host_train_options(h: Host, options: Options) -> dict[str, Any]:
    """The options' training paths as processes on `h` read them."""
    r = h.run_dir
    return {"train__script": f"{r}/{TRAIN_DIR}/{Path(options.train['script']).name}",
            "train__files": [f"{r}/{TRAIN_DIR}/{Path(f).name}" for f in options.train["files"]],
            "agents__handoff_dir": f"{r}/{CHANNEL_DIR}"}


async def ship(h: Host, options: Options, token: str) -> None:
    """The script and its files into the run directory's train/, the channel's directory and token."""
    r = h.run_dir
    files = shipped(options)
    dirs = sorted({f"{r}/{TRAIN_DIR}/{Path(rel).parent}" for _, rel in files} | {f"{r}/{TRAIN_DIR}"})
    await h.remote.run(f"umask 077 && mkdir -p {' '.join(shlex.quote(d) for d in dirs)} "
                       f"{shlex.quote(f'{r}/{CHANNEL_DIR}')} && chmod 700 {shlex.quote(f'{r}/{CHANNEL_DIR}')}",
                       what="making the script's directory")
    await h.remote.put([(local, f"{r}/{TRAIN_DIR}/{rel}", 0o644) for local, rel in files] +
                       [(f"{TOKEN_ENV}={token}\n".encode(), f"{r}/{AGENT_ENV}", 0o600)])


class _Proc:
    """A script's process on a host, as `Scripts` polls a local one; its stderr (hostrun's tail of the
    script's log when it fails) lands in `log` here."""

    def __init__(self, proc: asyncssh.SSHClientProcess, log: Path) -> None:
        self.proc, self.log = proc, log
        self.returncode: int | None = None
        self.task = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        try:
            err = await self.proc.stderr.read()
            self.log.write_text(str(err))
            await self.proc.wait()
            st = self.proc.exit_status
            self.returncode = st if st is not None and st >= 0 else 255
        except (OSError, asyncssh.Error) as exc:
            self.log.write_text(f"SSH connection lost ({exc})\n")
            self.returncode = 255

    def poll(self) -> int | None:
        return self.returncode


class RemoteScripts(Scripts):
    """The script once per host, beside its agent, started over SSH under hostrun (pid file, log
    `script-SCHEME-NODE.log` collected with the others, ends with the SSH session)."""

    def __init__(self, jobs: TrainJobs, hosts: list[Host]) -> None:
        super().__init__(jobs.cfg, jobs.backend, jobs.run_env, jobs.console)
        self.hosts = hosts

    async def launch(self, extra: dict[str, str], workdir: Path, channels: Path | None = None) -> None:
        t = self.cfg.options.train
        world = len(self.hosts)
        label = f"script-{extra.get('WANSYNC_SCHEME', 'run')}"

        async def start(h: Host) -> _Proc:
            same = [x.node for x in self.hosts if x.spec.host == h.spec.host]  # torchrun's local rank
            r = h.run_dir
            env = {**self.env, **extra, **rank_env(h.node, world, same.index(h.node), len(same)),
                   CHANNEL_ENV: str(socket_path(f"{r}/{CHANNEL_DIR}", h.node)),
                   "MASTER_ADDR": self.hosts[0].address, "MASTER_PORT": str(MASTER_PORT)}
            env_file = f"{r}/{label}-{h.node}.env"
            await h.remote.put([("".join(f"{k}={v}\n" for k, v in env.items()).encode(), env_file, 0o600)])
            script = f"{r}/{TRAIN_DIR}/{Path(t['script']).name}"
            cmd = h.hostrun(f"{label}-{h.node}", [h.venv_python, script, *t["args"]], env_file=env_file,
                            cwd=f"{r}/{TRAIN_DIR}")
            return _Proc(await h.remote.start(cmd), workdir / f"rank-{h.node}.stderr")

        procs = await each(self.hosts, start)
        self.procs = procs  # type: ignore[assignment]  # polled as Popen objects are
        self.logs = [p.log for p in procs]
        for p in self.logs:
            p.touch()

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.proc.stdin.write_eof()  # type: ignore[attr-defined]  # hostrun ends the script
        self.procs, self.logs = [], []
