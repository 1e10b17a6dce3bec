"""Who shapes the links of a local run: the agents themselves (`app`: token buckets in every sender)
or the kernel (`tc`: a network namespace per node, htb per link, emulation/tc.py).

A backend says where the scheduler listens, how an agent is started, who realises link faults, and
what happens when a job starts (the kernel replays the run's trace from that job's t0, as the
application shapers do in the agents).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from rich.console import Console

from emulation.faults import LinkControl
from emulation.tc import DATA_DEV, TcNetwork
from emulation.topology import Topology
from emulation.trace import Trace


def agent_command(options_file: Path, node: int, scheduler: str) -> list[str]:
    """An agent process: the run's options file, and what is its own (node id, the scheduler's address
    as it reaches it). The cluster secret goes in the environment or its file, never in argv (ps)."""
    return [sys.executable, "-m", "wansync.cli", "agent", "--options", str(options_file), "--node", str(node),
            "--scheduler", scheduler]


class AppBackend:
    """The application shapes every link; faults reach the agents as EMU messages (the default)."""

    name = "app"
    scheduler_host = "127.0.0.1"
    data_ifname: str | None = None  # the interface holding a node's data address, where it has its own
    agent_shaping = "app"  # agents emulate rates and delays (wansync.options SHAPING)

    async def setup(self) -> None:
        pass

    def agent_command(self, options_file: Path, node: int, port: int) -> list[str]:
        return agent_command(options_file, node, f"{self.scheduler_host}:{port}")

    def link_control(self) -> LinkControl | None:
        return None

    def exec_prefix(self, node: int) -> list[str]:
        """What starts a process beside node's agent (a training script): nothing here."""
        return []

    def sent_bytes(self) -> dict[tuple[int, int], int]:
        """Bytes the kernel's shapers sent per directed link ({}: nothing shapes here but our agents)."""
        return {}

    def data_host(self, node: int) -> str:
        """Node's data address, as a process beside its agent reaches the others (torch's MASTER_ADDR)."""
        return "127.0.0.1"

    def on_job(self, t0: float) -> None:
        pass

    def teardown(self) -> None:
        pass


class TcBackend(AppBackend):
    """The kernel shapes every link: agents run in their namespaces and keep only delay and jitter."""

    name = "tc"
    data_ifname = DATA_DEV  # torch's Gloo binds by interface name (GLOO_SOCKET_IFNAME)

    def __init__(self, topo: Topology, trace: Trace | None, console: Console) -> None:
        self.topo = topo
        self.trace = trace
        self.console = console
        self.net = TcNetwork(topo)
        self._trace_task: asyncio.Task | None = None

    async def setup(self) -> None:
        await asyncio.to_thread(self.net.setup)
        self.console.print(f"tc backend: run {self.net.prefix}, {self.topo.nodes} namespaces, one shaped veth pair "
                           "per link; no netem in this kernel, so link delay and jitter stay in the agents")

    @property
    def scheduler_host(self) -> str:  # type: ignore[override]
        return self.net.ctl_host

    agent_shaping = "delay-only"  # the kernel shapes rates; delay and jitter stay in the agents

    def agent_command(self, options_file: Path, node: int, port: int) -> list[str]:
        """The same agent inside its namespace: scheduler over the unshaped control bridge, data on its
        netns address (so agent-to-agent bytes cross the shaped veths)."""
        cmd = agent_command(options_file, node, f"{self.net.ctl_host}:{port}")
        return self.net.exec_prefix(node) + cmd + ["--listen", f"{self.net.data_addr(node)}:0"]

    def exec_prefix(self, node: int) -> list[str]:
        """Inside node's namespace: its bytes to other nodes cross the shaped veths."""
        return self.net.exec_prefix(node)

    def data_host(self, node: int) -> str:
        return self.net.data_addr(node)

    def sent_bytes(self) -> dict[tuple[int, int], int]:
        return self.net.sent_bytes()

    def link_control(self) -> LinkControl | None:
        return self.net if hasattr(self.net, "set_blackhole") else None  # type: ignore[return-value]

    def on_job(self, t0: float) -> None:
        if self.trace is None or not self.trace.events:
            return
        if self._trace_task is not None:
            self._trace_task.cancel()
        self._trace_task = asyncio.ensure_future(apply_trace(self.net, self.topo, self.trace, t0))

    def teardown(self) -> None:
        if self._trace_task is not None:
            self._trace_task.cancel()
        self.net.teardown()


async def apply_trace(net: TcNetwork, topo: Topology, trace: Trace, t0: float) -> None:
    """The run's trace, applied to the kernel (`tc class change`) from a job's t0, as agents would."""
    start = {k: s.rate_mbps for k, s in topo.links.items()}  # every link and node cap as configured
    start.update({(n, -1): m for n, m in topo.uplink_mbps.items()})
    start.update({(-1, n): m for n, m in topo.downlink_mbps.items()})
    await asyncio.to_thread(net.set_rates, start)
    events = sorted(trace.events)
    i = 0
    while i < len(events):
        t = events[i].t
        batch = {}
        while i < len(events) and events[i].t == t:
            batch[(events[i].src, events[i].dst)] = events[i].rate_mbps
            i += 1
        await asyncio.sleep(max(0.0, t0 + t - time.time()))
        await asyncio.to_thread(net.set_rates, batch)
