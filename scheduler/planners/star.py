"""Parameter server (MXNet-style hub and spokes): every node sends to one hub, which sends back."""

from __future__ import annotations

from core.plan import Job, Plan

from ..view import NetworkView
from .common import hub_for, single_tree_plan


def plan(view: NetworkView, job: Job) -> Plan:
    """The hub may be outside the members (option `hub`): it then only aggregates and sends back."""
    hub = hub_for(view, job)
    view.require_connected({*job.participants, hub})
    parent = {n: (None if n == hub else hub) for n in {*job.participants, hub}}
    return single_tree_plan("star", job, hub, parent)
