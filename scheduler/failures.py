"""Failures: an agent lost (fenced, its tasks aborted, the job re-planned), a task's attempt aborted
(asked for again under BSP, retried or given up when formed), an agent back (it joins the job), a
node whose training script is gone (it leaves the job, connected, until a script attaches again).

A lost agent aborts (and retries or re-plans) only the tasks it had a part in; the job's progress model
may refuse a formed task's retry or prepare it (CREW's failover, §2.9).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from core.capshare import CapSharing
from overlay.messages import Abort, Fence

from .events import Observed
from .liveness import Liveness
from .progress import Control
from .records import Records
from .registry import AgentInfo, Registry
from .start import TaskStart
from .tasks import JobState
from .versions import Versions
from .view import NetworkView

log = logging.getLogger("wansync.scheduler")

BENCHED = 1 << 62  # js.joins value of a node that left the job (its script is gone): no round plans it


class Host(Observed, Protocol):
    current: JobState | None  # the running (or last) job
    control: Control  # the progress model's view of the scheduler


class Failures:
    def __init__(self, registry: Registry, view: NetworkView, liveness: Liveness, versions: Versions,
                 cap_sharing: CapSharing, starter: TaskStart, records: Records, host: Host) -> None:
        self.registry = registry
        self.view = view
        self.liveness = liveness
        self.versions = versions
        self.cap_sharing = cap_sharing
        self.starter = starter
        self.records = records
        self.host = host
        self.closing = False  # shutting down: connections close, nobody is lost for it

    def lose(self, node: int, why: str) -> None:
        """Declare an agent gone: fence its incarnation, abort the tasks it had a part in, re-plan."""
        if self.closing:
            self.registry.agents.pop(node, None)
            return
        a = self.registry.remove(node, why)
        if a is None:
            return
        for link in self.view.node_down(node):  # suspected links the living need
            self.liveness.trust(link)
            self.host.note_event("link_trusted", link=list(link), why=f"needed without node {node}")
        log.warning("agent %d lost (%s); fencing epoch %d", node, why, a.epoch)
        self.host.note_event("agent_lost", node=node, why=why)
        fence = Fence(node=node, epoch=a.epoch)
        self.registry.send(a, fence)  # a frozen agent reads it when it wakes
        a.conn.close()
        self.registry.broadcast(fence)
        js = self.host.current
        if js is None or js.finished.is_set():
            return
        self._abort_with(js, node, f"agent {node} lost: {why}")
        # lost after its last round but before its job stats: the job waited for those, and no message
        # would come to end it now (a deploy whose kill landed late stalled there)
        self.records.maybe_finish(js)

    def _abort_with(self, js: JobState, node: int, why: str) -> None:
        """Abort every running task `node` has a part in; the progress model hears it is gone."""
        for t in sorted(js.tasks.values(), key=lambda t: t.id):
            if t.version is None or t.recorded_t is not None:
                continue
            if node in t.involved or node in self.versions.plans[t.version].nodes:
                self.abort(js, t.id, why)
        if js.progress is not None:
            js.progress.lost(self.host.control, js, node)

    def leave(self, node: int, why: str, abort: bool = True) -> None:
        """LEAVE: node's training script died or stopped calling step() (or ended). The agent stays (it
        relays, heartbeats, is not fenced) but sits the running job out until a script attaches again
        (`back`); the tasks it had a part in are aborted and go on without it (`abort`; a script that
        ended said goodbye after its last step, whose contribution stands)."""
        js = self.host.current
        if js is None or js.finished.is_set() or node not in self.registry.agents or js.joins.get(node) == BENCHED:
            return
        js.joins[node] = BENCHED
        log.warning("node %d leaves job %d: %s", node, js.job, why)
        self.host.note_event("script_left", job=js.job, node=node, why=why, ended=not abort)
        if abort:
            self._abort_with(js, node, f"node {node} left: {why}")

    def back(self, node: int) -> None:
        """A script attached again at `node` while the job runs: a node that left rejoins it from the
        next round not frozen yet (whose task hands the script the current model: start.py)."""
        js = self.host.current
        a = self.registry.agents.get(node)
        if js is None or js.finished.is_set() or a is None or js.joins.get(node) != BENCHED:
            return
        start = js.joins[node] = max(js.frozen, default=-1) + 1
        self.host.note_event("script_rejoined", job=js.job, node=node, round=start)
        self.registry.send(a, {**js.job_msg, "start": start})

    def others_stayed(self, node: int) -> bool:
        """Some node other than `node` is in the running job (holds the current model to hand on)."""
        js = self.host.current
        return (js is not None and not js.finished.is_set()
                and any(n != node and js.joins.get(n, 0) != BENCHED for n in self.registry.agents))

    def abort(self, js: JobState, tid: int, why: str) -> None:
        """The task's current attempt cannot end exact: everyone drops it; a BSP round is asked for
        again (READY), a formed task is re-planned (without what was lost) and started again."""
        t = js.tasks[tid]
        t_start, prev, had = t.started_t, t.version, frozenset(t.done)
        att = t.abort()
        self.starter.send_rates(js, self.cap_sharing.end(tid, att))
        js.aborts.append({"round": t.round, "task": tid, "attempt": att, "why": why, "t": time.time(),
                          "t_start": t_start})
        log.warning("job %d task %d attempt %d aborted: %s", js.job, tid, att, why)
        self.host.note_event("abort", job=js.job, task=tid, round=t.round, attempt=att, why=why)
        self.registry.broadcast(Abort(job=js.job, task=tid, attempt=att))
        if not t.barrier:
            # the progress model may refuse the retry (abandon) or prepare it (CREW's failover, §2.9)
            why_not = (js.progress.retry(self.host.control, js, t, prev, why, had) if js.progress is not None
                       else None)
            if why_not is not None or t.aborted >= t.options.get("max_attempts", 4):
                self.records.give_up(js, t, why_not or why)
            else:
                self.starter.try_start(js, tid)

    def rejoin(self, a: AgentInfo) -> None:
        """A restarted agent: peers learn its address and epoch; it joins the running job from the next
        round that is not frozen yet (whose plan then includes it)."""
        self.registry.broadcast(self.registry.peers())
        js = self.host.current
        if js is None or js.finished.is_set():
            return
        start = js.joins[a.node] = max(js.frozen, default=-1) + 1
        self.host.note_event("agent_rejoined", node=a.node, epoch=a.epoch, round=start)
        self.registry.send(a, {**js.job_msg, "start": start})
