"""Liveness: the watchdog that turns silence into decisions (scheduler/deadline.py says how long).

Every tick: an agent silent past the heartbeat timeout is lost; a suspicion that ran out is lifted;
a blocked task is tried again (the cluster may have changed); at a BSP barrier, a member alive but
not asking once the previous round is complete everywhere is stuck (lost); a started task in which
no data moved for the stall deadline is aborted (and the links whose chunks waited as long are
suspected: a blackhole), one that runs past its overrun deadline is aborted too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from core.plan import Plan

from . import deadline
from .tasks import JobState
from .view import NetworkView

if TYPE_CHECKING:
    from .service import Scheduler

log = logging.getLogger("wansync.scheduler")


class Liveness:
    def __init__(self, sched: Scheduler, heartbeat_timeout: float) -> None:
        self.sched = sched
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
                for a in self.sched.agents.values():
                    a.last_seen += late
                self._progress = (self._progress[0], self._progress[1] + late)
            try:
                self.check(now)
            except Exception:  # a bug here must not end liveness checking for the whole run
                log.exception("watchdog")

    def check(self, now: float) -> None:
        """Heartbeats, suspicions that ended, blocked rounds, the barrier, stall and overrun."""
        sched = self.sched
        for a in list(sched.agents.values()):
            if now - a.last_seen > self.heartbeat_timeout:
                sched.lose(a.node, f"silent for {now - a.last_seen:.1f} s")
        for link, until in list(self.suspect_until.items()):
            if now > until:  # trust it again; if it is still dead the next stall finds it
                del self.suspect_until[link]
                sched.view.unsuspend(*link)
        js = sched.current
        if js is None or js.finished.is_set():
            return
        rx = sum(a.rx_bytes for a in sched.agents.values())
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
        missing = [n for n in self.sched.plans[r.version].participants if n not in r.asked]
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
        if quiet > deadline.stall_s(plan, sched.view) * 2 ** r.aborted:
            suspects = self._suspect(quiet)
            around = f"; routing around {suspects}" if suspects else ""
            sched.abort(js, tid, f"no data moved for {quiet:.1f} s{around}")
            return
        recent = [rec.round_s for rec in js.records[-5:] if rec.version == plan.version]
        # the prediction rests on the view: while it still guesses some links at the nominal rate (a
        # slow WAN's first round), only rounds seen with this plan say how long one takes, and until
        # one ended the stall test alone guards the round
        predicted = self._predicted(js, plan) if sched.view.coverage() >= 1.0 else None
        limit = (deadline.overrun_s(predicted, recent, r.aborted) if predicted is not None or recent
                 else float("inf"))
        if now - t0 > limit:
            sched.abort(js, tid, f"task ran {now - t0:.1f} s, over its deadline of {limit:.1f} s")

    def _suspect(self, quiet: float) -> list[list[int]]:
        """After a stall: links whose chunks waited unacknowledged about as long as nothing moved
        swallowed them (a blackhole). They leave the view for a while, so the retry avoids them."""
        sched = self.sched
        out = []
        for a in list(sched.agents.values()):
            for b, waited in a.stuck.items():
                link = (min(a.node, b), max(a.node, b))
                if waited >= 0.8 * quiet and link not in self.suspect_until and sched.view.suspend(*link):
                    self.suspect_until[link] = time.time() + deadline.suspect_s(quiet)
                    sched.note_event("link_suspected", link=list(link), waited_s=waited)
                    out.append(list(link))
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
            view.g = self.sched.view.g.copy()  # a snapshot: the thread must not see the view change under it

            def done(fut: asyncio.Future) -> None:
                if not fut.cancelled() and fut.exception() is None:
                    js.predicted[plan.version] = fut.result()
            fut = asyncio.get_running_loop().run_in_executor(None, deadline.predict_on_view, plan, view)
            fut.add_done_callback(done)
        return js.predicted[plan.version]
