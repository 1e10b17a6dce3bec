"""Sharded parameter server: every member owns an equal shard, which every other member sends to it
directly (one hop, or its min-hop route) and gets back from it: one star tree per shard.

The paper's strongest baseline on GPU meshes (digest 001, §5: S = N co-located shards), and on a
full mesh of equal links exactly the tree-packing optimum (one one-hop star per root).
"""

from __future__ import annotations

import math

from core.plan import Job, Plan, make_layout, tree_group

from ..view import NetworkView


def plan(view: NetworkView, job: Job) -> Plan:
    members = sorted(job.participants)
    view.require_connected(members)
    n = len(members)
    per_owner = max(1, math.ceil(job.params / job.chunk_params / n))
    layout = make_layout(job.params, math.ceil(job.params / min(n * per_owner, job.params)))
    groups = []
    for j, owner in enumerate(members):
        mine = [c for c in range(len(layout)) if c % n == j]
        if mine:
            groups.append(tree_group(mine, owner, {m: (None if m == owner else owner) for m in members}))
    return Plan(0, "shardps", tuple(members), {m: 1.0 for m in members}, layout, tuple(groups))
