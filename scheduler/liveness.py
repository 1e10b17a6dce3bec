"""Liveness: the watchdog that turns silence into decisions (scheduler/deadline.py says how long).

Every tick: an agent silent past the heartbeat timeout is lost; a suspicion that ran out is lifted;
a blocked task is tried again (the cluster may have changed); at a BSP barrier, a member alive but
not asking once the previous round is complete everywhere is stuck (lost); a started task in which
no data moved for the stall deadline is aborted (and the links whose chunks waited as long are
suspected: a blackhole), one that runs past its overrun deadline is aborted too. The job's progress
model watches its own deadlines on the same tick (CREW: budgets, links found down), and keeps its
suspicions here, with the watchdog's own.

It sees the scheduler through `Watched` (the job, the plans, and the three decisions it may take),
the agents through the registry, the network through the view.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from core.plan import Plan

from . import deadline
from .progress import Control
from .registry import AgentInfo
from .tasks import JobState
from .view import NetworkView

log = logging.getLogger("wansync.scheduler")


class Watched(Protocol):
    """What the watchdog needs of the scheduler: the running job, the plans, and what it may decide."""

    current: JobState | None
    control: Control  # the progress model's view of the scheduler (for its own watch)

    @property
    def plans(self) -> Mapping[int, Plan]: ...

    def lose(self, node: int, why: str) -> None: ...

    def abort(self, js: JobState, tid: int, why: str) -> None: ...

    def try_start(self, js: JobState, tid: int) -> None: ...

    def note_event(self, kind: str, **data: Any) -> dict[str, Any]: ...


class Liveness:
    def __init__(self, sched: Watched, agents: Mapping[int, AgentInfo], view: NetworkView,
                 heartbeat_timeout: float) -> None:
        self.sched = sched
        self.agents = agents  # the registry's, as it changes
        self.view = view
        # an agent silent this long (no heartbeat: frozen, partitioned) is declared lost
        self.heartbeat_timeout = heartbeat_timeout
        self.suspect_until: dict[tuple[int, int], float] = {}  # link -> when to trust it again
        self._progress = (0, time.time())  # (sum of agents' received bytes, when it last grew)

    async def watch(self, tick: float = 0.2) -> None:
        """Heartbeat deadlines for agents; stall and overrun deadlines for rounds."""
        last = time.time()
        while True:
            await asyncio.sleep(tick)
            now = time.time()
            late = now - last - tick
            last = now
            if late > 0.1:  # this loop could not listen meanwhile: that silence is ours, not the agents'
                for a in self.agents.values():
                    a.last_seen += late
                self._progress = (self._progress[0], self._progress[1] + late)
            try:
                self.check(now)
            except Exception:  # a bug here must not end liveness checking for the whole run
                log.exception("watchdog")

    def check(self, now: float) -> None:
        """Heartbeats, suspicions that ended, blocked rounds, the barrier, stall and overrun."""
        sched = self.sched
        for a in list(self.agents.values()):
            if now - a.last_seen > self.heartbeat_timeout:
                sched.lose(a.node, f"silent for {now - a.last_seen:.1f} s")
        for link, until in list(self.suspect_until.items()):
            if now > until:  # trust it again; if it is still dead the next stall finds it
                del self.suspect_until[link]
                self.view.unsuspend(*link)
        js = sched.current
        if js is None or js.finished.is_set():
            return
        rx = sum(a.rx_bytes for a in self.agents.values())
        if rx != self._progress[0]:
            self._progress = (rx, now)
        for t in list(js.tasks.values()):
            if t.blocked is not None:  # the cluster may have changed: a node back, a suspicion over
                if t.asked is not None or not t.barrier:
                    sched.try_start(js, t.id)
                else:
                    t.blocked = None
        for t in list(js.tasks.values()):
            if t.asked is not None and t.version is not None:
                self._barrier(js, t.id, now)
        for t in list(js.tasks.values()):
            if t.started_t is not None:  # started, not complete
                self._running(js, t.id, now)
        if js.progress is not None and not js.finished.is_set():
            js.progress.watch(sched.control, js, now)

    def _barrier(self, js: JobState, rnd: int, now: float) -> None:
        """Once the previous round is complete everywhere, everyone asks within its compute time: one
        who does not, while alive, is stuck (a slow previous round has its own deadlines)."""
        r = js.tasks[rnd]
        prev = js.tasks.get(rnd - 1)
        if rnd > 0 and (prev is None or prev.recorded_t is None):
            return
        assert r.barrier_t is not None and r.asked is not None and r.version is not None
        t0 = max(r.barrier_t, prev.recorded_t if prev is not None and prev.recorded_t is not None else 0.0)
        recent = [rec.round_s for rec in js.records[-5:]]
        limit = deadline.overrun_s(js.job_msg.get("compute_s", 0.0), recent, 0)
        # a node a training script paces asks when its script steps: its agent says LEAVE if that stops
        missing = [n for n in self.sched.plans[r.version].participants if n not in r.asked
                   and not (n in self.agents and self.agents[n].paced)]
        if now - t0 > limit and missing:
            for n in missing:
                self.sched.lose(n, f"did not ask for round {rnd} within {limit:.1f} s (stuck)")

    def _running(self, js: JobState, tid: int, now: float) -> None:
        sched = self.sched
        r = js.tasks[tid]
        assert r.started_t is not None and r.version is not None
        t0 = r.started_t
        plan = sched.plans[r.version]
        quiet = now - max(self._progress[1], t0)
        if quiet > deadline.stall_s(plan, self.view) * 2 ** r.aborted:
            suspects = self._suspect(quiet)
            around = f"; routing around {suspects}" if suspects else ""
            sched.abort(js, tid, f"no data moved for {quiet:.1f} s{around}")
            return
        recent = [rec.round_s for rec in js.records[-5:] if rec.version == plan.version]
        # the prediction rests on the view: while it still guesses some links at the nominal rate (a
        # slow WAN's first round), only rounds seen with this plan say how long one takes, and until
        # one ended the stall test alone guards the round
        predicted = self._predicted(js, plan) if self.view.coverage() >= 1.0 else None
        limit = (deadline.overrun_s(predicted, recent, r.aborted) if predicted is not None or recent
                 else float("inf"))
        if now - t0 > limit:
            sched.abort(js, tid, f"task ran {now - t0:.1f} s, over its deadline of {limit:.1f} s")

    def _suspect(self, quiet: float) -> list[list[int]]:
        """After a stall: links whose chunks waited unacknowledged about as long as nothing moved
        swallowed them (a blackhole). They leave the view for a while, so the retry avoids them."""
        out = []
        for a in list(self.agents.values()):
            for b, waited in a.stuck.items():
                link = (min(a.node, b), max(a.node, b))
                if waited >= 0.8 * quiet and self.suspect(link, deadline.suspect_s(quiet), "link_suspected",
                                                          waited_s=waited):
                    out.append(list(link))
        return out

    def suspect(self, link: tuple[int, int], seconds: float, kind: str, **data: Any) -> bool:
        """Take link a-b (a < b) out of planning for `seconds`, noting `kind` on the timeline; False if
        it is suspected already or the view refuses (the living would be cut apart)."""
        if link in self.suspect_until or not self.view.suspend(*link):
            return False
        self.suspect_until[link] = time.time() + seconds
        self.sched.note_event(kind, link=list(link), **data)
        return True

    def waited(self) -> dict[tuple[int, int], float]:
        """Per link (a < b), the longest its chunks have waited unacknowledged, as agents report it."""
        out: dict[tuple[int, int], float] = {}
        for a in list(self.agents.values()):
            for b, waited in a.stuck.items():
                link = (min(a.node, b), max(a.node, b))
                out[link] = max(out.get(link, 0.0), waited)
        return out

    def trust(self, link: tuple[int, int]) -> None:
        """A suspected link the living need after all (a loss is a fact, a suspicion a guess)."""
        self.suspect_until.pop(link, None)

    def _predicted(self, js: JobState, plan: Plan) -> float | None:
        """The simulator's round time for `plan` on the view, computed in a thread (a big plan takes
        seconds, and this loop must keep reading heartbeats); None until it is known."""
        if plan.version not in js.predicted:
            js.predicted[plan.version] = None
            view = NetworkView()
            view.g = self.view.g.copy()  # a snapshot: the thread must not see the view change under it

            def done(fut: asyncio.Future) -> None:
                if not fut.cancelled() and fut.exception() is None:
                    js.predicted[plan.version] = fut.result()
            fut = asyncio.get_running_loop().run_in_executor(None, deadline.predict_on_view, plan, view)
            fut.add_done_callback(done)
        return js.predicted[plan.version]
