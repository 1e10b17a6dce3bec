"""The emulated WAN as one node sees it: its links' shapers, its node caps, trace replay, link faults.

Every byte this node sends crosses the shaper of its directed link (token bucket, delay, jitter:
emulation.link) and its uplink cap; every byte it receives is charged to its downlink cap. The
shared rate trace is replayed from each job's start, so every scheme sees the same WAN. On the tc
backend the kernel shapes rates (the launcher applies the same trace there): the shapers keep only
delay and jitter, and each link sender sizes its queues from the kernel's rate instead.
The shapers and caps keep the fidelity guard's books; `link_books` and `cap_books` read them.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any

from emulation.link import MBIT, Backlogs, Downlink, LinkShaper, LinkSpec, Uplink
from emulation.topology import Topology
from emulation.trace import RateEvent, Trace
from overlay.messages import Emu
from overlay.peers import Overlay

log = logging.getLogger("wansync.agent")


class NodeWan:
    def __init__(self, node: int, topo: Topology, trace: Trace, *, shaped: bool, rate_shaping: bool,
                 now: Callable[[], float]) -> None:
        """rate_shaping=False: the kernel shapes rates and applies the trace (tc backend); the
        application keeps only link delay and jitter (this kernel has no netem). now: the synced clock."""
        self.node = node
        self.topo = topo
        self.trace = trace
        self.rate_shaping = rate_shaping
        self.now = now
        # node caps, each with the fidelity guard's books (emulation.link)
        self.uplink = (Uplink(topo.uplink_mbps[node] * MBIT)
                       if shaped and rate_shaping and node in topo.uplink_mbps else None)
        self.shapers: dict[int, LinkShaper] = {}
        self.backlogs = Backlogs()  # how many of the shapers are backlogged (busy() every loop tick)
        if shaped:
            self.shapers = {b: LinkShaper(s if rate_shaping else LinkSpec(math.inf, s.delay_s, s.jitter_s),
                                          uplink=self.uplink, seed=node * 1000 + b, backlogs=self.backlogs)
                            for (a, b), s in topo.links.items() if a == node}
        self.downlink = (Downlink(topo.downlink_mbps[node] * MBIT)
                         if shaped and rate_shaping and node in topo.downlink_mbps else None)
        # the rates this node's caps run at (the trace changes them; on tc too, where the kernel applies
        # them): what the node declares to the scheduler, which sent them when they changed
        self.cap_now: dict[str, float] = {k: m[node] for k, m in (("up", topo.uplink_mbps),
                                                                  ("down", topo.downlink_mbps)) if node in m}
        self.cap_changed = False
        # called when a cap moved: the agent declares it at once, not at its next report (a re-plan
        # waits until every node's declaration of one trace step is in)
        self.on_cap_change: Callable[[], None] | None = None
        self.overlay: Overlay | None = None
        self._cap_mark: dict[str, dict[str, float]] = {}  # the caps' books at the previous STATS
        self._trace_task: asyncio.Task | None = None

    def bind(self, overlay: Overlay) -> None:
        """The overlay built on these shapers: faults act on its sockets; on the tc backend its
        senders learn the kernel's rates."""
        self.overlay = overlay
        if not self.rate_shaping:
            for b in self.shapers:
                self.set_link_rate(b, self.topo.links[(self.node, b)].rate_mbps)

    def busy(self) -> bool:
        """This node sends (a link backlogged) or receives against its cap."""
        return self.backlogs.n > 0 or (self.downlink is not None and self.downlink.in_debt)

    @property
    def app_rate_shaping(self) -> bool:
        """The application shapes this node's rates (not the kernel, and not unshaped)."""
        return bool(self.shapers) and self.rate_shaping

    # --- rates: the trace, and who applies them ------------------------------------------------------
    def start_trace(self, t0: float) -> None:
        """Replay the shared trace from t0 for every job, so every scheme sees the same WAN."""
        if self._trace_task is not None:
            self._trace_task.cancel()
        for b in self.shapers:
            self.set_link_rate(b, self.topo.links[(self.node, b)].rate_mbps)
        for kind, caps in (("up", self.topo.uplink_mbps), ("down", self.topo.downlink_mbps)):
            if self.node in caps:
                self.set_cap_rate(kind, caps[self.node])
        mine = [e for e in self.trace.events if (e.src == self.node and e.dst in self.shapers)
                or (e.cap is not None and e.cap[0] == self.node)]
        if mine:
            self._trace_task = asyncio.create_task(self._apply_trace(t0, mine))

    async def _apply_trace(self, t0: float, events: list[RateEvent]) -> None:
        for e in events:
            wait = t0 + e.t - self.now()
            if wait > 0:
                await asyncio.sleep(wait)
            if e.cap is not None:
                self.set_cap_rate(e.cap[1], e.rate_mbps)
            else:
                self.set_link_rate(e.dst, e.rate_mbps)

    def set_cap_rate(self, kind: str, mbps: float) -> None:
        """A node cap's rate from the trace (a big switch's fluctuating port); on the tc backend the
        launcher changes the kernel's (this node has no cap bucket then). 0 is not a cap's rate."""
        cap = self.uplink if kind == "up" else self.downlink
        if cap is not None and mbps > 0:
            cap.set_rate(mbps * MBIT)
        if kind in self.cap_now and mbps > 0 and self.cap_now[kind] != mbps:
            self.cap_now[kind] = mbps
            self.cap_changed = True
            if self.on_cap_change is not None:
                self.on_cap_change()

    def set_link_rate(self, dst: int, mbps: float) -> None:
        """Our shaper paces the link; or, on the tc backend (the launcher applies the same trace to
        the kernel), the sender only sizes its queues from the rate (overlay.delayline)."""
        if self.rate_shaping:
            self.shapers[dst].set_rate(mbps)
        else:
            assert self.overlay is not None
            self.overlay.senders[dst].set_kernel_rate(mbps * MBIT)

    def stop(self) -> None:
        if self._trace_task is not None:
            self._trace_task.cancel()

    # --- faults --------------------------------------------------------------------------------------
    def emu(self, msg: Emu) -> None:
        """A link fault on the application backend (emulation.faults.AppLinkControl): rate -> this
        node's shaper of src->dst; down -> cut and refuse the peer; blackhole -> hold our direction."""
        assert self.overlay is not None
        op, a, b = msg.op, msg.src, msg.dst
        if self.node not in (a, b):
            log.warning("node %d: EMU %s for link %d-%d, which is not ours", self.node, op, a, b)
            return
        peer = b if self.node == a else a
        if peer not in self.overlay.neighbors:
            log.warning("node %d: EMU %s: node %d is not a neighbour", self.node, op, peer)
            return
        if op == "down":
            self.overlay.suspend(peer, msg.on)
            return
        shaper = self.shapers.get(peer)
        if shaper is None or not self.rate_shaping:
            log.warning("node %d: EMU %s on %d-%d ignored: the application does not shape this link",
                        self.node, op, a, b)
        elif op == "rate":
            if self.node == a:
                shaper.set_rate(msg.mbps)
        else:
            shaper.blackhole(msg.on)

    def tx_mark(self) -> tuple[float, int]:
        """(when the latest piece was written, bytes written so far) over all of this node's links, a
        pair one uplink sample can end on (agents/capprobes.py)."""
        shapers = self.shapers.values()
        return max((sh.wrote_at for sh in shapers), default=0.0), sum(sh.written_bytes for sh in shapers)

    # --- the fidelity guard's books ------------------------------------------------------------------
    def link_marks(self) -> dict[int, dict[str, float]]:
        """Every link shaper's books now (a job's start)."""
        return {b: sh.guard() for b, sh in self.shapers.items()}

    def link_books(self, dst: int, marks: dict[int, dict[str, float]]) -> dict[str, Any]:
        """Link dst's books since `marks`: configured rate, backlog, time the uplink held it or it had
        nothing to send, and achieved vs configured bytes. On the tc backend (the kernel shapes the
        rate) the books are the kernel books: what this node handed the kernel while it had data."""
        if dst not in self.shapers:
            return {}
        if not self.rate_shaping and self.shapers[dst].kernel_rate is None:
            return {}
        g, g0 = self.shapers[dst].guard(), marks[dst]
        exp = g["expected_bytes"] - g0["expected_bytes"]
        sent = g["sent_bytes"] - g0["sent_bytes"]
        held = g["held_s"] - g0["held_s"]
        idle = g["idle_s"] - g0["idle_s"]
        # backlog_s: the time the link's own rate was the limit (not the uplink's holds, which
        # are the cap's, nor waits for data to send)
        return dict(configured_mbps=g["rate_mbps"], backlog_s=g["busy_s"] - g0["busy_s"] - held - idle,
                    uplink_held_s=held, idle_s=idle, achieved_ratio=min(1.0, sent / exp) if exp > 0 else 1.0,
                    books="app" if self.rate_shaping else "kernel")

    def cap_books(self) -> dict[str, Any]:
        """The node caps' books since the previous call (the previous job's STATS)."""
        caps: dict[str, Any] = {}
        for name, cap in (("uplink", self.uplink), ("downlink", self.downlink)):
            if cap is None:
                continue
            g, g0 = cap.guard(), self._cap_mark.get(name, {})
            self._cap_mark[name] = g
            exp = g["expected_bytes"] - g0.get("expected_bytes", 0.0)
            sent = g["sent_bytes"] - g0.get("sent_bytes", 0.0)
            caps[name] = {"configured_mbps": g["rate_mbps"], "backlog_s": g["busy_s"] - g0.get("busy_s", 0.0),
                          "bytes": sent, "achieved_ratio": min(1.0, sent / exp) if exp > 0 else 1.0}
        return caps
