"""Progress models' decisions, pure, in one registry: when workers synchronize and how far one may run
ahead. The live scheduler (scheduler/progress adapts each to its Control) and the simulator's job mode
(sim/job.py) take them from `DECISIONS` by name, so both run the very same decisions:

    bsp        one task per round, formed once every worker is READY
    ssp        a multicast of every iteration to the others; the staleness bound decides the GOs
    queue      a ready queue: the first p READY form a partial reduce (P-Reduce)
    selective  selective reduce and its baselines (core.selective's Controller)

`SIMULATED` names those the simulator can run (all of these). CREW's failure rules (crew) and the
multicast models with receiver selection (mcast-bsp, mcast-ssp) live in the scheduler only: they act
on its view, plans and task records; crew groups with `queue`, mcast-ssp bounds with `ssp`.
"""

from __future__ import annotations

from . import bsp, queue, selective, ssp  # noqa: F401  (each registers its decision)
from .base import DECISIONS, SIMULATED, Action, Decision, Form, Go, decide, register

__all__ = ["DECISIONS", "SIMULATED", "Action", "Decision", "Form", "Go", "decide", "register"]
