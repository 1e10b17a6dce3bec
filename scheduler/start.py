"""Task start: freeze a task's version, tell every node with a part in it (its tree nodes and the
relays on their routes), and the rates where classed flows of many senders meet.

The TASK goes out once every member has said READY (BSP: nobody can compute round r before it holds
round r-1's result anyway), or at once for a task the scheduler formed. Synchronization then starts
together, so a round's time is the synchronization itself and not the previous round's broadcast
tail seen by an early finisher. A task no plan connects waits (blocked); the watchdog tries again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from core.capshare import CapSharing
from core.plan import Plan, PlanError
from overlay.messages import Rates
from overlay.messages import Task as TaskMsg
from overlay.routing import NoRoute, Routes, adjacency

from . import planners
from .events import Observed
from .registry import Registry
from .tasks import JobState, Task
from .versions import Unplannable, Versions
from .view import DisconnectedView, NetworkView

log = logging.getLogger("wansync.scheduler")

BLOCKED_TASK_S = 10.0  # a formed task no plan connects this long is given up (recorded as aborted)


def check_task(members: tuple[int, ...], receivers: tuple[int, ...] | None, options: Mapping[str, Any],
               weights: Mapping[int, float] | None, nodes_in_cluster: int) -> None:
    """A task's request is refused at once, naming the field, when it cannot mean anything."""
    def nodes(field: str, ns: Iterable[Any]) -> None:
        bad = [n for n in ns if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < nodes_in_cluster]
        if bad:
            raise ValueError(f"{field}: {bad[:8]} are not nodes of this cluster (0..{nodes_in_cluster - 1})")
    if not members:
        raise ValueError("members: a task needs at least one member")
    nodes("members", members)
    if receivers is not None:
        if not receivers:
            raise ValueError("receivers: a task needs at least one receiver")
        nodes("receivers", receivers)
    for field, named in planners.named_nodes(options).items():
        nodes(field, named)
    for n, w in (weights or {}).items():
        if n not in members:
            raise ValueError(f"weights: node {n} is not a member")
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"weights: node {n} has weight {w!r}; a weight is a finite number > 0")


class TaskStart:
    """Starts tasks: versions frozen, TASK messages out, per-flow rates sent."""

    def __init__(self, registry: Registry, view: NetworkView, versions: Versions, cap_sharing: CapSharing,
                 obs: Observed, give_up: Callable[[JobState, Task, str], None]) -> None:
        self.registry = registry
        self.view = view
        self.versions = versions
        self.cap_sharing = cap_sharing
        self.obs = obs
        self.give_up = give_up  # a formed task that cannot start: recorded as aborted (records.py)

    def form(self, js: JobState, members: Iterable[int], receivers: Iterable[int] | None, rnd: int | None,
             iters: dict[int, int] | None = None, options: dict[str, Any] | None = None) -> Task:
        """A task the scheduler forms (not behind a barrier): started at once, retried on its own.
        `rnd`: the iteration members contribute from (None: the task's own id, a synthetic seed)."""
        tid = max(js.tasks, default=-1) + 1
        t = js.tasks[tid] = Task(tid, tid if rnd is None else rnd, barrier=False, members=tuple(sorted(set(members))),
                                 receivers=None if receivers is None else tuple(sorted(set(receivers))),
                                 options={**js.spec.options, **(options or {})}, iters=dict(iters or {}))
        t.finished = asyncio.get_running_loop().create_future()
        self.try_start(js, tid)
        return t

    def try_start(self, js: JobState, tid: int, asking: int | None = None) -> None:
        """Freeze the task's version (re-planning first if members or usable links changed) and start
        it: under BSP once every member said READY, a formed task at once. Blocked while no plan
        connects the members (a lost node or suspected links cut them apart): the watchdog tries
        again as the cluster changes."""
        t = js.tasks[tid]
        try:
            v = self.versions.version_for(js, t)
        except (DisconnectedView, PlanError, ValueError) as exc:
            if t.blocked != str(exc):
                log.warning("job %d task %d waits: no plan for its members (%s)", js.job, tid, exc)
                self.obs.note_event("blocked", job=js.job, task=tid, round=t.round, why=str(exc))
            t.blocked = str(exc)
            now = time.time()
            t.blocked_t = t.blocked_t or now
            if not t.barrier and (isinstance(exc, Unplannable) or now - t.blocked_t > BLOCKED_TASK_S):
                self.give_up(js, t, str(exc))  # nothing left to wait for, or waited long enough
            return
        t.blocked, t.blocked_t = None, None
        plan = self.versions.plans[v]
        members = set(plan.participants)
        asked = t.asked if t.asked is not None else {}
        agents = self.registry.agents
        if t.barrier:
            for node in [n for n in asked if n not in members]:
                del asked[node]  # joined after this round was frozen (it sits this one out), or lost since
                if node in agents:
                    self.registry.send(agents[node], TaskMsg(
                        job=js.job, task=tid, attempt=t.attempt, version=v, round=t.round, members=[],
                        receivers=[], skip=True))
            if asking is not None:
                self.obs.on_event("topo_request", {"node": asking, "round": t.round, "version": v})
            if not members <= set(asked):
                return
        t.involved = self.involved(plan, js.avoid)
        if any(g.classed for g in plan.groups) and self.cap_sharing.caps:
            self.send_rates(js, self.cap_sharing.start(tid, t.attempt, plan, time.time(), self._routes().route,
                                                       self.view.links_mbps))
        settled = js.settled()
        resync = _resync(js, t, plan)
        for node in sorted(t.involved):
            a = agents.get(node)
            if a is None:
                continue
            have = asked.get(node, a.versions)
            msg = TaskMsg(job=js.job, task=tid, attempt=t.attempt, version=v, round=t.round,
                          members=list(plan.participants), receivers=list(plan.receiver_set), avoid=js.avoid,
                          plan=None if v in have else plan.to_wire(), settled=settled, iters=t.iters or None,
                          resync=resync)
            if self.registry.send(a, msg):
                a.versions.add(v)
        t.start(time.time())

    def involved(self, plan: Plan, avoid: list[list[int]]) -> frozenset[int]:
        """Every node with a part in a plan: its tree nodes, and the relays on the routes its tree
        edges take (min-hop over the known links, around the unusable ones; auxiliary routes too)."""
        bad = {(a, b) for a, b in avoid}
        links = [(a, b) for a, b in self.view.links() if (min(a, b), max(a, b)) not in bad]
        routes = Routes(adjacency(links))
        out = set(plan.nodes)
        for g in plan.groups:
            edges = [(c, p) for c, p in g.parent.items() if p is not None]
            edges += [(p, k) for p, kids in g.children.items() for k in kids]
            for a, b in edges:
                try:
                    out.update(routes.route(a, b))
                except NoRoute:
                    pass
            for rs in g.aux.values():
                for r in rs:
                    out.update(r)
        return frozenset(out)

    def _routes(self) -> Routes:
        """The agents' min-hop routes (overlay.routing over the links they registered)."""
        return Routes({n: a.neighbors for n, a in self.registry.agents.items()})

    def send_rates(self, js: JobState, updates: Mapping[int, Mapping[tuple[int, int], list]]) -> None:
        for node, per_task in updates.items():
            a = self.registry.agents.get(node)
            if a is not None:
                for (task, attempt), rows in per_task.items():
                    self.registry.send(a, Rates(job=js.job, task=task, attempt=attempt, rates=rows))


def _resync(js: JobState, t: Task, plan: Plan) -> list[int] | None:
    """[source, *joining] for a BSP round in which members (re)join the job (js.joins): the current
    model goes to them from the lowest member that stayed; None if nobody joins, or nobody stayed."""
    if not t.barrier:
        return None
    joining = [n for n in plan.participants if js.joins.get(n, 0) == t.round and t.round > 0]
    stayed = [n for n in plan.participants if n not in joining]
    return [stayed[0], *joining] if joining and stayed else None
