"""The way out of a deployment, on every way out: processes ended, results and every host's logs
collected into --out, shaping removed, run directories deleted; and `deploy --clean` for runs whose
launcher died (it cannot have tidied up)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import socket
from pathlib import Path

import asyncssh
from rich.console import Console

from emulation.nicshape import NicShaper

from ..inventory import HostSpec
from ..remote import Remote
from .hosts import Host, each

TEARDOWN_S = 60.0  # per host: collect, unshape, delete; an unreachable host is named and left to --clean


async def stop_processes(procs: list[asyncssh.SSHClientProcess]) -> None:
    """Close every process's stdin (hostrun ends its command), wait a little; the pid files kill the rest."""
    for p in procs:
        with contextlib.suppress(Exception):
            p.stdin.write_eof()
    if procs:
        await asyncio.wait([asyncio.ensure_future(p.wait()) for p in procs], timeout=10)


async def collect_and_clean(hosts: list[Host], out: Path, dead: dict[int, str], console: Console) -> None:
    """Every host at once: its logs and results copied here, its processes killed, shaping and run dir removed."""
    results = await asyncio.gather(*(asyncio.wait_for(_clean_host(h, out, dead), TEARDOWN_S) for h in hosts),
                                   return_exceptions=True)
    for h, r in zip(hosts, results, strict=True):
        if isinstance(r, BaseException):
            why = "no answer in time" if isinstance(r, TimeoutError) else str(r)
            console.print(f"[red]host {h.name}: teardown incomplete ({why}); `wansync deploy --clean` removes the "
                          "rest[/]", highlight=False, soft_wrap=True)


async def _clean_host(h: Host, out: Path, dead: dict[int, str]) -> None:
    if h.remote.conn is None or not h.run_dir:
        return
    r = shlex.quote(h.run_dir)
    await h.remote.run(f"cd {r} 2>/dev/null || exit 0; for f in *.pid; do [ -f \"$f\" ] && "
                       f"kill -KILL \"$(cat \"$f\")\" 2>/dev/null; rm -f \"$f\"; done; true", check=False)
    if h.shaper is not None:
        await h.remote.run(f"{h.sudo}tc -batch -", input="\n".join(h.shaper.teardown()) + "\n",
                           what=f"removing the shaping of {h.shaper.dev}")
    logs = [x for x in await h.remote.listdir(h.run_dir) if x.endswith((".log", ".jsonl"))]
    local = out / "logs"
    await h.remote.get([(f"{h.run_dir}/{x}", (out if x == "results.jsonl" else local) /
                         (x if x == "results.jsonl" else f"{h.name}-{x}")) for x in logs])
    await h.remote.run(f"rm -rf {r}", what="removing the run directory")
    (out / "logs" / f"{h.name}.json").write_text(json.dumps({
        "node": h.node, "host": h.spec.host, "address": h.address, "python": h.python, "python_version": h.version,
        "install": h.installed, "workdir": h.workdir, "run_dir": h.run_dir,
        "shaped": None if h.shaper is None else h.shaper.to_json(), "agent_end": dead.get(h.node)}) + "\n")


def launcher_alive(run_id: str) -> bool:
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
    await each(hosts, lambda h: h.remote.connect())
    removed = 0
    try:
        for h in hosts:
            h.locate("")
            for run_id in await h.remote.listdir(f"{h.workdir}/runs"):
                if launcher_alive(run_id) and not args.force:
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
