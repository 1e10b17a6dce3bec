"""One SSH connection to one host of a deployment (asyncssh): run, copy, start processes, forward ports.

Keys come from where OpenSSH finds them (ssh-agent, ~/.ssh/id_*, ~/.ssh/config) unless the inventory
names one; host keys are checked against known_hosts (~/.ssh/known_hosts unless told otherwise).
`accept_new` is OpenSSH's StrictHostKeyChecking=accept-new: a host never seen is trusted and written
to known_hosts, a host whose key CHANGED is still refused. Every error names the host.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from pathlib import Path

import asyncssh

from .inventory import HostSpec

log = logging.getLogger("wansync.deploy")


class RemoteError(RuntimeError):
    """Something failed on (or on the way to) a host; the message starts with the host's name."""


def default_known_hosts() -> Path:
    return Path.home() / ".ssh" / "known_hosts"


class Remote:
    def __init__(self, spec: HostSpec, *, known_hosts: Path | None = None, accept_new: bool = False,
                 connect_timeout_s: float = 15.0) -> None:
        self.spec = spec
        self.known_hosts = known_hosts or default_known_hosts()
        self.accept_new = accept_new
        self.connect_timeout_s = connect_timeout_s
        self.conn: asyncssh.SSHClientConnection | None = None
        self.home = ""
        self.root = False  # logged in as root (tc without sudo)

    @property
    def name(self) -> str:
        return self.spec.name

    def fail(self, what: str) -> RemoteError:
        return RemoteError(f"host {self.name} ({self.spec.target}): {what}")

    # --- connecting ---------------------------------------------------------------------------------------
    async def connect(self) -> None:
        s = self.spec
        kwargs: dict = {"port": s.port, "connect_timeout": self.connect_timeout_s, "keepalive_interval": 10,
                        "keepalive_count_max": 3}
        if s.user:
            kwargs["username"] = s.user
        if s.identity:
            kwargs["client_keys"] = [os.path.expanduser(s.identity)]
        known = self.known_hosts if self.known_hosts.exists() else None
        try:
            if self.accept_new:
                self.conn = await asyncssh.connect(s.host, known_hosts=None, **kwargs)
                self._accept_new_key(known)
            else:
                if known is None:
                    raise self.fail(f"no known_hosts file ({self.known_hosts}) to check its host key against: add "
                                    "the host's key (ssh-keyscan, or one `ssh` login) or pass --accept-new-host-keys")
                self.conn = await asyncssh.connect(s.host, known_hosts=str(known), **kwargs)
        except asyncssh.HostKeyNotVerifiable as exc:
            raise self.fail(f"host key not trusted by {self.known_hosts} ({exc.reason}): check it and add it "
                            "(ssh-keyscan), or pass --accept-new-host-keys for hosts never seen before") from None
        except asyncssh.PermissionDenied:
            keys = s.identity or "ssh-agent and ~/.ssh/id_*"
            raise self.fail(f"SSH authentication failed as {s.user or 'the local user name'} (keys tried: {keys})") \
                from None
        except (TimeoutError, OSError, asyncssh.Error) as exc:
            raise self.fail(f"cannot reach its SSH server: {_why(exc)}") from None
        out = await self.run('cd && pwd && id -u')
        lines = out.split()
        self.home, self.root = lines[0], lines[1] == "0"

    def _accept_new_key(self, known: Path | None) -> None:
        assert self.conn is not None
        key = self.conn.get_server_host_key()
        if key is None:
            return
        peer = self.conn.get_extra_info("peername")[0]
        names = [self.spec.host] if self.spec.port == 22 else [f"[{self.spec.host}]:{self.spec.port}"]
        if known is not None:
            trusted = asyncssh.read_known_hosts(str(known)).match(self.spec.host, peer, self.spec.port)[0]
            if trusted:
                if any(k.public_data == key.public_data for k in trusted):
                    return
                self.conn.close()
                raise self.fail(f"host key CHANGED (not the one in {known}): refusing even with "
                                "--accept-new-host-keys; if the host was reinstalled, remove its old line")
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self.known_hosts.open("a") as fh:
            fh.write(f"{','.join(names)} {key.export_public_key('openssh').decode().strip()}\n")
        log.warning("host %s: new host key added to %s", self.name, self.known_hosts)

    @property
    def peer_address(self) -> str:
        """The address SSH connected to: what peers dial unless the inventory says `address`."""
        assert self.conn is not None
        return self.conn.get_extra_info("peername")[0]

    @property
    def local_address(self) -> str:
        """This machine's address as the host sees it (a scheduler here listens for it)."""
        assert self.conn is not None
        return self.conn.get_extra_info("sockname")[0]

    def path(self, p: str) -> str:
        """~ at the start means the login's home directory."""
        return self.home + p[1:] if p == "~" or p.startswith("~/") else p

    # --- commands -----------------------------------------------------------------------------------------
    async def run(self, cmd: str, *, input: str | None = None, check: bool = True, timeout_s: float | None = 300,
                  what: str | None = None) -> str:
        """A shell command; its stdout. check: RemoteError with its stderr if it fails."""
        if self.conn is None:
            raise self.fail("not connected")
        try:
            r = await asyncio.wait_for(self.conn.run(cmd, input=input, check=False), timeout_s)
        except TimeoutError:
            raise self.fail(f"{what or cmd[:80]}: no answer within {timeout_s:.0f} s") from None
        except (OSError, asyncssh.Error) as exc:
            raise self.fail(f"{what or cmd[:80]}: connection lost ({_why(exc)})") from None
        if check and r.exit_status != 0:
            err = (str(r.stderr or "") or str(r.stdout or "")).strip()
            raise self.fail(f"{what or cmd[:80]} failed (exit {r.exit_status}): {err[-800:]}")
        return str(r.stdout or "")

    async def start(self, cmd: str) -> asyncssh.SSHClientProcess:
        """A long-running command; its stdin stays open (closing it ends a hostrun-wrapped command)."""
        if self.conn is None:
            raise self.fail("not connected")
        return await self.conn.create_process(cmd)

    async def put(self, files: list[tuple[Path | bytes, str, int]]) -> None:
        """Copy (local file or bytes, remote path, mode) over SFTP; the mode is set before any byte lands."""
        assert self.conn is not None
        try:
            async with self.conn.start_sftp_client() as sftp:
                for src, dst, mode in files:
                    attrs = asyncssh.SFTPAttrs(permissions=mode)
                    async with sftp.open(dst, "wb", attrs) as fh:
                        await sftp.chmod(dst, mode)  # an existing file keeps its mode on open
                        if isinstance(src, bytes):
                            await fh.write(src)
                        else:
                            with open(src, "rb") as f:
                                while chunk := f.read(1 << 20):
                                    await fh.write(chunk)
        except (OSError, asyncssh.Error) as exc:
            raise self.fail(f"copying files failed: {_why(exc)}") from None

    async def get(self, files: list[tuple[str, Path]]) -> list[str]:
        """Copy remote files here; returns the remote paths that did not exist."""
        assert self.conn is not None
        missing = []
        async with self.conn.start_sftp_client() as sftp:
            for src, dst in files:
                try:
                    await sftp.get(src, str(dst))
                except asyncssh.SFTPNoSuchFile:
                    missing.append(src)
        return missing

    async def listdir(self, path: str) -> list[str]:
        out = await self.run(f"ls -1A {shlex.quote(path)} 2>/dev/null || true")
        return [x for x in out.splitlines() if x]

    async def forward(self, local_host: str, local_port: int, remote_port: int) -> int:
        """Local port -> the host's 127.0.0.1:remote_port (the remote dashboard); returns the local port."""
        assert self.conn is not None
        listener = await self.conn.forward_local_port(local_host, local_port, "127.0.0.1", remote_port)
        return listener.get_port()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def _why(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    if isinstance(exc, asyncssh.DisconnectError):
        return exc.reason
    return str(exc) or type(exc).__name__


def q(*parts: str) -> str:
    """A shell command line from words (each quoted)."""
    return " ".join(shlex.quote(p) for p in parts)
