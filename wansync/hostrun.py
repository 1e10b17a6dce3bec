"""One process on a deployed host, as `wansync deploy` starts it over SSH: `python -m wansync.hostrun
--pid-file F --log L [--echo] -- COMMAND...`.

Why a wrapper: the launcher must be able to signal the process itself (its pid is in F), read its
log afterwards (L), see it live if asked (--echo copies its output to ours, which is the SSH
channel), and be sure it does not outlive the launcher: when the SSH session ends for any reason
(the launcher exits, is killed, or the network drops), sshd closes our stdin and the command is
ended (SIGCONT, SIGTERM, then SIGKILL). If the command fails, the end of its log goes to stderr so
the launcher can say why, naming the host.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

TAIL_LINES = 15


def _copy(src: object, log: object, echo: object | None) -> None:
    for line in iter(src.readline, b""):  # type: ignore[attr-defined]
        log.write(line)  # type: ignore[attr-defined]
        log.flush()  # type: ignore[attr-defined]
        if echo is not None:
            with contextlib.suppress(OSError):
                echo.write(line)  # type: ignore[attr-defined]
                echo.flush()  # type: ignore[attr-defined]


def _end(p: subprocess.Popen, grace_s: float = 5.0) -> None:
    if p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        p.send_signal(signal.SIGCONT)  # a frozen process (a fault) cannot leave otherwise
        p.terminate()
    try:
        p.wait(grace_s)
    except subprocess.TimeoutExpired:
        p.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wansync.hostrun")
    ap.add_argument("--pid-file", type=Path, required=True)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--echo", action="store_true", help="copy the command's output to ours as well")
    ap.add_argument("--env-file", type=Path, default=None,
                    help="KEY=VALUE lines added to the command's environment (a secret token stays off argv)")
    ap.add_argument("--cwd", type=Path, default=None, help="the command's working directory")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command")
    log = args.log.open("ab")
    env = dict(os.environ)
    if args.env_file is not None:
        for line in args.env_file.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and key:
                env[key] = value
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         cwd=args.cwd)
    args.pid_file.write_text(f"{p.pid}\n")
    copiers = [threading.Thread(target=_copy, args=(p.stdout, log, sys.stdout.buffer if args.echo else None),
                                daemon=True),
               threading.Thread(target=_copy, args=(p.stderr, log, sys.stderr.buffer if args.echo else None),
                                daemon=True)]
    for t in copiers:
        t.start()

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signum)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)

    def watch_stdin() -> None:  # EOF: the SSH session (and so the launcher) is gone
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        _end(p)
    threading.Thread(target=watch_stdin, daemon=True).start()
    rc = p.wait()
    for t in copiers:
        t.join(5)
    log.close()
    with contextlib.suppress(FileNotFoundError):
        args.pid_file.unlink()
    if rc != 0:
        why = f"killed by signal {-rc} ({signal.Signals(-rc).name})" if rc < 0 else f"exit {rc}"
        tail = args.log.read_text(errors="replace").splitlines()[-TAIL_LINES:] if args.log.exists() else []
        if not args.echo:
            sys.stderr.write("\n".join(tail) + ("\n" if tail else ""))
        sys.stderr.write(f"{Path(cmd[0]).name} {' '.join(cmd[1:4])}: {why}\n")
        sys.stderr.flush()
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())
