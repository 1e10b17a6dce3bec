"""SSP (stale synchronous parallel) with a staleness bound s, as SelMcast uses it (digest 000 §2.4).

After computing iteration k a worker says READY(k), and a multicast task delivers its iteration-k
parameters to every other worker (the job's scheme plans it: mcast, mcast-l3). An iteration of a
worker is *done* once that multicast is over (recorded). The rule, exactly: with d_j the last done
iteration of worker j (-1 before its first), worker i may compute iteration k only when

    d_i >= k - 1               its own previous multicast is over, and
    k <= min_j d_j + 1 + s     it is at most s iterations ahead of the slowest one's done count

over the workers still in the job (s = 0 is BSP's lockstep). Each worker is told by a GO(upto) of
its own whenever its allowance rises; receivers apply what they get when it arrives. Waiting for
its own multicast is what keeps a fast worker from piling up transfers the network cannot carry.

The rule itself is core.progress's `ssp` decision (the simulator's job mode runs the same one); this
adapter feeds it the scheduler's events and turns its actions into formed tasks and GOs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from core.progress import Action, Form, Go, decide
from core.progress.ssp import Ssp as SspDecision

from ..tasks import JobState, TaskRecord
from .base import Control, Model, register


@register
class Ssp(Model):
    name = "ssp"
    rule = "bound"
    multicasts = True  # forms one-source multicasts (schemes mcast, mcast-l3), or one-member reduces
    groups = "multicast"

    def __init__(self, staleness: int = 2, **_: Any) -> None:
        self.decision = decide("ssp", staleness=staleness)
        assert isinstance(self.decision, SspDecision)

    # the decision's state, as this model and mcast-ssp read it
    @property
    def s(self) -> int:
        return self._ssp.s

    @property
    def done(self) -> dict[int, int]:
        return self._ssp.done

    @property
    def allowed(self) -> dict[int, int]:
        return self._ssp.allowed

    @property
    def violations(self) -> int:
        return self._ssp.violations

    @violations.setter
    def violations(self, n: int) -> None:
        self._ssp.violations = n

    @property
    def _ssp(self) -> SspDecision:
        assert isinstance(self.decision, SspDecision)
        return self.decision

    def start(self, ctl: Control, js: JobState) -> None:
        self._act(ctl, js, self.decision.start(ctl.alive(), time.time(), rounds=js.rounds))

    def ready(self, ctl: Control, js: JobState, node: int, rnd: int, have: set[int]) -> None:
        self._act(ctl, js, self.decision.ready(node, rnd, time.time(), last=rnd >= js.rounds - 1, alive=ctl.alive()))

    def task_done(self, ctl: Control, js: JobState, rec: TaskRecord) -> None:
        self._act(ctl, js, self.decision.over(None, rec.iters, time.time()))  # over or given up: the same

    def lost(self, ctl: Control, js: JobState, node: int) -> None:
        self._act(ctl, js, self.decision.lost(node, time.time(), alive=ctl.alive()))

    def staleness(self) -> int | None:
        return self.s

    def _done(self, ctl: Control, js: JobState, node: int, k: int) -> None:
        """The worker's iteration k needs no multicast (nobody to tell): done at once."""
        self._act(ctl, js, self._ssp.finished(node, k))

    def _act(self, ctl: Control, js: JobState, actions: Sequence[Action]) -> None:
        gos: list[Go] = []
        for a in actions:
            if isinstance(a, Form):
                ctl.form(js, a.members, a.receivers, a.iters[a.members[0]], iters=a.iters)
            else:
                gos.append(a)
        self._advance(ctl, js, gos)

    def _advance(self, ctl: Control, js: JobState, gos: Sequence[Go]) -> None:
        """The allowances that rose: a GO each."""
        for g in gos:
            ctl.go(js, g.upto, g.worker)
