"""One planner per scheme: `plan(view, job) -> Plan`. Later schemes register here too."""

from __future__ import annotations

from collections.abc import Callable

from ..plan import Job, Plan
from ..view import NetworkView
from . import ktree, mst, netstorm, ring, star

Planner = Callable[[NetworkView, Job], Plan]

PLANNERS: dict[str, Planner] = {
    "star": star.plan,
    "ring": ring.plan,
    "mst": mst.plan,
    "ktree": ktree.plan,
    "netstorm": netstorm.plan,
}
# schemes re-planned as the view changes within a job (star and ktree keep the hub they started with)
ADAPTIVE = frozenset({"mst", "netstorm"})


def get(scheme: str) -> Planner:
    try:
        return PLANNERS[scheme]
    except KeyError:
        raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(PLANNERS)}") from None
