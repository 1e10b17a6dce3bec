"""MLNET's balanced k-ary tree: static, blind to the network, BFS-filled in node-id order under the hub."""

from __future__ import annotations

from core.plan import Job, Plan

from ..view import NetworkView
from .common import hub_for, single_tree_plan


def plan(view: NetworkView, job: Job) -> Plan:
    view.require_connected(job.participants)
    k = int(job.options.get("k", 2))
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    root = hub_for(view, job)
    order = [root] + sorted(n for n in job.participants if n != root)
    parent: dict[int, int | None] = {root: None}
    for i, n in enumerate(order[1:], start=1):
        parent[n] = order[(i - 1) // k]
    return single_tree_plan("ktree", job, root, parent)
