"""CREW's ready queue with its failure rules (seed 004, §2.9): P-Reduce's grouping, plus what happens to a
task when a node or a link fails.

Grouping is the ready queue's (progress/queue.py): the first p READY workers form a task; the
planner (crew, opr or a baseline) plans it. On failure the task's attempt is aborted (the scheduler
drops it everywhere) and this policy decides, before the scheduler retries it (`retry`):

- a lost *member* (initiator) cannot be bypassed — its contribution is gone: the task is abandoned;
- a task past its *time budget* (default: max(10 x the plan's LP time on the view, 30 s) from its
  forming) is abandoned;
- otherwise, for a CREW plan, every block whose aggregator is lost or has a dead link to or from a
  member moves to the replacement Eq. (3) picks (crew_split.replacement: live links both ways to every
  other member, least (load + block) / bottleneck, the load summed over the unfinished tasks' blocks);
  the other blocks keep their aggregators and chunks; no candidate: abandoned. Other plans are
  re-planned by their planner on the living members (the scheduler's default).

An abandoned task is recorded as aborted: no receiver applied anything partial (the data plane applies
a result only once every chunk of it is final and exact), and its surviving members queue again with
the same iteration — except a member that had already received the whole result before the failure
(a lost member's block reached it, not the others): it applied that exact result and goes on. Each
(worker, iteration) is placed in at most one task that is not abandoned: a member's READY repeated
after an abort never puts its contribution in a second task. Only the affected tasks abort.

Link failures: a link whose chunks wait unacknowledged for `link_timeout_s` (agents report it in
their heartbeats: `down` cuts the connection, a blackhole swallows the bytes) is LINK_DOWN for every
running task with a plan edge over it: the link leaves the view (planning and Eq. (3) avoid it) for
`suspect_s`, and those tasks abort; then `retry` moves the blocks that needed it. The scheduler's
liveness watchdog (scheduler/liveness.py) asks for that and for the budgets on every tick (`watch`),
and keeps the suspicions with its own.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from core.plan import Plan

from ..planners.crew import loads, move_blocks
from ..tasks import JobState, Task, TaskRecord
from ..view import NetworkView
from .base import Control, register
from .queue import ReadyQueue

log = logging.getLogger("wansync.scheduler")

BUDGET_MIN_S = 30.0  # a task's time budget is at least this ...
BUDGET_FACTOR = 10.0  # ... and this many times its plan's LP time on the view
LINK_TIMEOUT_S = 3.0  # chunks unacknowledged this long on a link: it is down (at least; see link_timeout_s)
LINK_SEGMENTS = 8  # ... and at least this many segment times of the slowest link the view knows
SUSPECT_S = 30.0  # a link found down stays out of planning this long (then it is tried again)


@register
class CrewQueue(ReadyQueue):
    name = "crew"
    rule = "result"

    def __init__(self, group: int = 2, budget_s: float | None = None, link_timeout: float = LINK_TIMEOUT_S,
                 suspect_s: float = SUSPECT_S, **kw: Any) -> None:
        super().__init__(group, **kw)
        if budget_s is not None and not budget_s > 0:
            raise ValueError(f"budget_s must be > 0, got {budget_s}")
        self.budget_s = budget_s
        self.link_timeout, self.suspect_s = link_timeout, suspect_s
        self.formed_t: dict[int, float] = {}  # task -> when it formed (its budget counts from there)
        self.failovers: list[dict[str, Any]] = []  # every block moved: task, block root, replacement
        self.abandoned: list[dict[str, Any]] = []
        self.stopped = False  # no task forms any more (the job is being ended early)
        self.placed: set[tuple[int, int]] = set()  # (worker, iteration) in a task that was not abandoned
        self.consumed: dict[int, frozenset[int]] = {}  # abandoned task -> members that had its result

    def stop(self) -> None:
        """Form no more tasks (a job ended at a time budget: the running ones finish, then JOB_END)."""
        self.stopped = True
        self.decision.stop()

    # --- the queue ----------------------------------------------------------------------------------
    def ready(self, ctl: Control, js: JobState, node: int, rnd: int, have: set[int]) -> None:
        """A READY for an iteration already placed in a task that was not abandoned is the member
        asking again after an abort (its agent does, whether the task is being retried or already
        ended on the retry): the contribution is in that task, never in a second one."""
        if (node, rnd) in self.placed:
            return
        super().ready(ctl, js, node, rnd, have)

    def _group(self, ctl: Control, js: JobState, group: list[tuple[int, int]]) -> None:
        self.formed_t[max(js.tasks, default=-1) + 1] = time.time()  # the id form() gives it
        self.placed.update(group)
        super()._group(ctl, js, group)

    def task_done(self, ctl: Control, js: JobState, rec: TaskRecord) -> None:
        """An abandoned task's members queue again with the same iteration, except those that had
        already received its whole (exact) result when it was abandoned: they applied it."""
        self.formed_t.pop(rec.task, None)
        kept = self.consumed.pop(rec.task, frozenset())
        again: dict[int, int] = {}
        if rec.aborted:
            t = js.tasks.get(rec.task)
            iters = rec.iters or (t.iters if t is not None else {})  # a given-up task's record names none
            again = {n: k for n, k in sorted(iters.items()) if n not in kept}
            self.placed.difference_update(again.items())
        self._act(ctl, js, self.decision.over(None, again, time.time(), aborted=rec.aborted, alive=ctl.alive()))

    # --- failures -----------------------------------------------------------------------------------
    def link_timeout_s(self, view: NetworkView) -> float:
        """How long a link's chunks may wait for an acknowledgement before it counts as down: the
        configured floor, or a few segment times of the slowest link the view knows (a slow link
        still acknowledges a segment now and then)."""
        slowest = min((r for *_, r in view.g.edges(data="rate")), default=100.0)
        return max(self.link_timeout, LINK_SEGMENTS * 64 * 1024 * 8 / (max(slowest, 1e-3) * 1e6))

    def budget(self, plan: Plan | None) -> float:
        if self.budget_s is not None:
            return self.budget_s
        lp = 0.0 if plan is None else plan.info.get("t_scatter_s", 0.0) + plan.info.get("t_multicast_s", 0.0)
        return max(BUDGET_MIN_S, BUDGET_FACTOR * lp)

    def retry(self, ctl: Control, js: JobState, t: Task, prev: int | None, why: str,
              done: frozenset[int] = frozenset()) -> str | None:
        """The scheduler aborted the task's attempt (why; `done`: the receivers that had reported it
        complete); return why it is abandoned, or None to let it be re-planned (for a CREW plan,
        with its failed blocks moved by Eq. (3)). A retry has the same members and iterations, so a
        receiver done with the aborted attempt holds the same bits the retry gives the others."""
        plan = ctl.plans.get(prev) if prev is not None else None
        self.consumed[t.id] = frozenset(done) & set(t.members)
        alive = set(ctl.alive())
        lost = [m for m in t.members if m not in alive]
        if lost:
            return self._abandon(js, t, f"member(s) {lost} lost: their contributions cannot be replaced ({why})")
        age = time.time() - self.formed_t.get(t.id, time.time())
        if age > self.budget(plan):
            return self._abandon(js, t, f"over its time budget ({age:.1f} s > {self.budget(plan):.1f} s; {why})")
        if plan is None or plan.scheme not in ("crew", "opr") or len(plan.participants) < 2:
            return None
        view = ctl.view

        def bw(a: int, b: int) -> float:
            e = view.g.adj[a].get(b) if a in view.g else None
            return 0.0 if e is None else float(e["rate"])
        others = {tt.id: ctl.plans[tt.version] for tt in js.tasks.values()
                  if tt.recorded_t is None and tt.version is not None and tt.id != t.id
                  and ctl.plans[tt.version].scheme in ("crew", "opr")}
        out = move_blocks(plan, sorted(alive), bw, loads({**others, t.id: plan}))  # its own blocks count too
        if out is None:
            return self._abandon(js, t, f"no worker can take over a failed block ({why})")
        blocks, moved = out
        if moved:
            t.options["blocks"] = blocks
            for mv in moved:
                mv.update(task=t.id, why=why)
                self.failovers.append(mv)
                log.warning("job %d task %d: block of %d moves to %d (Eq. 3)", js.job, t.id, mv["from"], mv["to"])
                ctl.note_event("failover", job=js.job, **mv)
        return None

    def _abandon(self, js: JobState, t: Task, why: str) -> str:
        had = sorted(self.consumed.get(t.id, ()))
        if had:  # a member lost after some receivers held everything: they applied it (exact), the rest nothing
            why += f"; members {had} had received it whole"
        self.abandoned.append({"task": t.id, "members": list(t.members), "why": why, "t": time.time()})
        return why

    def watch(self, ctl: Control, js: JobState, now: float) -> None:
        """Budgets and dead links of running tasks, on every tick of the scheduler's liveness watchdog:
        a link found down is suspected there (out of planning for `suspect_s`, then trusted again)."""
        timeout = self.link_timeout_s(ctl.view)
        down = {link for link, waited in ctl.waited().items() if waited >= timeout}
        for link in sorted(down):
            ctl.suspect(link, self.suspect_s, "link_down", why="chunks unacknowledged")
        for t in sorted(js.tasks.values(), key=lambda t: t.id):
            if t.recorded_t is not None or t.version is None or t.started_t is None:
                continue
            plan = ctl.plans[t.version]
            age = now - self.formed_t.get(t.id, now)
            if age > self.budget(plan):
                ctl.abort(js, t.id, f"over its time budget of {self.budget(plan):.1f} s")
                continue
            cut = [list(link) for link in down if _uses(plan, link)]
            if cut:
                ctl.abort(js, t.id, f"link(s) {sorted(cut)} down")


def _uses(plan: Plan, link: tuple[int, int]) -> bool:
    """Does a tree edge of the plan run over link a-b (either direction)?"""
    a, b = link
    for g in plan.groups:
        for n, p in g.parent.items():
            if p is not None and {n, p} == {a, b}:
                return True
        for p, kids in g.children.items():
            if (p == a and b in kids) or (p == b and a in kids):
                return True
    return False
