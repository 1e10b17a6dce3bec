"""Which machines a deployment uses: an inventory file (TOML) or `-H user@host1,user@host2:2222,...`.

    [defaults]                  # every field of a host may be given here once
    user = "ubuntu"
    identity = "~/.ssh/wansync_ed25519"
    workdir = "~/.wansync"      # install prefix (workdir/venv) and run directories (workdir/runs/RUN)

    [[hosts]]
    host = "203.0.113.10"       # where SSH connects (name or address)
    address = "203.0.113.10"    # what peers and agents dial (default: the address SSH connected to)
    name = "us-east"            # in messages and log names (default: host)

    [[hosts]]
    host = "eu.example.org"
    port = 2222                 # SSH port
    sudo = true                 # tc through `sudo -n` (--shape tc as a user that is not root)

Node i of the topology runs on the i-th host; the first one also runs the scheduler (unless
`--scheduler-here`). Fields: host, user, port, name, address, listen (data-plane bind address,
default 0.0.0.0), agent_port (default 7071), scheduler_port (default 7070), python (default
python3), workdir, identity, sudo, nic (the interface --shape tc shapes; default: the one the route
to the peers uses), tls_cert and tls_key (this host's certificate, default the run's --tls-cert/-key).
"""

from __future__ import annotations

import argparse
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

DEFAULT_AGENT_PORT = 7071
DEFAULT_SCHEDULER_PORT = 7070


class InventoryError(ValueError):
    """A malformed inventory or host list (the message names the entry and the field)."""


@dataclass
class HostSpec:
    host: str
    user: str | None = None
    port: int = 22
    name: str = ""
    address: str | None = None
    listen: str = "0.0.0.0"
    agent_port: int = DEFAULT_AGENT_PORT
    scheduler_port: int = DEFAULT_SCHEDULER_PORT
    python: str = "python3"
    workdir: str = "~/.wansync"
    identity: str | None = None
    sudo: bool = False
    nic: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def __post_init__(self) -> None:
        self.name = self.name or self.host

    @property
    def target(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}{'' if self.port == 22 else f':{self.port}'}"


_FIELDS = {f.name: f for f in fields(HostSpec)}
_INTS = ("port", "agent_port", "scheduler_port")
_SAFE = re.compile(r"^[A-Za-z0-9_.:@%+\-\[\]]+$")  # hosts, users, addresses: nothing a shell would read


def _host(entry: dict[str, Any], where: str) -> HostSpec:
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise InventoryError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(_FIELDS)})")
    if not isinstance(entry.get("host"), str) or not entry["host"]:
        raise InventoryError(f"{where}: `host` (where SSH connects) is required")
    for k in _INTS:
        if k in entry and (not isinstance(entry[k], int) or isinstance(entry[k], bool) or not 0 < entry[k] < 65536):
            raise InventoryError(f"{where}: {k} must be a port number, got {entry[k]!r}")
    if "sudo" in entry and not isinstance(entry["sudo"], bool):
        raise InventoryError(f"{where}: sudo must be true or false")
    for k in ("host", "user", "address", "listen", "name", "nic"):
        if k in entry and (not isinstance(entry[k], str) or not _SAFE.match(entry[k])):
            raise InventoryError(f"{where}: {k} {entry[k]!r} has characters a host name or address cannot have")
    for k in ("python", "workdir", "identity", "tls_cert", "tls_key"):
        if k in entry and not isinstance(entry[k], str):
            raise InventoryError(f"{where}: {k} must be a string")
    return HostSpec(**entry)


def load(path: Path) -> list[HostSpec]:
    """An inventory file: [defaults] and one [[hosts]] table per host, in node order."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InventoryError(f"inventory {path}: {exc}") from None
    unknown = sorted(set(data) - {"defaults", "hosts"})
    if unknown:
        raise InventoryError(f"inventory {path}: unknown table(s) {', '.join(unknown)} (expected [defaults], "
                             "[[hosts]])")
    defaults = data.get("defaults", {})
    hosts = data.get("hosts", [])
    if not isinstance(defaults, dict) or not isinstance(hosts, list) or not hosts:
        raise InventoryError(f"inventory {path}: needs at least one [[hosts]] table")
    specs = [_host({**defaults, **h}, f"inventory {path}, host #{i + 1}") for i, h in enumerate(hosts)]
    return _checked(specs)


def parse_hosts(text: str, defaults: dict[str, Any] | None = None) -> list[HostSpec]:
    """-H user@host1,host2:2222,... (as horovodrun's -H): SSH targets in node order."""
    specs = []
    for i, item in enumerate(x.strip() for x in text.split(",")):
        if not item:
            continue
        user, _, rest = item.rpartition("@")
        host, port = rest, None
        m = re.match(r"^\[(.+)\](?::(\d+))?$", rest) or re.match(r"^([^:]+)(?::(\d+))?$", rest)
        if m:
            host, port = m.group(1), m.group(2)
        entry: dict[str, Any] = {**(defaults or {}), "host": host}
        if user:
            entry["user"] = user
        if port:
            entry["port"] = int(port)
        specs.append(_host(entry, f"-H entry #{i + 1} ({item!r})"))
    if not specs:
        raise InventoryError("-H: no hosts given")
    return _checked(specs)


def _checked(specs: list[HostSpec]) -> list[HostSpec]:
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    for i, s in enumerate(specs):  # two agents on one machine: tell them apart in messages and log names
        if s.name in dup:
            s.name = f"{s.name}#{i}"
    return specs


SHAPES = ("app", "tc", "none")


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    """`wansync deploy`'s own flags: which hosts, how to reach them, how to run there. They are the
    launcher's, not the run's options: no host process reads them."""
    g = parser.add_argument_group("hosts")
    g.add_argument("--inventory", type=Path, default=None, metavar="FILE",
                   help="hosts.toml (docs/real-hosts.md)")
    g.add_argument("-H", "--hosts", default=None, metavar="USER@HOST,...",
                   help="hosts in node order, instead of an inventory (as horovodrun -H)")
    g.add_argument("--known-hosts", type=Path, default=None, metavar="FILE",
                   help="host keys to check against (default ~/.ssh/known_hosts)")
    g.add_argument("--accept-new-host-keys", action="store_true",
                   help="trust hosts never seen before and add them to known_hosts (a changed key is refused)")
    g.add_argument("--identity", default=None, metavar="KEY",
                   help="SSH private key for every host (default: ssh-agent, ~/.ssh/id_*)")
    g.add_argument("--wheelhouse", type=Path, default=None, metavar="DIR",
                   help="install from these wheels (wansync + dependencies) instead of building them here")
    g.add_argument("--scheduler-here", action="store_true",
                   help="run the scheduler in this process instead of on the first host")
    g.add_argument("--scheduler-address", default=None, metavar="HOST",
                   help="with --scheduler-here: the address hosts dial to reach it (default: this machine's "
                        "address as each SSH connection sees it)")
    g.add_argument("--shape", choices=SHAPES, default="app",
                   help="app: agents emulate the topology's links (default, as `wansync run`); tc: per-destination "
                        "htb classes on each host's NIC, rates from the topology/trace; none: the real network")
    g.add_argument("--no-shaping", dest="shape", action="store_const", const="none", help="= --shape none")
    g.add_argument("--clean", action="store_true",
                   help="remove what runs whose launcher died left on the hosts (processes, shaping, run dirs)")
    g.add_argument("--force", action="store_true", help="--clean: also runs whose launcher is still alive")
