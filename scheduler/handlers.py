"""What agents say: the control port's dispatch table (message type -> handler) and the handlers.

Only REGISTER may come before registering; every other message speaks for the node that registered
on that connection, and for no other (a record that names a node declares it: Record.SPEAKS_FOR)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from core.capshare import CapSharing
from overlay.messages import (
    Abort,
    Attach,
    Counters,
    Heartbeat,
    Leave,
    ProbeDone,
    ProtocolError,
    Ready,
    Record,
    Register,
    Report,
    Stats,
    TaskDone,
)

from .attach import Attachments
from .control import ModelControl
from .events import Observed
from .failures import Failures
from .prober import Prober
from .records import Records
from .registry import AgentInfo, Registry
from .tasks import JobState
from .versions import Versions
from .view import NetworkView

log = logging.getLogger("wansync.scheduler")

Handler = Callable[[AgentInfo, Any], None]


class Host(Observed, Protocol):
    """The scheduler's state the handlers read and write."""

    current: JobState | None
    job_id: int  # never below what an agent saw from an earlier scheduler
    errors: list[str]
    link_bytes: dict[tuple[int, int], int]
    prober: Prober  # active probes of idle links: PROBE_DONE frees a probe's slot


class Handlers:
    def __init__(self, registry: Registry, view: NetworkView, versions: Versions, cap_sharing: CapSharing,
                 records: Records, failures: Failures, control: ModelControl, host: Host, *,
                 attachments: Attachments | None = None) -> None:
        self.registry = registry
        self.view = view
        self.versions = versions
        self.cap_sharing = cap_sharing
        self.records = records
        self.failures = failures
        self.control = control
        self.host = host
        self.attachments = attachments

    def table(self) -> dict[type[Record], Handler]:
        """The dispatch table: message type -> handler."""
        def registered(handler: Handler) -> Handler:
            def checked(a: AgentInfo, msg: Any) -> None:
                if not self.registry.registered(a):  # an authenticated connection that did not register
                    raise ProtocolError(f"{msg.T} from node {a.node}, which has not registered on this "
                                        "connection", msg_type=msg.T)
                if msg.SPEAKS_FOR and msg.node != a.node:
                    raise ProtocolError(f"node {a.node} speaks for node {msg.node}", field="node", msg_type=msg.T)
                handler(a, msg)
            return checked
        return {Register: self.on_register, Ready: registered(self.on_ready),
                Report: registered(self.on_report), TaskDone: registered(self.on_task_done),
                Stats: registered(self.on_stats), Counters: registered(self.on_counters),
                Heartbeat: registered(self.on_heartbeat),
                Leave: registered(lambda a, msg: self.failures.leave(a.node, msg.why, abort=not msg.ended)),
                ProbeDone: registered(lambda a, msg: self.host.prober.done(a.node, msg)),
                **({Attach: registered(self.attachments.on_attach)} if self.attachments is not None else {})}

    def connection_closed(self, a: AgentInfo) -> None:
        if self.registry.registered(a):
            self.host.on_event("agent_lost", {"node": a.node})
            self.failures.lose(a.node, "control connection closed")

    def on_register(self, a: AgentInfo, msg: Register) -> None:
        if msg.node != a.node:
            raise ProtocolError(f"node {a.node} speaks for node {msg.node}", field="node", msg_type=msg.T)
        replaced = self.registry.admit(a, msg)
        if replaced is False:
            return
        if replaced is not None:
            self.failures.lose(a.node, f"replaced by epoch {a.epoch}")
        # never reuse a job id or version an agent saw from an earlier scheduler (restarted)
        self.host.job_id = max(self.host.job_id, msg.seen_job or 0)
        self.versions.version = max(self.versions.version, msg.seen_version or 0)
        self.registry.add(a, msg)
        self.cap_sharing.set_caps(a.node, msg.uplink_mbps, msg.downlink_mbps)
        self.view.set_cap(a.node, "up", msg.uplink_mbps)  # nominal until its own samples come
        self.view.set_cap(a.node, "down", msg.downlink_mbps)
        self.view.add_node(a.node)
        self.view.node_up(a.node)
        for n in a.neighbors:
            self.view.add_link(a.node, n)
        self.host.on_event("agent", {"node": a.node, "neighbors": a.neighbors})
        if self.registry.complete.is_set():  # a restarted agent: everyone learns where it is now
            self.failures.rejoin(a)

    def on_ready(self, a: AgentInfo, msg: Ready) -> None:
        js = self.host.current
        if js is None or msg.job != js.job or js.mode != "rounds":
            self.registry.send(a, Abort(job=msg.job, task=msg.round, attempt=-1 if js is None else 0))
            return
        rnd, attempt = msg.round, msg.attempt or 0
        if rnd >= js.rounds:
            raise ProtocolError(f"round {rnd} of job {js.job}, which has {js.rounds}", field="round", msg_type=msg.T)
        if not js.progress.uses_barrier:  # the model forms the tasks (and answers with GO where it bounds)
            self.host.note_event("ready", job=js.job, node=a.node, round=rnd)
            js.progress.ready(self.control, js, a.node, rnd, set(msg.have or ()))
            return
        self._missed_abort(a, js, rnd)
        t = js.bsp_task(rnd)
        if attempt != t.attempt:
            # an aborted attempt: say so again (an agent that rejoined never got that ABORT)
            self.registry.send(a, Abort(job=js.job, task=rnd, attempt=t.attempt - 1))
            return
        self.control.barrier_ready(js, rnd, a.node, set(msg.have or ()))

    def _missed_abort(self, a: AgentInfo, js: JobState, rnd: int) -> None:
        """BSP: a READY for round rnd while the retry of round rnd - 1 still waits for this node's READY
        means the node finished the aborted attempt and never learnt of its ABORT (lost on the way, or
        read too late): say it again. The agent goes back and redoes rnd - 1; one that never ran it
        ignores it. Without this, rnd - 1 would wait for the node and rnd would never form."""
        prev = js.tasks.get(rnd - 1)
        if (prev is not None and prev.barrier and prev.attempt > 0 and prev.recorded_t is None
                and prev.started_t is None and a.node not in (prev.asked or {})):
            self.host.note_event("abort_again", job=js.job, task=prev.id, node=a.node, attempt=prev.attempt - 1)
            self.registry.send(a, Abort(job=js.job, task=prev.id, attempt=prev.attempt - 1))

    def on_report(self, a: AgentInfo, msg: Report) -> None:
        for src, dst, *_ in msg.samples:  # the schema checked shapes and values
            if dst != a.node or src not in a.neighbors:  # samples are taken by the receiver of a link
                raise ProtocolError(f"sample of link {src}->{dst}, not a link into node {a.node}",
                                    field="samples", msg_type=msg.T)
        # the caps the node declares now first: the view judges each sample against the ports it ran under
        # (a share of a port that just tightened, judged against the loose one, would read as the link's rate)
        for kind, mbps in zip(("up", "down"), msg.declared or (), strict=False):
            if mbps is not None:
                self.view.declare_cap(a.node, kind, mbps)
        for src, dst, nbytes, seconds, *probed in msg.samples:
            self.view.observe(src, dst, nbytes, seconds, probed=bool(probed and probed[0]))
        for kind, nbytes, seconds in msg.caps or ():  # the node's own caps (a big switch's ports)
            self.view.observe_cap(a.node, ("up", "down")[int(kind)], int(nbytes), seconds)
        self.host.on_event("samples", {"node": a.node, "samples": msg.samples})
        if self.host.current is not None:
            self.versions.refresh_aux(self.host.current)
            self.versions.replan_early(self.host.current)

    def on_task_done(self, a: AgentInfo, msg: TaskDone) -> None:
        js = self.host.current
        if js is None or msg.job != js.job:
            return
        t = js.tasks.get(msg.task)
        if t is None or msg.attempt != t.attempt or t.version is None:
            return  # finished an attempt that was aborted meanwhile (or a task that never began)
        t.done[a.node] = msg
        if not msg.ok:
            self.host.errors.append(f"node {a.node} job {js.job} task {msg.task}: {msg.error or 'wrong result'}")
        self.records.record(js, t)

    def on_stats(self, a: AgentInfo, msg: Stats) -> None:
        js = self.host.current
        if js is not None and msg.job == js.job:
            js.stats[a.node] = msg.stats
            self.records.maybe_finish(js)

    def on_counters(self, a: AgentInfo, msg: Counters) -> None:
        links = {int(dst): nbytes for dst, nbytes in msg.links.items()}  # the schema checked the keys
        if not set(links) <= set(a.neighbors):
            raise ProtocolError(f"counters for links {sorted(set(links) - set(a.neighbors))[:8]} that "
                                f"node {a.node} does not have", field="links", msg_type=msg.T)
        for dst, nbytes in links.items():
            self.host.link_bytes[(a.node, dst)] = nbytes
        self.host.on_event("counters", {"node": a.node, "time": msg.time, "links": msg.links})

    def on_heartbeat(self, a: AgentInfo, msg: Heartbeat) -> None:
        a.rx_bytes = msg.rx if msg.rx is not None else a.rx_bytes
        a.stuck = {int(b): w for b, w in msg.stuck or () if b in a.neighbors}
