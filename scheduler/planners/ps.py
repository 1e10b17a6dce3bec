"""One global parameter server (a CREW baseline): the worker with the largest average direct bandwidth
to and from all others (over every node the view knows, not only the group) sums every group's
tensors and sends the result back; it may be a member (its own transfer is then local) or not."""

from __future__ import annotations

from core.plan import Job, Plan

from ..view import NetworkView
from .common import best_hub, single_tree_plan


def plan(view: NetworkView, job: Job) -> Plan:
    live = [n for n in view.nodes if view.g.degree(n) > 0]
    hub = best_hub(view, live or job.participants)
    view.require_connected({*job.participants, hub})
    parent = {n: (None if n == hub else hub) for n in {*job.participants, hub}}
    return single_tree_plan("ps", job, hub, parent)
