"""This very wansync on every host, from an offline wheelhouse, unless the same build is there."""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from ..remote import q
from ..wheels import LIST_INSTALLED, WheelError, Wheelhouse, prepare
from .hosts import DeployError, Host, each


async def install(hosts: list[Host], wheelhouse: Wheelhouse | None, wheel_dir: Path | None,
                  say: Callable[[str], None], extra: tuple[str, ...] = ()) -> Wheelhouse:
    """Build (or take) the wheelhouse, check every host's Python fits it, install where needed;
    `extra`: requirements beside wansync (deploy --train: torch and the script's packages)."""
    wh = wheelhouse
    if wh is None:
        say("building the wheelhouse (wansync + dependencies; dependencies are cached)")
        try:
            wh = await asyncio.to_thread(prepare, wheel_dir, extra=extra)
        except WheelError as exc:
            raise DeployError(f"wheelhouse: {exc}") from None
    wrong = [h for h in hosts if h.version != wh.python]
    if wrong:
        raise DeployError("\n".join(f"host {h.name}: Python {h.version}, but the wheelhouse is for {wh.python}: "
                                    f"set python = \"python{wh.python}\" for it in the inventory, or give "
                                    f"--wheelhouse built with Python {h.version}" for h in wrong))
    await each(hosts, lambda h: _install_on(h, wh, say))
    return wh


async def _install_on(h: Host, wh: Wheelhouse, say: Callable[[str], None]) -> None:
    stamp = f"{h.workdir}/venv/.wansync-build"
    have = (await h.remote.run(f"cat {shlex.quote(stamp)} 2>/dev/null || true")).strip()
    if have == wh.build_id:
        h.installed = "up to date"
        return
    t = time.monotonic()
    venv_py = shlex.quote(h.venv_python)
    installed = await h.remote.run(f"if [ -x {venv_py} ]; then {venv_py} -c {shlex.quote(LIST_INSTALLED)} || true; fi",
                                   what="listing what its prefix holds")
    ship = wh.needed(installed)
    deps_sent = any(w not in (wh.wansync, wh.pip) for w in ship)  # else every dependency is in already
    wheels = f"{h.run_dir}/wheels"
    await h.remote.run(f"umask 077 && mkdir -p {shlex.quote(wheels)}", what="making the run directory")
    await h.remote.put([(w, f"{wheels}/{w.name}", 0o644) for w in ship])
    pip = f"{venv_py} {shlex.quote(f'{wheels}/{wh.pip.name}')}/pip"
    own = shlex.quote(f"{wheels}/{wh.wansync.name}")
    flags = ("-q --disable-pip-version-check --no-index --no-cache-dir --no-compile "
             f"--find-links {shlex.quote(wheels)}")
    script = "\n".join([
        "set -e", "unset PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS", "export PIP_CONFIG_FILE=/dev/null",
        f"[ -x {venv_py} ] || {q(h.python, '-m', 'venv', '--without-pip', h.workdir + '/venv')}",
        *([f"{pip} install {flags} {own} {q(*wh.extra)}".rstrip()] if deps_sent else []),
        f"{pip} install {flags} --no-deps --force-reinstall {own}",
        f"echo {wh.build_id} > {shlex.quote(stamp)}", f"rm -rf {shlex.quote(wheels)}"])
    await h.remote.run(script, what=f"installing wansync into {h.workdir}/venv", timeout_s=900)
    h.installed = "installed"
    mb = sum(w.stat().st_size for w in ship) / 1e6
    say(f"{h.name}: installed wansync (build {wh.build_id}) into {h.workdir}/venv in {time.monotonic() - t:.0f} s "
        f"({len(ship)} of {len(wh.wheels)} wheels sent, {mb:.0f} MB)")
