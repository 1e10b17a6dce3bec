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
"""

from __future__ import annotations

from typing import Any

from ..tasks import JobState, TaskRecord
from .base import Control, Model, register


@register
class Ssp(Model):
    name = "ssp"
    rule = "bound"
    multicasts = True  # forms one-source multicasts (schemes mcast, mcast-l3), or one-member reduces

    def __init__(self, staleness: int = 2, **_: Any) -> None:
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        self.s = staleness
        self.done: dict[int, int] = {}  # worker -> its last done iteration (its multicast is over)
        self.allowed: dict[int, int] = {}  # worker -> the highest iteration a GO allowed it
        self.violations = 0  # READYs for an iteration no GO allowed (must stay 0)

    def start(self, ctl: Control, js: JobState) -> None:
        self.done = {n: -1 for n in ctl.alive()}
        self._advance(ctl, js)

    def ready(self, ctl: Control, js: JobState, node: int, rnd: int, have: set[int]) -> None:
        if rnd > self.allowed.get(node, -1):  # the worker computed an iteration no GO allowed
            self.violations += 1
        others = [n for n in ctl.alive() if n != node]
        if others:
            ctl.form(js, (node,), others, rnd, iters={node: rnd})
        else:  # nobody to tell: done at once
            self._done(ctl, js, node, rnd)

    def task_done(self, ctl: Control, js: JobState, rec: TaskRecord) -> None:
        for node, k in rec.iters.items():  # over, exact or given up: the worker may go on
            self._done(ctl, js, node, k)

    def lost(self, ctl: Control, js: JobState, node: int) -> None:
        self.done.pop(node, None)  # the slowest is among the living
        self._advance(ctl, js)

    def _done(self, ctl: Control, js: JobState, node: int, k: int) -> None:
        if node in self.done:
            self.done[node] = max(self.done[node], k)
            self._advance(ctl, js)

    def _advance(self, ctl: Control, js: JobState) -> None:
        floor = min(self.done.values(), default=-1)
        for n, d in self.done.items():
            upto = min(d + 1, floor + 1 + self.s, js.rounds - 1)
            if upto > self.allowed.get(n, -1):
                self.allowed[n] = upto
                ctl.go(js, upto, n)
