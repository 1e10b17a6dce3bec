"""WAN shaping on a real host's NIC: one htb class per destination, chosen by a u32 filter on the peer's IP.

`wansync deploy --shape tc` puts this on every host's egress interface (the one `ip route get PEER`
names): the link i -> j of the topology becomes the class for j's address on i's NIC, at the rate the
topology (or the trace, `change`) gives it. Traffic to anything else (SSH, the package mirror, the
launcher) matches no filter and leaves unshaped: htb sends unclassified packets directly when the
default class does not exist (`default 0`).

The shaper only writes `tc -batch` text and reads `tc -s class show`: who runs it (locally, in a
namespace, over SSH with or without sudo) is the caller's business. Rates mean TCP goodput, as in the
kernel backend (emulation/tc.py: the htb class carries rate x (MTU + 14) / (MTU - 52) of frames).
Teardown deletes the root qdisc, which puts the kernel's default back.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .tc import ETH_HDR, MIN_QUEUE_PKTS, class_bytes, htb_class  # noqa: F401 (class_bytes: re-exported)

# root qdiscs a NIC has when nobody configured it: only these may be replaced (anything else is
# someone's configuration, and the shaper refuses to overwrite it)
DEFAULT_ROOT_QDISCS = ("noqueue", "pfifo_fast", "fq_codel", "mq", "fq", "pfifo", "cake")
FIRST_MINOR = 0x10
MAX_PEERS = 0xFFFF - FIRST_MINOR


class ShapeError(ValueError):
    """The shaping asked for cannot be built (bad address, too many peers, a NIC that is not ours)."""


@dataclass
class NicShaper:
    """The classes of one host's NIC: peer address -> goodput rate (Mbit/s)."""

    dev: str
    rates: dict[str, float]
    mtu: int = 1500
    queue_delay_s: float = 0.05  # pfifo of each class: this many seconds at its rate (at least MIN_QUEUE_PKTS)
    classids: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", self.dev):
            raise ShapeError(f"{self.dev!r} is not a network interface name")
        if len(self.rates) > MAX_PEERS:
            raise ShapeError(f"at most {MAX_PEERS} peers per NIC, got {len(self.rates)}")
        for k, peer in enumerate(sorted(self.rates, key=_addr_key)):
            try:
                if ipaddress.ip_address(peer).version != 4:
                    raise ShapeError(f"peer {peer}: only IPv4 peers can be shaped (u32 match ip dst)")
            except ValueError:
                raise ShapeError(f"peer {peer!r} is not an IP address (shaping classifies by address)") from None
            if not self.rates[peer] > 0:
                raise ShapeError(f"peer {peer}: rate must be > 0 Mbit/s, got {self.rates[peer]}")
            self.classids[peer] = f"1:{FIRST_MINOR + k:x}"

    def setup(self) -> list[str]:
        """tc -batch lines: root htb (unclassified traffic unshaped), a class + pfifo + filter per peer."""
        cmds = [f"qdisc replace dev {self.dev} root handle 1: htb default 0"]
        for k, (peer, cid) in enumerate(sorted(self.classids.items(), key=lambda kv: _addr_key(kv[0]))):
            rate = self.rates[peer]
            cmds += [f"class add dev {self.dev} parent 1: classid {cid} {htb_class(rate, self.mtu)}",
                     f"qdisc add dev {self.dev} parent {cid} handle {FIRST_MINOR + k:x}: pfifo limit "
                     f"{self.queue_packets(rate)}",
                     f"filter add dev {self.dev} parent 1: protocol ip prio 1 u32 match ip dst {peer}/32 "
                     f"flowid {cid}"]
        return cmds

    def change(self, rates: Mapping[str, float]) -> list[str]:
        """tc -batch lines that move some classes to new rates (a trace step); queued bytes stay."""
        cmds = []
        for peer, mbps in rates.items():
            if peer not in self.classids:
                raise ShapeError(f"no class for peer {peer} on {self.dev}")
            self.rates[peer] = mbps
            cmds.append(f"class change dev {self.dev} parent 1: classid {self.classids[peer]} "
                        f"{htb_class(mbps, self.mtu)}")
        return cmds

    def teardown(self) -> list[str]:
        """Remove everything this shaper added: the root qdisc, its classes and filters with it."""
        return [f"qdisc del dev {self.dev} root"]

    def queue_packets(self, rate_mbps: float) -> int:
        return max(MIN_QUEUE_PKTS, math.ceil(rate_mbps * 1e6 / 8 * self.queue_delay_s / (self.mtu + ETH_HDR)))

    def to_json(self) -> dict:
        return {"dev": self.dev, "rates": self.rates, "mtu": self.mtu, "classids": self.classids}


def _addr_key(peer: str) -> tuple[int, str]:
    try:
        return int(ipaddress.ip_address(peer)), peer
    except ValueError:
        return -1, peer


def root_qdisc(show: str) -> str | None:
    """The kind of the root qdisc in `tc qdisc show dev DEV` output (None if none is listed)."""
    for line in show.splitlines():
        m = re.match(r"qdisc (\S+) \S+ root", line.strip())
        if m:
            return m.group(1)
    return None


def check_replaceable(show: str, dev: str) -> None:
    """Refuse a NIC whose root qdisc someone configured (an htb of an earlier run: `deploy --clean`)."""
    kind = root_qdisc(show)
    if kind is not None and kind not in DEFAULT_ROOT_QDISCS:
        raise ShapeError(f"{dev} already has a {kind} root qdisc (not a kernel default): shaping would replace "
                         f"someone's configuration; remove it (`tc qdisc del dev {dev} root`, or `wansync deploy "
                         "--clean` for a run whose launcher died) or run with --shape app")


def parse_route_dev(route_get: str) -> tuple[str, str | None]:
    """(device, source address) from `ip -o route get ADDR` output."""
    dev = re.search(r"\bdev (\S+)", route_get)
    if dev is None:
        raise ShapeError(f"no device in route: {route_get.strip()!r}")
    src = re.search(r"\bsrc (\S+)", route_get)
    return dev.group(1), (src.group(1) if src else None)


def parse_mtu(link_show: str) -> int:
    m = re.search(r"\bmtu (\d+)", link_show)
    return int(m.group(1)) if m else 1500
