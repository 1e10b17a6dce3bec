"""BLINK-like (Wang et al., MLSys'20): spanning trees packed from one root over the members only,
reduce then broadcast.

The packing LP (packing_lp.pack) restricted to one root and to the members (BLINK relays through no
inactive GPU), with reduce and broadcast as separate stages (each may use a link's full rate:
T = 2 S / sum chi); the trees are paired and compiled into groups as tree packing's are. The root is
the one whose packing is widest (every member tried while the members are few, else the
best-connected member).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..plan import Job, Plan
from ..view import NetworkView
from .common import best_hub
from .packing import compile_packing
from .packing_lp import pack

TRY_EVERY_ROOT = 16  # members up to which every root is tried


def plan(view: NetworkView, job: Job, memory: Mapping[str, Any] | None = None) -> Plan:
    members = sorted(job.participants)
    view.require_connected(members)
    capacity = {(a, b): view.rate(a, b) for a, b in view.links() if a in members and b in members}
    roots = members if len(members) <= TRY_EVERY_ROOT else [best_hub(view, members)]
    best = max((pack(capacity, members, overlap=False, roots=[r]) for r in roots), key=lambda pk: pk.sum_chi)
    return compile_packing(best, job, scheme="blink")
