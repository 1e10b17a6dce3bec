"""The agent process: one node of the overlay, driven by the scheduler, all state crossing the wire.

It listens for its neighbours, dials the scheduler (authenticated handshake, clock sync, REGISTER),
and serves what the scheduler says through a dispatch table, one handler per message type; when the
scheduler goes away (or declares this incarnation lost) it drops its jobs and registers again. Its
parts: the emulated WAN as this node sees it (`wan`), passive link probes (`probes`), the round loop
of its jobs (`rounds`), the chunk engine (`engine`) and the event-loop meter (`looplag`). Every
REPORT_EVERY_S it sends a heartbeat, the link samples gathered so far and its byte counters; caps
its trace moved it declares at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from core.dispatch import DISPATCH, Dispatch
from core.plan import Plan, PlanError
from emulation.link import LinkShaper
from emulation.topology import Topology
from emulation.trace import Trace
from overlay.auth import AuthError, Handshake, TlsFiles
from overlay.clock import SyncedClock
from overlay.control import ControlConn
from overlay.messages import (
    Abort,
    Attach,
    Attached,
    AuxUpdate,
    Clock,
    Counters,
    Drop,
    Emu,
    Fence,
    Go,
    Heartbeat,
    Job,
    JobEnd,
    Leave,
    Peers,
    Probe,
    Rates,
    Record,
    Register,
    Report,
    Shutdown,
    Task,
    decode,
)
from overlay.peers import Overlay

from .capprobes import CapProbes
from .engine import ChunkEngine
from .handoff import STALL_S, Handoff, socket_path
from .linkprobe import ProbeSender
from .looplag import LoopLag
from .probes import LinkProbes
from .rounds import RoundLoop
from .tasks import TaskRunner
from .wan import NodeWan

log = logging.getLogger("wansync.agent")

REPORT_EVERY_S = 0.25
CLOCK_EXCHANGES = 5


class Agent:
    def __init__(self, node: int, cluster: str, scheduler: tuple[str, int], topo: Topology, *,
                 trace: Trace | None = None, shaped: bool = True, host: str = "127.0.0.1",
                 listen_port: int = 0, dispatch: Dispatch = DISPATCH, probe_bytes: int | None = None,
                 probe_num: int | None = None, primary_busy_bound: int | None = None,
                 aux_queue_length: int | None = None, clock_skew: float = 0.0,
                 clock_sync: bool = True, rate_shaping: bool = True,
                 secret: bytes | None = None,
                 scheduler_wait_s: float = 30.0, tls: TlsFiles | None = None, hold_budget: int | None = None,
                 advertise: tuple[str, int] | None = None, handoff: tuple[str, str] | None = None,
                 script_stall_s: float = STALL_S) -> None:
        """dispatch: NetStorm's knobs (core.dispatch); probe_bytes, probe_num, primary_busy_bound and
        aux_queue_length override one of them each where given (the CLI's flags).
        rate_shaping=False: the kernel shapes rates and applies the trace (tc backend); the
        application keeps only link delay and jitter (this kernel has no netem).
        advertise: the (host, port) peers should dial, registered instead of the listening address
        (a cloud VM behind NAT listens on a private address; port 0: the port it listens on).
        handoff: (private directory, per-run token) of the channel a training script attaches by
        (agents.handoff); None: no channel. script_stall_s: the least time a round waits for the attached
        script's next step before the script counts as hung (agents.handoff.STALL_S)."""
        self.rate_shaping = rate_shaping
        self.secret = secret  # cluster secret (overlay.auth); None: unauthenticated (--insecure)
        self.tls = tls
        self.node = node
        self.cluster = cluster
        self.scheduler = scheduler
        self.topo = topo
        self.host = host
        self.listen_port = listen_port
        self.advertise = advertise
        self.clock = SyncedClock(clock_skew)
        self.clock_sync = clock_sync
        self.dispatch = dispatch.but(primary_busy_bound=primary_busy_bound, aux_queue_length=aux_queue_length,
                                     probe_chunk_bytes=probe_bytes, probe_num=probe_num)
        self.engine = ChunkEngine(node, topo.routes(), dispatch=self.dispatch)
        if hold_budget is not None:
            self.engine.hold_budget = hold_budget
        probe_bytes, probe_num = self.dispatch.probe_chunk_bytes, self.dispatch.probe_num
        self.probes = LinkProbes(self.clock.now, probe_bytes, probe_num,
                                 rx_bytes=lambda src: self.overlay.meters_in[src].bytes)
        self.wan = NodeWan(node, topo, trace or Trace(), shaped=shaped, rate_shaping=rate_shaping,
                           now=self.clock.now)
        self._declaring = False  # a REPORT declaring moved caps is on its way (_declare_soon)
        self.wan.on_cap_change = self._declare_soon
        self.caps = CapProbes(node, self.clock.now, up=node in topo.uplink_mbps, down=node in topo.downlink_mbps,
                              rx_total=lambda: sum(m.bytes for m in self.overlay.meters_in.values()),
                              tx_mark=self.wan.tx_mark,
                              sending=lambda: self.wan.backlogs.n > 0, probe_bytes=probe_bytes, probe_num=probe_num)
        self.overlay = Overlay(node, cluster, self.engine, neighbors=topo.neighbors(node), pacers=self.wan.shapers,
                               downlink=self.wan.downlink, host=host, on_sample=self._on_sample,
                               clock=self.clock.now, secret=secret, tls=tls)
        self.engine.overlay = self.overlay
        self.prober = ProbeSender(node, self.overlay, self._send)
        self.wan.bind(self.overlay)
        self.plans: dict[int, Plan] = {}
        self.engine.plans = self.plans
        self.ctl: ControlConn | None = None
        # the loop counts as busy while this node sends (a link backlogged) or receives against its cap
        self.lag = LoopLag(busy=self.wan.busy)
        self.epoch = self.overlay.epoch  # this process's incarnation: a restarted agent is a newer one
        self.live_peers: set[int] = set()
        self.scheduler_wait_s = scheduler_wait_s
        self._seen = (0, 0)  # highest job id and plan version seen (a restarted scheduler starts above)
        self.runner = TaskRunner(node, self.engine, self.overlay, self.clock, self.plans, send=self._send,
                                 flush_samples=self._flush_samples)
        self.rounds = RoundLoop(node, self.engine, self.overlay, self.wan, self.lag, self.clock, self.plans,
                                self.runner, send=self._send, live_peers=lambda: self.live_peers)
        self.handoff = (Handoff(socket_path(handoff[0], node), handoff[1], node, self._attach, now=self.clock.now,
                                stall_s=script_stall_s, on_gone=self._script_gone)
                        if handoff is not None else None)
        self.rounds.handoff = self.handoff
        self._verdict: asyncio.Future[Attached] | None = None
        # what the scheduler may say, and who handles it; a handler's "shutdown", "fenced" or "lost"
        # ends this connection; other types are ignored
        self._handlers: dict[type[Record], Callable[[Any], str | None]] = {
            Shutdown: lambda _msg: "shutdown", Peers: self._on_peers, Fence: self._on_fence, Job: self._on_job,
            JobEnd: lambda msg: self.runner.end_job(msg.job), Task: self._on_task, AuxUpdate: self._on_aux_update,
            Rates: self._on_rates, Emu: self._on_emu, Abort: self._on_abort,
            Go: lambda msg: self.runner.on_go(msg.job, msg.upto), Attached: self._on_attached,
            Probe: self.prober.order,
            Drop: lambda msg: self.runner.on_drop(msg.job, msg.task, msg.attempt, msg.node,
                                                   bool(msg.replicates))}

    @property
    def shapers(self) -> dict[int, LinkShaper]:
        """This node's link shapers by destination (the emulated WAN's)."""
        return self.wan.shapers

    @property
    def params(self) -> np.ndarray | None:
        """The model this agent keeps (updated with each round's result)."""
        return self.rounds.params

    async def run(self) -> None:
        port = await self.overlay.listen(self.listen_port)
        self.lag.start()
        self.caps.start()
        reporter = asyncio.create_task(self._report_loop())
        if self.handoff is not None:
            self.handoff.start()
        ctl: ControlConn | None = None
        try:
            ctl = await self._connect(port)
            while (end := await self._serve_scheduler(ctl)) != "shutdown":
                # the scheduler went away (crashed, restarted), or declared this incarnation lost (it was
                # frozen, or starved): drop its jobs, wait for it, register again
                self.rounds.abandon()
                ctl.close()
                if end == "fenced":  # everyone refuses the old epoch now: come back as a new incarnation
                    self.epoch = self.overlay.new_incarnation()
                    log.warning("node %d: the scheduler declared us lost (silent too long); rejoining as "
                                "incarnation %d", self.node, self.epoch)
                    if self.handoff is not None:  # its steps belong to rounds that went on without us
                        self.handoff.drop(f"its agent (node {self.node}) was declared lost by the scheduler "
                                          "and rejoins as a new incarnation; restart the script to rejoin")
                else:
                    log.warning("node %d: lost the scheduler; waiting up to %.0f s for it", self.node,
                                self.scheduler_wait_s)
                ctl = await self._connect(port, wait_s=self.scheduler_wait_s)
                if ctl is None:
                    log.error("node %d: no scheduler for %.0f s; leaving", self.node, self.scheduler_wait_s)
                    break
        finally:
            reporter.cancel()
            if self.handoff is not None:
                self.handoff.close()
            self.rounds.cancel()
            self.lag.stop()
            self.caps.stop()
            self.prober.stop()
            self.wan.stop()
            await self.overlay.close()
            if ctl is not None:
                ctl.close()
            await asyncio.gather(reporter, return_exceptions=True)  # cancelled: awaited, never left pending

    # --- the control connection ----------------------------------------------------------------------
    async def _connect(self, port: int, wait_s: float | None = None) -> ControlConn | None:
        """Dial, authenticate, sync clocks, register. First time: fail loudly. After losing the
        scheduler: retry with backoff for up to wait_s, then give up (None)."""
        deadline, backoff = time.time() + (wait_s or 0.0), 0.1
        while True:
            try:
                ctl = await ControlConn.connect(*self.scheduler,
                                                ssl=self.tls.client_context() if self.tls else None)
            except (OSError, TimeoutError) as exc:
                if wait_s is None:
                    raise ConnectionError(f"node {self.node}: cannot reach the scheduler: {exc}") from None
                if time.time() > deadline:
                    return None
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
                continue
            try:  # HELLO both ways, then HMAC proofs both ways (overlay/auth.py)
                await ctl.handshake(Handshake(self.cluster, self.node, "agent", dialer=True, secret=self.secret,
                                              expect=-1, peer_role="scheduler", hello_extra={"epoch": self.epoch}))
            except (AuthError, TimeoutError) as exc:
                why = exc.reason if isinstance(exc, AuthError) else "no handshake reply in time"
                raise ConnectionError(f"node {self.node}: the scheduler refused us or failed authentication: "
                                      f"{why}") from None
            if self.clock_sync:
                await self._sync_clock(ctl)
            # a restarted scheduler numbers jobs and versions above what any agent has seen
            host, adv_port = self.advertise if self.advertise is not None else (self.host, 0)
            synced = self.clock_sync and self.clock.error_bound != float("inf")
            ctl.send(Register(node=self.node, host=host, port=adv_port or port,
                              neighbors=self.topo.neighbors(self.node), pid=os.getpid(), seen_job=self._seen[0],
                              seen_version=max(self.plans, default=self._seen[1]),
                              clock_offset=self.clock.offset if synced else None,
                              clock_error=self.clock.error_bound if synced else None,
                              uplink_mbps=self.topo.uplink_mbps.get(self.node),
                              downlink_mbps=self.topo.downlink_mbps.get(self.node)).wire())
            # only now do heartbeats, counters and samples go out on it: before REGISTER each of them is
            # a protocol error at the scheduler, and a clock exchange that a loaded machine makes slow
            # (seconds) used to reach the limit of 16 and lose the agent before it ever registered
            self.ctl = ctl
            return ctl

    async def _sync_clock(self, ctl: ControlConn, exchanges: int = CLOCK_EXCHANGES) -> None:
        """Cristian: a few CLOCK round trips to the scheduler, keep the shortest."""
        got = []
        for _ in range(exchanges):
            t0 = self.clock.local()
            ctl.send(Clock(t0=t0).wire())
            header = await ctl.recv()
            reply = decode(header) if header is not None else None
            if not isinstance(reply, Clock) or reply.t1 is None:
                raise ConnectionError(f"node {self.node}: no clock reply from the scheduler")
            got.append((t0, reply.t1, self.clock.local()))
        offset = self.clock.update(got)
        log.info("node %d: clock offset %+.6f s (+- %.6f)", self.node, offset, self.clock.error_bound)

    def _send(self, msg: Record) -> None:
        """A message to the scheduler (raises ConnectionError if the connection is closed)."""
        assert self.ctl is not None
        self.ctl.send(msg.wire())

    async def _serve_scheduler(self, ctl: ControlConn) -> str:
        """Messages from the scheduler until it says SHUTDOWN ("shutdown"), fences this incarnation
        ("fenced") or the connection ends ("lost")."""
        ctl.immediate = self._immediate
        try:
            while True:
                msg = await ctl.recv()
                if msg is None:
                    return "lost"
                try:
                    handler = self._handlers.get(type(rec := decode(msg)))
                    end = handler(rec) if handler is not None else None
                except (PlanError, ValueError, KeyError, TypeError) as exc:  # never half-alive: start over
                    log.error("node %d: the scheduler's %s could not be used (%s: %s); reconnecting", self.node,
                              msg["t"], type(exc).__name__, exc)
                    return "lost"
                if end is not None:
                    return end
        finally:
            ctl.immediate = None

    def _immediate(self, header: dict[str, Any]) -> bool:
        """A TASK is handled as its frame is read, not a loop turn later (see TaskRunner.on_task): the
        peers that had theirs first already send to this node. One that cannot be used is left to the
        serve loop, which meets the same error and reconnects."""
        if header.get("t") != "TASK":
            return False
        try:
            rec = decode(header)
            assert isinstance(rec, Task)
            plan = self._task_plan(rec)
        except (PlanError, ValueError, KeyError, TypeError):
            return False
        self.runner.on_task(rec, plan)
        return True

    # --- what the scheduler says ---------------------------------------------------------------------
    def _on_peers(self, msg: Peers) -> None:
        peers = {int(n): (v[0], v[1]) for n, v in msg.peers.items()}
        self.live_peers = set(peers) & self.overlay.neighbors
        self.overlay.connect(peers)

    def _on_fence(self, msg: Fence) -> str | None:
        if msg.node == self.node:
            return "fenced" if msg.epoch == self.epoch else "lost"
        # a lost agent's incarnation: cut it off, never accept it again
        self.live_peers.discard(msg.node)
        self.overlay.fence(msg.node, msg.epoch)
        return None

    def _on_job(self, msg: Job) -> None:
        self._seen = (max(self._seen[0], msg.job), self._seen[1])
        self.engine.open_job(msg.job, msg.start or 0, 1 if msg.ahead is None else msg.ahead)
        self.rounds.start(msg)

    def _on_task(self, msg: Task) -> None:
        self.runner.on_task(msg, self._task_plan(msg))

    def _task_plan(self, msg: Task) -> Plan | None:
        """A TASK's plan, checked here, where a bad one ends the connection, not the task (None: this
        node holds that version)."""
        plan = Plan.from_wire(msg.plan).validate() if msg.plan is not None else None
        if plan is None and not msg.skip and msg.version not in self.plans:
            raise ValueError(f"task {msg.task} uses plan v{msg.version}, which this node does not hold")
        return plan

    def _on_rates(self, msg: Rates) -> None:
        self.engine.set_rates(msg.job, msg.task, msg.attempt, msg.rates)

    def _on_aux_update(self, msg: AuxUpdate) -> None:
        self.engine.set_aux_wire(msg.version, msg.groups)

    def _on_emu(self, msg: Emu) -> None:
        self.wan.emu(msg)

    def _on_abort(self, msg: Abort) -> None:
        self.runner.on_abort(msg.job, msg.task, msg.attempt)

    async def _attach(self, layout: dict[str, Any]) -> tuple[bool, str, int]:
        """A script attached here: the scheduler compares every rank's model before any job moves it."""
        if self.ctl is None:
            return False, "the agent has no scheduler yet", 0
        if self._verdict is not None and not self._verdict.done():
            self._verdict.cancel()
        self._verdict = asyncio.get_running_loop().create_future()
        self._send(Attach(node=self.node, layout=layout))
        reply = await self._verdict
        return reply.ok, reply.error or "", reply.world, bool(reply.rejoin)

    def _script_gone(self, why: str, ended: bool) -> None:
        """The script died or stopped calling step() (or ended: said goodbye): this node leaves the job
        (LEAVE) until one attaches again; the scheduler aborts its round (not for an end) and goes on."""
        if self.ctl is not None:
            try:
                self._send(Leave(node=self.node, why=why, ended=ended or None))
            except ConnectionError:
                pass

    def _on_attached(self, msg: Attached) -> None:
        if self._verdict is not None and not self._verdict.done():
            self._verdict.set_result(msg)

    # --- what this node reports ----------------------------------------------------------------------
    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            self._heartbeat()
            self._flush_samples()
            self._send_counters()

    def _heartbeat(self) -> None:
        """Liveness and progress: bytes received tell the scheduler a round still moves."""
        if self.ctl is not None:
            rx = sum(m.bytes for m in self.overlay.meters_in.values())
            now = time.monotonic()
            waits = {b: s.stuck_s(now) for b, s in self.overlay.senders.items()}
            stuck = [[b, round(w, 3)] for b, w in waits.items() if w > 0]
            try:
                self.ctl.send(Heartbeat(node=self.node, time=self.clock.now(), rx=rx, stuck=stuck).wire())
            except ConnectionError:
                pass

    def _send_counters(self) -> None:
        """Cumulative bytes per outgoing link: the scheduler turns them into live throughput and metrics."""
        if self.ctl is not None:
            links = {b: s.meter.bytes for b, s in self.overlay.senders.items()}
            try:
                self.ctl.send(Counters(node=self.node, time=self.clock.now(), links=links).wire())
            except ConnectionError:
                pass

    def _on_sample(self, src: int, dst: int, nbytes: int, seconds: float, probe: bool = False) -> None:
        """A chunk (or an active probe's) arrived: evidence of its link and of this node's downlink cap."""
        self.probes.sample(src, dst, nbytes, seconds, probe)
        self.caps.chunk(src, dst, nbytes, seconds)

    def _declare_soon(self) -> None:
        """A trace moved this node's caps: the REPORT that declares them goes now, once for the moves of
        one trace step (its uplink and downlink move in one step of the loop), not up to REPORT_EVERY_S
        later: a re-plan waits until every node's declaration of the step is in (scheduler/versions.py
        PORT_SETTLE_S), so the last node's report set when the new plan could start."""
        if self._declaring:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop yet: the next report declares it
            return
        self._declaring = True
        loop.call_soon(self._declare_now)

    def _declare_now(self) -> None:
        self._declaring = False
        self._flush_samples()

    def _flush_samples(self) -> None:
        """Passive link and cap samples gathered so far, in one REPORT."""
        if self.ctl is None:
            return
        report, caps = self.probes.report(self.node), self.caps.take()
        declared = None
        if self.wan.cap_changed:  # a trace moved this node's caps: the scheduler's view follows
            self.wan.cap_changed = False
            declared = [self.wan.cap_now.get("up"), self.wan.cap_now.get("down")]
        if caps or declared:
            report = Report(node=self.node, samples=report.samples if report else [], caps=caps or None,
                            declared=declared)
        if report is not None:
            try:
                self.ctl.send(report.wire())
            except ConnectionError:
                pass
