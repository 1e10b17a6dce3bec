"""Training scripts forked from a server process that has already imported the installed modules the
script imports at its top level: torch's and scikit-learn's few CPU-seconds of imports are paid once per
launcher, not once per rank and scheme.

Only for scripts that run on this host in the launcher's network namespace (the application backend);
the kernel backend and real hosts start `python SCRIPT` per rank. A forked script gets what `python
SCRIPT ARGS` would give it: its environment (and nothing else of the launcher's: the server starts
without the hidden variables, as /proc/self/environ shows the server's), argv, the script's directory
first on sys.path, stdin from /dev/null, stdout the launcher's, stderr to its log, atexit handlers and an
exit status as Python gives it. The script's own modules (beside it) are never preloaded: one that reads
RANK when imported reads its own rank's. (multiprocessing's forkserver would re-import the launcher's
main module in every child; this server imports nothing of the launcher's.)

The protocol: the launcher writes one JSON line per script to start on the server's request pipe; the
server forks, answers {"pid": P} on its reply pipe, and {"exit": P, "code": C} once P ends.
"""

from __future__ import annotations

import ast
import atexit
import importlib
import importlib.util
import json
import os
import queue
import runpy
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 60.0  # the server's answer to a fork (its preload happens before it reads the first)
# what a preloaded package imports later, on first use, at a cost worth paying once: torch's first
# optimizer imports torch._dynamo (and sympy), 1.4 s of a script's start on this machine
LAZY = {"torch": "torch._dynamo"}
GONE_POLL_S = 0.2  # how often a waiter looks for a script whose server died (nobody reports its end)
SERVER_GONE = 255  # the exit status of a script whose server died before it (its own is lost)


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


class ForkServer:
    """The launcher's side: one server per launcher and script, started on first use."""

    def __init__(self, script: Path, hidden: Iterable[str]) -> None:
        self.script = script
        req_r, self._req = os.pipe()
        self._rep, rep_w = os.pipe()
        env = {k: v for k, v in os.environ.items() if k not in set(hidden)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from wansync.prefork import serve; serve(sys.argv[1:])",
             str(req_r), str(rep_w), *installed_imports(script)],
            env=env, stdin=subprocess.DEVNULL, pass_fds=(req_r, rep_w))
        os.close(req_r)
        os.close(rep_w)
        self._pids: queue.Queue[int] = queue.Queue()
        self.codes: dict[int, int] = {}
        self._ended = threading.Condition()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="prefork replies", daemon=True).start()

    def _read(self) -> None:
        with os.fdopen(self._rep, "rb") as replies:
            for line in replies:
                msg = json.loads(line)
                if "pid" in msg:
                    self._pids.put(msg["pid"])
                else:
                    with self._ended:
                        self.codes[msg["exit"]] = msg["code"]
                        self._ended.notify_all()
        self._pids.put(-1)  # the server is gone: no answer comes, and waiters must look for themselves
        with self._ended:
            self._ended.notify_all()

    def fork(self, args: list[str], env: Mapping[str, str], log: Path) -> ForkedScript:
        req = {"script": str(self.script), "args": list(args), "env": dict(env), "log": str(log)}
        with self._lock:
            os.write(self._req, (json.dumps(req) + "\n").encode())
            try:
                pid = self._pids.get(timeout=START_TIMEOUT_S)
            except queue.Empty:
                pid = -1
        if pid < 0:
            raise RuntimeError(f"the fork server for {self.script} did not start a script "
                               f"(server exit {self.proc.poll()})")
        return ForkedScript(self, pid)

    def wait(self, script: ForkedScript, timeout: float | None) -> int | None:
        """The script's exit status once known (its server's report, or SERVER_GONE), else None after
        `timeout`."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._ended:
            while script.returncode is None:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    break
                # the server's report wakes this; once the server is gone, nothing does: look again
                self._ended.wait(GONE_POLL_S if left is None else min(left, GONE_POLL_S))
            return script.returncode

    def close(self) -> None:
        os.close(self._req)  # the server ends when its request pipe does (its scripts run on)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class ForkedScript:
    """One forked script, answering what a Popen is asked (poll, returncode, wait, signals)."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid = server, pid

    @property
    def returncode(self) -> int | None:
        code = self.server.codes.get(self.pid)
        if code is None and self.server.proc.poll() is not None and not _alive(self.pid):
            return SERVER_GONE  # it ended after its server died: nobody can tell how
        return code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self.server.wait(self, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"script pid {self.pid}", timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_servers: dict[str, ForkServer] = {}


def fork_script(script: str, args: list[str], env: Mapping[str, str], log: Path,
                hidden: Iterable[str] = ()) -> ForkedScript:
    """`python SCRIPT ARGS` with `env`, stderr to `log`, forked from this launcher's server for `script`
    (started here, without the `hidden` variables, if it is not running yet)."""
    server = _servers.get(script)
    if server is None or server.proc.poll() is not None:
        server = _servers[script] = ForkServer(Path(script), hidden)
        atexit.register(server.close)
    return server.fork(args, env, log)


# --- the server's side -------------------------------------------------------------------------------------
def serve(argv: list[str]) -> None:
    """Import the modules named after the two pipe fds, then fork a script per request until the request
    pipe closes; report each child's pid and, once it ends, its exit status."""
    req_fd, rep_fd, modules = int(argv[0]), int(argv[1]), argv[2:]
    for name in [*modules, *(LAZY.get(m.split(".")[0], "") for m in modules)]:
        try:
            if name:
                importlib.import_module(name)
        except Exception:  # noqa: BLE001  # the script imports it again and fails there, with its own traceback
            pass
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the launcher and the scripts
    sel = selectors.DefaultSelector()
    sel.register(req_fd, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    pending = b""
    children: set[int] = set()

    def reply(msg: dict[str, Any]) -> None:
        os.write(rep_fd, (json.dumps(msg) + "\n").encode())

    def reap() -> None:
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                reply({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    open_ = True
    while open_ or children:
        for key, _ in sel.select(timeout=1.0):
            if key.fd == wake_r:
                os.read(wake_r, 512)
                continue
            data = os.read(req_fd, 1 << 16)
            if not data:
                open_ = False
                sel.unregister(req_fd)
                continue
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = os.fork()
                if pid == 0:
                    for fd in (req_fd, rep_fd, wake_r, wake_w):
                        os.close(fd)
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    os._exit(_run(json.loads(line)))
                children.add(pid)
                reply({"pid": pid})
        reap()


def _run(req: dict[str, Any]) -> int:
    """In the forked child: `python SCRIPT ARGS` as the launcher would have exec'd it; its exit status."""
    os.environ.clear()
    os.environ.update(req["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (2, req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        new = os.open(path, flags, 0o600)
        os.dup2(new, fd)
        os.close(new)
    if req["env"].get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.argv = [req["script"], *req["args"]]
    sys.path[0] = str(Path(req["script"]).resolve().parent)  # the server's was its working directory
    code = 0
    try:
        runpy.run_path(req["script"], run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:  # noqa: BLE001  # what Python prints for an uncaught exception, and status 1
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads end first, as at Python's exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def _exit_code(e: SystemExit) -> int:
    """The status `sys.exit(x)` gives: None 0, an int itself, anything else printed and 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1
