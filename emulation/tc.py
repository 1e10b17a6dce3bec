"""The kernel backend: one network namespace per node, one veth pair per topology link, htb on every egress.

Why veth per link for every topology (full meshes too) instead of a bridge with one htb class per
destination: one code path, routes and faults (`ip link set down`) act on one device per link,
and a link's shaping is simply its device's root htb class (no u32 classification that could
silently miss a packet). A 9-node mesh is 36 veth pairs, which the kernel builds in well under a
second with `ip -batch`.

Addresses: every node's data address (10.77.0.n+1/32) lives on its `wsdata` device (a veth whose
peer stays in the namespace: torch's Gloo binds by interface name, and `lo` would hand it 127.0.0.1);
routes to every other node go `via` the next hop of the min-hop route (overlay.routing, the rule the
relays and the simulator use) over the veth to that neighbour, and IP forwarding is on. The scheduler stays in the
root namespace: every netns also has an unshaped control veth on a per-run bridge (10.254.k.0/24,
the first /24 not in use here), so agents reach the scheduler without crossing a shaped link.

Configured rates mean TCP goodput: htb counts Ethernet frames, so a class gets
rate x (MTU + 14) / (MTU - 52) (Ethernet header; IP and TCP with timestamps: 20 + 32 bytes).
Delay: this kernel has no netem, so link delay and jitter stay in the agents (a delay-only
shaper); where netem exists it could go here, but we keep one behaviour for both kernels.

Per-node caps: uplink = clsact egress on each of the node's veths -> mirred -> one ifb with an htb
class (ifb hands the packet back to the veth, whose own htb then applies the link rate);
downlink = clsact ingress -> mirred -> another ifb. Blackhole = clsact ingress on both ends ->
mirred to a sink ifb that is kept down (so dropped; this kernel has no gact `drop`).

Every name starts with the run prefix `ws<4 hex>-`; `clean()` (`wansync emu clean`) removes the
namespaces and root links of runs whose launcher is gone (owner pid files in /run/wansync).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import functools
import ipaddress
import math
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from overlay.routing import Routes

from .topotypes import Topology

PREFIX_RE = re.compile(r"^(ws[0-9a-f]{4})-")
OWNER_DIR = Path("/run/wansync")
DATA_NET = "10.77.0."
DATA_DEV = "wsdata"  # in every namespace: the device holding its data address (GLOO_SOCKET_IFNAME=wsdata)
MAX_NODES = 250
ETH_HDR = 14
IP_TCP_HDR = 20 + 32  # IPv4 + TCP with the timestamp option, as Linux sends it
MIN_QUEUE_PKTS = 32
CLONE_NEWNET = 0x40000000
# TCP congestion control in the namespaces, first that this kernel lets a netns use. Loss-based on
# purpose: the link delay lives in the agents, so TCP sees a ~10 us min RTT, and BBR (this machine's
# default) caps inflight at ~2 x rate x min_rtt: wherever ACKs wait behind data going the other way
# (10-15 ms here), it cannot fill the link. Reno/cubic fill the pfifo and keep the htb class busy.
CONGESTION_CONTROL = ("cubic", "reno")


class TcError(RuntimeError):
    """An ip/tc command failed (the message carries its stderr)."""


def wire_rate_mbps(goodput_mbps: float, mtu: int = 1500) -> float:
    """The htb rate (Ethernet frames) that carries `goodput_mbps` of TCP payload at this MTU."""
    return goodput_mbps * (mtu + ETH_HDR) / (mtu - IP_TCP_HDR)


def htb_class(rate_mbps: float, mtu: int = 1500) -> str:
    """htb rate for this goodput; burst of ~2 ms (at least 2 frames) keeps 100 ms windows smooth.
    Shared with the real-NIC shaper (emulation/nicshape.py)."""
    wire = wire_rate_mbps(rate_mbps, mtu)
    burst = max(2 * (mtu + ETH_HDR), int(wire * 1e6 / 8 * 0.002))
    return f"htb rate {wire * 1e6:.0f}bit ceil {wire * 1e6:.0f}bit burst {burst} cburst {burst} quantum {burst}"


def class_bytes(show: str) -> dict[str, int]:
    """classid -> bytes sent, from `tc -s class show dev DEV` (htb classes)."""
    out: dict[str, int] = {}
    current = None
    for line in show.splitlines():
        m = re.match(r"\s*class htb (\S+) ", line)
        if m:
            current = m.group(1)
            continue
        m = re.match(r"\s*Sent (\d+) bytes", line)
        if m and current is not None:
            out[current] = int(m.group(1))
            current = None
    return out


def _run(cmd: list[str], stdin: str | None = None, check: bool = True) -> str:
    p = subprocess.run(cmd, input=stdin, text=True, capture_output=True)
    if check and p.returncode != 0:
        raise TcError(f"{' '.join(cmd)} failed: {p.stderr.strip() or p.stdout.strip()}"
                      + (f"\n--- input ---\n{stdin}" if stdin and len(stdin) < 4000 else ""))
    return p.stdout


def _batch(tool: str, lines: Iterable[str], netns: str | None = None) -> None:
    """One `ip -batch` / `tc -batch` process for many commands (fork+exec per command is what is slow)."""
    text = "\n".join(lines)
    if text:
        _run([tool] + (["-n", netns] if netns else []) + ["-batch", "-"], text + "\n")


def unavailable() -> str | None:
    """Why the tc backend cannot run here, or None if it can."""
    if os.geteuid() != 0:
        return "the tc backend needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (install iproute2: scripts/install-system-deps.sh)"
    try:
        q = kernel_features()
    except TcError as exc:
        return f"network namespaces or veth do not work here: {exc}"
    missing = [k for k in ("htb", "pfifo", "clsact", "mirred", "ifb") if not q[k]]
    return f"the kernel lacks {', '.join(missing)}" if missing else None


@functools.cache
def kernel_features() -> dict[str, bool]:
    """Which qdiscs/actions this kernel has, probed once in a throwaway namespace."""
    ns = f"ws{secrets.token_hex(2)}-probe"
    _run(["ip", "netns", "add", ns])
    try:
        _run(["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
        have: dict[str, bool] = {}
        for q in ("htb", "pfifo", "netem", "tbf", "sfq", "fq_codel"):
            have[q] = _ok(["tc", "-n", ns, "qdisc", "replace", "dev", "p0", "root", q])
        _run(["tc", "-n", ns, "qdisc", "del", "dev", "p0", "root"], check=False)
        have["clsact"] = _ok(["tc", "-n", ns, "qdisc", "add", "dev", "p0", "clsact"])
        have["ifb"] = _ok(["ip", "-n", ns, "link", "add", "i0", "type", "ifb"])
        have["mirred"] = have["clsact"] and have["ifb"] and _ok(
            ["tc", "-n", ns, "filter", "add", "dev", "p0", "egress", "protocol", "all", "u32", "match", "u32", "0",
             "0", "action", "mirred", "egress", "redirect", "dev", "i0"])
        for cc in CONGESTION_CONTROL:  # listed as available is not enough: a netns may refuse it
            have[f"cc_{cc}"] = _ok(["ip", "netns", "exec", ns, "sh", "-c",
                                    f"echo {cc} > /proc/sys/net/ipv4/tcp_congestion_control"])
        return have
    finally:
        _run(["ip", "netns", "del", ns], check=False)


def _ok(cmd: list[str]) -> bool:
    return subprocess.run(cmd, capture_output=True).returncode == 0


def enter_netns(name: str) -> None:
    """Move the calling (single-threaded) process into a named netns: sockets made after it live there."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({name})")
    finally:
        os.close(fd)


def free_subnet(prefix: str) -> str | None:
    """The first `prefix`k.0/24 (prefix like "10.254.") no address of the root namespace is in, as
    "prefix"k."; None if all 256 are taken. To take one, use `claim_subnet`."""
    used = {ipaddress.ip_interface(a).network for a in re.findall(r"inet (\S+)", _run(["ip", "-4", "-o", "addr"]))}
    for k in range(256):
        net = ipaddress.ip_network(f"{prefix}{k}.0/24")
        if not any(net.overlaps(u) for u in used):
            return f"{prefix}{k}."
    return None


SUBNET_LOCK = OWNER_DIR / "subnets.lock"


def claim_subnet(prefix: str, bridge: str, host: int = 254) -> str | None:
    """Make `bridge` with address `prefix`k.`host`/24 on the first free k, as "prefix"k.; None if all
    256 are taken. Runs may start at the same moment (two tc runs, stand-in hosts beside a tc run): the
    choice and the address are made under one lock on this machine, so two cannot both pick k."""
    OWNER_DIR.mkdir(parents=True, exist_ok=True)
    with open(SUBNET_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        net = free_subnet(prefix)
        if net is not None:
            _batch("ip", [f"link add {bridge} type bridge", f"link set {bridge} up",
                          f"addr add {net}{host}/24 dev {bridge}"])
        return net


class TcNetwork:
    """A topology built in the kernel. Context manager; `teardown()` is idempotent and also runs at exit.

    Implements emulation.faults' LinkControl: set_rate, set_down, set_blackhole."""

    def __init__(self, topo: Topology, *, mtu: int = 1500, prefix: str | None = None) -> None:
        if topo.nodes > MAX_NODES:
            raise ValueError(f"the tc backend builds at most {MAX_NODES} namespaces, topology has {topo.nodes}")
        self.topo = topo
        self.mtu = mtu
        self.prefix = prefix or f"ws{secrets.token_hex(2)}"
        self.rates: dict[tuple[int, int], float] = {k: s.rate_mbps for k, s in topo.links.items()}
        self.ctl_net = ""
        self.features: dict[str, bool] = {}
        self._up = False

    # --- names and addresses -------------------------------------------------------------------------
    def netns_of(self, node: int) -> str:
        return f"{self.prefix}-n{node}"

    def dev(self, a: int, b: int) -> str:
        """The veth in a's namespace that leads to b."""
        return f"{self.prefix}-{a}-{b}"

    def data_addr(self, node: int) -> str:
        return f"{DATA_NET}{node + 1}"

    def ctl_addr(self, node: int) -> str:
        return f"{self.ctl_net}{node + 1}"

    @property
    def ctl_host(self) -> str:
        """The root namespace's address on the control bridge: where the scheduler listens."""
        return f"{self.ctl_net}254"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    def exec_prefix(self, node: int) -> list[str]:
        return ["ip", "netns", "exec", self.netns_of(node)]

    @property
    def congestion_control(self) -> str | None:
        """The loss-based congestion control the namespaces use (None: the kernel's default stays)."""
        return next((cc for cc in CONGESTION_CONTROL if self.features.get(f"cc_{cc}")), None)

    @property
    def delay_in_app(self) -> bool:
        """No netem here: link delay and jitter stay in the agents' delay-only shapers."""
        return True

    # --- build -------------------------------------------------------------------------------------
    def __enter__(self) -> TcNetwork:
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def setup(self) -> None:
        reason = unavailable()
        if reason:
            raise TcError(reason)
        self.features = kernel_features()
        OWNER_DIR.mkdir(parents=True, exist_ok=True)
        (OWNER_DIR / self.prefix).write_text(str(os.getpid()))
        atexit.register(self.teardown)
        self._up = True
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise

    def _build(self) -> None:
        topo, n = self.topo, self.topo.nodes
        net = claim_subnet("10.254.", self.bridge)
        if net is None:
            raise TcError("no free 10.254.k.0/24 for the control bridge")
        self.ctl_net = net
        pairs = topo.undirected()
        root = [f"netns add {self.netns_of(i)}" for i in range(n)]
        for i in range(n):
            root += [f"link add {self.prefix}-c{i} type veth peer name {self.prefix}-k{i} netns {self.netns_of(i)}",
                     f"link set {self.prefix}-c{i} master {self.bridge} up"]
        for a, b in pairs:
            root.append(f"link add {self.dev(a, b)} netns {self.netns_of(a)} type veth "
                        f"peer name {self.dev(b, a)} netns {self.netns_of(b)}")
        _batch("ip", root)
        routes = topo.routes()
        for i in range(n):
            ns = self.netns_of(i)
            _run(["ip", "netns", "exec", ns, "sh", "-c",
                  "echo 1 > /proc/sys/net/ipv4/ip_forward; echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter;"
                  " echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter;"
                  " echo 0 > /proc/sys/net/ipv4/tcp_slow_start_after_idle"  # as the app backend
                  + (f"; echo {self.congestion_control} > /proc/sys/net/ipv4/tcp_congestion_control"
                     if self.congestion_control else "")])
            # the data address sits on a device of its own, which processes that bind by interface (Gloo:
            # GLOO_SOCKET_IFNAME) can be told to use; a veth pair in the namespace, as this kernel has no dummy
            cmds = ["link set lo up", f"link add {DATA_DEV} type veth peer name {DATA_DEV}p",
                    f"link set {DATA_DEV} up", f"link set {DATA_DEV}p up",
                    f"addr add {self.data_addr(i)}/32 dev {DATA_DEV}",
                    f"addr add {self.ctl_addr(i)}/24 dev {self.prefix}-k{i}", f"link set {self.prefix}-k{i} up",
                    f"link add {self.prefix}-s{i} type ifb"]  # the blackhole sink: never up
            for j in topo.neighbors(i):
                cmds += [f"link set {self.dev(i, j)} mtu {self.mtu} up"]
            cmds += [f"route add {r}" for r in self._routes(i, routes)]
            if i in topo.uplink_mbps:
                cmds += [f"link add {self.prefix}-u{i} type ifb", f"link set {self.prefix}-u{i} up"]
            if i in topo.downlink_mbps:
                cmds += [f"link add {self.prefix}-d{i} type ifb", f"link set {self.prefix}-d{i} up"]
            _batch("ip", cmds, ns)
            _batch("tc", self._tc_node(i), ns)

    def _routes(self, i: int, routes: Routes, via: int | None = None) -> list[str]:
        """Node i's static routes (min-hop next hops), or only those over its link to `via`."""
        out = []
        for d in range(self.topo.nodes):
            if d == i:
                continue
            hop = routes.route(i, d)[1]
            if via is None or hop == via:
                out.append(f"{self.data_addr(d)}/32 via {self.data_addr(hop)} dev {self.dev(i, hop)} "
                           f"onlink src {self.data_addr(i)}")
        return out

    def _class(self, rate_mbps: float) -> str:
        return htb_class(rate_mbps, self.mtu)

    def _queue(self, rate_mbps: float, delay_s: float) -> int:
        """pfifo limit in packets: the bandwidth-delay product (round trip), at least MIN_QUEUE_PKTS."""
        bdp = rate_mbps * 1e6 / 8 * 2 * delay_s
        return max(MIN_QUEUE_PKTS, math.ceil(bdp / (self.mtu + ETH_HDR)))

    def _tc_node(self, i: int) -> list[str]:
        topo = self.topo
        cmds = []
        for cap, ifb in ((topo.uplink_mbps.get(i), f"{self.prefix}-u{i}"),
                         (topo.downlink_mbps.get(i), f"{self.prefix}-d{i}")):
            if cap is None:
                continue
            cmds += [f"qdisc add dev {ifb} root handle 1: htb default 1",
                     f"class add dev {ifb} parent 1: classid 1:1 {self._class(cap)}",
                     f"qdisc add dev {ifb} parent 1:1 handle 10: pfifo limit {self._queue(cap, 0.05)}"]
        for j in topo.neighbors(i):
            dev, spec = self.dev(i, j), topo.links[(i, j)]
            limit = self._queue(spec.rate_mbps, spec.delay_s)
            cmds += [f"qdisc add dev {dev} root handle 1: htb default 1",
                     f"class add dev {dev} parent 1: classid 1:1 {self._class(spec.rate_mbps)}",
                     f"qdisc add dev {dev} parent 1:1 handle 10: pfifo limit {limit}",
                     f"qdisc add dev {dev} clsact"]
            if i in topo.uplink_mbps:
                cmds.append(f"filter add dev {dev} egress prio 10 protocol all u32 match u32 0 0 "
                            f"action mirred egress redirect dev {self.prefix}-u{i}")
            if i in topo.downlink_mbps:
                cmds.append(f"filter add dev {dev} ingress prio 10 protocol all u32 match u32 0 0 "
                            f"action mirred egress redirect dev {self.prefix}-d{i}")
        return cmds

    def sent_bytes(self) -> dict[tuple[int, int], int]:
        """Bytes each directed link's htb class has sent so far (wire bytes, the kernel's counters):
        what any process moved across the shaped links, ours or not (a baseline's)."""
        out: dict[tuple[int, int], int] = {}
        for (a, b) in self.topo.links:
            show = _run(["tc", "-n", self.netns_of(a), "-s", "class", "show", "dev", self.dev(a, b)])
            out[(a, b)] = class_bytes(show).get("1:1", 0)
        return out

    # --- LinkControl (emulation.faults) ---------------------------------------------------------------
    def _link(self, a: int, b: int) -> None:
        if (a, b) not in self.topo.links and (b, a) not in self.topo.links:
            raise ValueError(f"no link {a}-{b} in the topology")

    def set_rate(self, src: int, dst: int, mbps: float) -> None:
        """Live: `tc class change` on src's veth towards dst (queued bytes keep their place)."""
        if (src, dst) not in self.topo.links:
            raise ValueError(f"no directed link {src}->{dst} in the topology")
        self.rates[(src, dst)] = mbps
        _run(["tc", "-n", self.netns_of(src), "class", "change", "dev", self.dev(src, dst), "parent", "1:",
              "classid", "1:1", *self._class(mbps).split()])

    def set_rates(self, rates: dict[tuple[int, int], float]) -> None:
        """Many links at once (one tc process per namespace); (node, -1) / (-1, node) is node's uplink /
        downlink cap (its ifb's class; emulation.trace.PORT)."""
        by_ns: dict[int, list[str]] = {}
        for (s, d), mbps in rates.items():
            if d == -1 or s == -1:
                node, ifb = (s, f"{self.prefix}-u{s}") if d == -1 else (d, f"{self.prefix}-d{d}")
                by_ns.setdefault(node, []).append(f"class change dev {ifb} parent 1: classid 1:1 "
                                                  f"{self._class(mbps)}")
                continue
            self.rates[(s, d)] = mbps
            by_ns.setdefault(s, []).append(f"class change dev {self.dev(s, d)} parent 1: classid 1:1 "
                                           f"{self._class(mbps)}")
        for s, cmds in by_ns.items():
            _batch("tc", cmds, self.netns_of(s))

    def set_down(self, a: int, b: int, down: bool) -> None:
        """Both directions of link a-b: the veth pair's two ends go down (or up again). Static routes:
        traffic routed over the link is lost while it is down, as on a WAN without rerouting."""
        self._link(a, b)
        for x, y in ((a, b), (b, a)):
            _run(["ip", "-n", self.netns_of(x), "link", "set", self.dev(x, y), "down" if down else "up"])
        if not down:  # the kernel dropped the static routes over the link when it went down
            routes = self.topo.routes()
            for x, y in ((a, b), (b, a)):
                _batch("ip", [f"route replace {r}" for r in self._routes(x, routes, via=y)], self.netns_of(x))

    def set_blackhole(self, a: int, b: int, on: bool) -> None:
        """Both directions of a-b silently dropped on arrival (the link stays up: only timeouts notice)."""
        self._link(a, b)
        for x, y in ((a, b), (b, a)):
            ns, dev = self.netns_of(x), self.dev(x, y)
            if on:
                _run(["tc", "-n", ns, "filter", "add", "dev", dev, "ingress", "prio", "1", "protocol", "all", "u32",
                      "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", f"{self.prefix}-s{x}"])
            else:
                _run(["tc", "-n", ns, "filter", "del", "dev", dev, "ingress", "prio", "1"], check=False)

    # --- teardown -------------------------------------------------------------------------------------
    def teardown(self) -> None:
        if not self._up:
            return
        self._up = False
        _remove_run(self.prefix)
        with contextlib.suppress(Exception):
            atexit.unregister(self.teardown)


def _remove_run(prefix: str) -> list[str]:
    """Kill what still runs in the run's namespaces, delete them and the run's root links."""
    removed = []
    for ns in _netns_names():
        if ns.startswith(prefix + "-"):
            for pid in _run(["ip", "netns", "pids", ns], check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
            _run(["ip", "netns", "del", ns], check=False)
            removed.append(ns)
    for link in _root_links():
        if link.startswith(prefix + "-"):
            _run(["ip", "link", "del", link], check=False)
            removed.append(link)
    with contextlib.suppress(FileNotFoundError):
        (OWNER_DIR / prefix).unlink()
    return removed


def _netns_names() -> list[str]:
    return [line.split()[0] for line in _run(["ip", "netns", "list"], check=False).splitlines() if line.strip()]


def _root_links() -> list[str]:
    return [line.split()[0].split("@")[0] for line in _run(["ip", "-br", "link"], check=False).splitlines()
            if line.strip()]


def owner_alive(prefix: str) -> bool:
    try:
        pid = int((OWNER_DIR / prefix).read_text())
    except (FileNotFoundError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def leftovers() -> dict[str, list[str]]:
    """Run prefix -> its namespaces and root links still present (any run, live or not)."""
    runs: dict[str, list[str]] = {}
    for name in _netns_names() + _root_links():
        m = PREFIX_RE.match(name)
        if m:
            runs.setdefault(m.group(1), []).append(name)
    return runs


def clean(force: bool = False) -> dict[str, list[str]]:
    """Remove every run whose launcher is gone (all runs with force); returns what went, per run."""
    done = {}
    for prefix in leftovers():
        if force or not owner_alive(prefix):
            done[prefix] = _remove_run(prefix)
    if OWNER_DIR.is_dir():  # owner files of runs that left nothing behind
        for f in OWNER_DIR.iterdir():
            if PREFIX_RE.match(f.name + "-") and not owner_alive(f.name):
                f.unlink(missing_ok=True)
    return done
