"""Training scripts forked from a process that has already imported the installed modules the script
imports at its top level (multiprocessing's forkserver with those modules preloaded): torch's and
scikit-learn's few CPU-seconds of imports are paid once per launcher, not once per rank and scheme.

Only for scripts that run on this host in the launcher's network namespace (the application backend);
the kernel backend and real hosts start `python SCRIPT` per rank. A forked script gets what `python
SCRIPT ARGS` would give it: its environment (and nothing else of the launcher's), argv, the script's
directory first on sys.path, stdin from /dev/null, stderr to its log, its exit status, its atexit
handlers. The script's own modules (beside it) are never preloaded: one that reads RANK when imported
reads its own rank's.
"""

from __future__ import annotations

import ast
import atexit
import importlib.util
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

_ctx = multiprocessing.get_context("forkserver")


def installed_imports(script: Path) -> list[str]:
    """Modules `script` imports at its top level that resolve outside its directory (installed packages,
    the standard library), in order; a file that does not parse imports nothing here."""
    try:
        tree = ast.parse(script.read_text(), str(script))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    here = script.resolve().parent
    out = []
    for name in dict.fromkeys(names):
        try:
            spec = importlib.util.find_spec(name.split(".")[0])
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        where = [spec.origin] if spec.has_location and spec.origin else list(spec.submodule_search_locations or [])
        if not any(Path(w).resolve().is_relative_to(here) for w in where):
            out.append(name)
    return out


def start_server(script: Path, hidden: Iterable[str]) -> None:
    """Start this process's fork server (once; later calls find it running) preloading `script`'s
    installed imports, with the `hidden` variables out of its environment: a forked script's
    /proc/self/environ is the server's."""
    _ctx.set_forkserver_preload(installed_imports(script))
    saved = {k: os.environ.pop(k) for k in list(hidden) if k in os.environ}
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.update(saved)


def _run(script: str, args: list[str], env: Mapping[str, str], log: str) -> None:
    """In the forked process: `python SCRIPT ARGS` as the launcher would have exec'd it."""
    os.environ.clear()
    os.environ.update(env)
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (2, log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        new = os.open(path, flags, 0o600)
        os.dup2(new, fd)
        os.close(new)
    if env.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        atexit._run_exitfuncs()  # a process ends here without the interpreter's own exit


class ForkedScript:
    """One forked script, answering what a Popen is asked (poll, returncode, wait, signals)."""

    def __init__(self, script: str, args: list[str], env: Mapping[str, str], log: Path) -> None:
        self._p = _ctx.Process(target=_run, args=(script, list(args), dict(env), str(log)), name=f"script {log.stem}")
        self._p.start()

    @property
    def pid(self) -> int:
        assert self._p.pid is not None
        return self._p.pid

    @property
    def returncode(self) -> int | None:
        return self._p.exitcode

    def poll(self) -> int | None:
        return self._p.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._p.join(timeout)
        if self._p.exitcode is None:
            raise subprocess.TimeoutExpired(f"script pid {self.pid}", timeout or 0.0)
        return self._p.exitcode

    def send_signal(self, sig: int) -> None:
        if self._p.exitcode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_script(script: str, args: list[str], env: Mapping[str, str], log: Path,
                hidden: Iterable[str] = ()) -> ForkedScript:
    """`python SCRIPT ARGS` with `env`, stderr to `log`, forked from the fork server (started here if
    it is not running yet)."""
    start_server(Path(script), hidden)
    return ForkedScript(script, args, env, log)

