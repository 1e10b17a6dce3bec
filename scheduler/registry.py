"""Who is in the cluster: registered agents, their incarnations (epochs), the lost and the fenced.

An agent registers on its authenticated control connection; a newer incarnation of the same node
replaces the old one, an older or fenced one is refused (a zombie). Losing an agent fences its
epoch for good. Sending goes through here, so a closed connection is never an error of the sender:
its loss is handled where the connection ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from overlay.control import ControlConn
from overlay.messages import Fence, Peers, ProtocolError, Record, Register

log = logging.getLogger("wansync.scheduler")


@dataclass
class AgentInfo:
    node: int
    conn: ControlConn
    host: str = ""
    port: int = 0
    neighbors: tuple[int, ...] = ()
    pid: int | None = None
    versions: set[int] = field(default_factory=set)
    last_seen: float = 0.0
    epoch: int = 0  # the agent process's incarnation (HELLO); a fenced epoch never comes back
    rx_bytes: int = 0  # data-plane bytes received so far (HEARTBEAT): round progress
    stuck: dict[int, float] = field(default_factory=dict)  # peer -> seconds its chunks wait unacknowledged
    clock_offset: float | None = None  # the agent's measured offset to the scheduler's clock (REGISTER)
    clock_error: float | None = None
    uplink_mbps: float | None = None  # its configured node caps, if it has any (REGISTER)
    downlink_mbps: float | None = None
    paced: bool = False  # a training script paces it (ATTACH): its agent reports a script that stops (LEAVE)


class Registry:
    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.agents: dict[int, AgentInfo] = {}
        self.lost: dict[int, dict] = {}  # node -> when and why it was declared lost
        self.fenced: dict[int, int] = {}  # node -> highest epoch refused from now on
        self.complete = asyncio.Event()  # every expected node registered once

    def may_connect(self, node: int, role: str) -> str | None:
        """The handshake's check: a reason to refuse this node id, or None."""
        if not 0 <= node < self.expected:
            return f"unknown node {node} (cluster has nodes 0..{self.expected - 1})"
        return None

    def registered(self, a: AgentInfo) -> bool:
        """Whether this connection speaks for its node (it registered, and was not replaced since)."""
        return self.agents.get(a.node) is a

    def admit(self, a: AgentInfo, msg: Register) -> AgentInfo | None | bool:
        """REGISTER on `a`'s connection. False: refused (a zombie; its connection is closed). Else
        the incarnation it replaces (None if none); the caller declares that one lost first."""
        strangers = [n for n in msg.neighbors if not 0 <= n < self.expected or n == a.node]
        if strangers:
            raise ProtocolError(f"neighbours {strangers[:8]} are not other nodes of this cluster "
                                f"(0..{self.expected - 1})", field="neighbors", msg_type=msg.T)
        if a.epoch <= self.fenced.get(a.node, -1):
            log.warning("refused node %d: epoch %d was fenced (a zombie of a lost agent)", a.node, a.epoch)
            self.send(a, Fence(node=a.node, epoch=a.epoch))
            a.conn.close()
            return False
        old = self.agents.get(a.node)
        if old is not None and old is not a and a.epoch <= old.epoch:
            log.warning("refused node %d epoch %d: epoch %d is registered", a.node, a.epoch, old.epoch)
            a.conn.close()
            return False
        return old if old is not a else None

    def add(self, a: AgentInfo, msg: Register) -> None:
        a.host, a.port, a.pid = msg.host, msg.port, msg.pid
        a.clock_offset, a.clock_error = msg.clock_offset, msg.clock_error
        a.uplink_mbps, a.downlink_mbps = msg.uplink_mbps, msg.downlink_mbps
        a.neighbors = tuple(msg.neighbors)
        self.agents[a.node] = a
        if len(self.agents) == self.expected:
            self.complete.set()

    def remove(self, node: int, why: str) -> AgentInfo | None:
        """Declare an agent gone: its epoch is fenced from now on. None if it was not registered."""
        a = self.agents.pop(node, None)
        if a is None:
            return None
        self.fenced[node] = max(self.fenced.get(node, 0), a.epoch)
        self.lost[node] = {"t": time.time(), "why": why, "epoch": a.epoch}
        return a

    # --- sending ---------------------------------------------------------------------------------------------
    @staticmethod
    def send(a: AgentInfo, msg: Record | dict) -> bool:
        """False if its connection is closed (its loss is handled where the connection ends)."""
        try:
            a.conn.send(msg.wire() if isinstance(msg, Record) else msg)
            return True
        except ConnectionError:
            return False

    def send_to(self, node: int, msg: Record | dict) -> None:
        """To a registered agent; RuntimeError if there is none (an operator's or a fault's command)."""
        a = self.agents.get(node)
        if a is None:
            raise RuntimeError(f"node {node} is not registered")
        a.conn.send(msg.wire() if isinstance(msg, Record) else msg)

    def broadcast(self, msg: Record) -> None:
        h = msg.wire()
        for a in list(self.agents.values()):
            self.send(a, h)

    def peers(self) -> Peers:
        return Peers(peers={n: [a.host, a.port, a.epoch] for n, a in self.agents.items()})
