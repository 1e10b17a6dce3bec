"""Parameter server (MXNet-style hub and spokes): every node sends to one hub, which sends back."""

from __future__ import annotations

from ..plan import Job, Plan
from ..view import NetworkView
from .common import hub_for, single_tree_plan


def plan(view: NetworkView, job: Job) -> Plan:
    view.require_connected(job.participants)
    hub = hub_for(view, job)
    parent = {n: (None if n == hub else hub) for n in job.participants}
    return single_tree_plan("star", job, hub, parent)
