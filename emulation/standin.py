"""Stand-in hosts: network namespaces on a bridge, each running Debian's OpenSSH server on its own address.

What `wansync deploy` is tested against (tests/test_hosts.py, scripts/bench/hosts.py): real sshd,
real key authentication and host-key checks, a NIC (`eth0`, a veth) to shape, an address per host.
The namespaces share this machine's filesystem, so each stand-in host is given its own directory
(`workdir`): its install prefix and run directories live there, as on a machine of its own. They
have no route anywhere but the bridge: no package index, so an install must be offline.

Keys are throwaway: a client key pair (authorized on every host), one host key per host, and a
known_hosts file naming them, all under `root`. Names start with `wh<4 hex>-`; teardown kills what
still runs in the namespaces and removes them and the bridge.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .tc import TcError, claim_subnet

SSHD = "/usr/sbin/sshd"
NET = "10.81."  # 10.81.k.0/24: the first k no address of this machine is in


class StandinError(RuntimeError):
    """The stand-in hosts could not be built (the message says which step and why)."""


@dataclass
class StandinHost:
    name: str
    netns: str
    address: str
    workdir: Path
    sshd: subprocess.Popen | None = None


def unavailable() -> str | None:
    """Why stand-in hosts cannot be built here, or None. Root and network namespaces are the
    caller's to check first (tests skip without them); a missing sshd or ip here is a failure."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool, path in (("ip", shutil.which("ip")), ("tc", shutil.which("tc")), ("sshd", SSHD if os.path.exists(SSHD)
                                                                               else None),
                       ("ssh-keygen", shutil.which("ssh-keygen"))):
        if path is None:
            return f"`{tool}` not found (Debian: openssh-server, iproute2; scripts/install-system-deps.sh)"
    return None


def _run(cmd: list[str], stdin: str | None = None) -> str:
    p = subprocess.run(cmd, input=stdin, text=True, capture_output=True)
    if p.returncode != 0:
        raise StandinError(f"{' '.join(cmd)} failed: {(p.stderr or p.stdout).strip()}")
    return p.stdout


class StandinHosts:
    """N stand-in hosts under `root`. Context manager; `teardown()` is idempotent."""

    def __init__(self, n: int, root: Path, *, user: str = "root") -> None:
        self.n = n
        self.root = Path(root)
        self.user = user
        self.prefix = f"wh{secrets.token_hex(2)}"
        self.hosts: list[StandinHost] = []
        self.net = ""
        self._up = False

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def client_key(self) -> Path:
        return self.root / "keys" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "keys" / "known_hosts"

    @property
    def gateway(self) -> str:
        """This (root) namespace's address on the bridge: where a scheduler here listens for them."""
        return f"{self.net}254"

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.hosts[i].netns]

    def __enter__(self) -> StandinHosts:
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def setup(self, timeout_s: float = 30.0) -> None:
        reason = unavailable()
        if reason:
            raise StandinError(reason)
        self._up = True
        try:
            self._build(timeout_s)
        except BaseException:
            self.teardown()
            raise

    def _build(self, timeout_s: float) -> None:
        keys = self.root / "keys"
        keys.mkdir(parents=True, exist_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "wansync-standin-client", "-f",
              str(self.client_key)])
        try:
            net = claim_subnet(NET, self.bridge)
        except TcError as exc:
            raise StandinError(str(exc)) from exc
        if net is None:
            raise StandinError(f"no free {NET}k.0/24 for the stand-in hosts' bridge")
        self.net = net
        lines: list[str] = []
        for i in range(self.n):
            ns = f"{self.prefix}-h{i}"
            lines += [f"netns add {ns}",
                      f"link add {self.prefix}-v{i} type veth peer name eth0 netns {ns}",
                      f"link set {self.prefix}-v{i} master {self.bridge} up"]
            self.hosts.append(StandinHost(f"h{i}", ns, f"{self.net}{i + 1}", self.root / f"h{i}"))
        _run(["ip", "-batch", "-"], "\n".join(lines) + "\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        known = []
        for h in self.hosts:
            _run(["ip", "-n", h.netns, "-batch", "-"],
                 f"link set lo up\naddr add {h.address}/24 dev eth0\nlink set eth0 up\n")
            h.workdir.mkdir(parents=True, exist_ok=True)
            etc = h.workdir.parent / f"{h.name}-sshd"
            etc.mkdir(exist_ok=True)
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"standin-{h.name}", "-f",
                  str(etc / "host_key")])
            (etc / "authorized_keys").write_text(Path(str(self.client_key) + ".pub").read_text())
            (etc / "authorized_keys").chmod(0o600)
            (etc / "sshd_config").write_text("\n".join([
                f"ListenAddress {h.address}:22", f"HostKey {etc / 'host_key'}", f"PidFile {etc / 'sshd.pid'}",
                f"AuthorizedKeysFile {etc / 'authorized_keys'}", "StrictModes no", "UsePAM no",
                "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
                "UseDNS no", "PrintMotd no", "LogLevel ERROR", "MaxSessions 64", "MaxStartups 64",
                "Subsystem sftp internal-sftp", ""]))
            known.append(f"{h.address} {(etc / 'host_key.pub').read_text().split(' ')[0]} "
                         f"{(etc / 'host_key.pub').read_text().split(' ')[1]}")
            h.sshd = subprocess.Popen(self.exec_prefix(self.hosts.index(h)) + [SSHD, "-D", "-e", "-f",
                                                                                str(etc / "sshd_config")],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=open(etc / "sshd.log", "wb"))  # noqa: SIM115 (the child keeps it)
        self.known_hosts.write_text("\n".join(known) + "\n")
        deadline = time.monotonic() + timeout_s
        for h in self.hosts:
            while not _listening(h.address, 22):
                assert h.sshd is not None
                if h.sshd.poll() is not None:
                    log = (h.workdir.parent / f"{h.name}-sshd" / "sshd.log").read_text().strip()
                    raise StandinError(f"sshd of stand-in host {h.name} exited ({h.sshd.returncode}): {log[-500:]}")
                if time.monotonic() > deadline:
                    raise StandinError(f"sshd of stand-in host {h.name} not listening on {h.address}:22 "
                                       f"after {timeout_s:.0f} s")
                time.sleep(0.05)

    def pids(self, i: int) -> list[int]:
        """Every process in host i's namespace (sshd included)."""
        out = subprocess.run(["ip", "netns", "pids", self.hosts[i].netns], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def teardown(self) -> None:
        if not self._up:
            return
        self._up = False
        for i, h in enumerate(self.hosts):
            if h.sshd is not None and h.sshd.poll() is None:
                h.sshd.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    h.sshd.wait(5)
            for pid in self.pids(i):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            if h.sshd is not None and h.sshd.poll() is None:
                h.sshd.kill()
                h.sshd.wait()
            subprocess.run(["ip", "netns", "del", h.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        for i in range(len(self.hosts)):  # the veths went with their namespaces; make sure
            subprocess.run(["ip", "link", "del", f"{self.prefix}-v{i}"], capture_output=True)


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        try:
            s.connect((host, port))
            return True
        except OSError:
            return False
