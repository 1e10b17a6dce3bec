"""One planner per scheme: `plan(view, job) -> Plan`. Later schemes register here too.

A scheme name may also be a variant: a planner plus fixed options (NetStorm's ablation ladder).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

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
# variant -> (planner, options it always gets). NetStorm's ladder: lite = multi-root FAPT planned
# once; std = + awareness (re-planned as measurements change); pro (plain "netstorm") = + auxiliary paths
VARIANTS: dict[str, tuple[str, Mapping[str, Any]]] = {
    "netstorm-lite": ("netstorm", {"awareness": False, "aux": False}),
    "netstorm-std": ("netstorm", {"awareness": True, "aux": False}),
    "netstorm": ("netstorm", {"awareness": True, "aux": True}),
}
# schemes re-planned as the view changes within a job (star and ktree keep the hub they started with)
ADAPTIVE = frozenset({"mst", "netstorm"})


def resolve(scheme: str) -> tuple[Planner, dict[str, Any]]:
    """The planner of a scheme or variant, and the options the variant fixes."""
    name, fixed = VARIANTS.get(scheme, (scheme, {}))
    try:
        return PLANNERS[name], dict(fixed)
    except KeyError:
        known = sorted(set(PLANNERS) | set(VARIANTS))
        raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(known)}") from None


def get(scheme: str) -> Planner:
    return resolve(scheme)[0]


def refreshes_aux(scheme: str, options: Mapping[str, Any]) -> bool:
    """Whether the scheme's auxiliary tables are recomputed between versions (NetStorm with aux)."""
    return VARIANTS.get(scheme, (scheme, {}))[0] == "netstorm" and bool(options.get("aux"))


def refresh_aux(view: NetworkView, job: Job, plan: Plan) -> Plan:
    return netstorm.refresh_aux(view, job, plan)


def adaptive(scheme: str, options: Mapping[str, Any]) -> bool:
    name = VARIANTS.get(scheme, (scheme, {}))[0]
    return name in ADAPTIVE and options.get("awareness", True) is not False
