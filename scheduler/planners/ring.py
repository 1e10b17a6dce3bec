"""Ring all-reduce as plans: per chunk a chain of partial sums ending at its owner, then a chain back.

Reduce-scatter and all-gather in one form: the chunk owned by p_j is summed along
p_{j+1} -> p_{j+2} -> ... -> p_j and broadcast along p_j -> p_{j+1} -> ... -> p_{j-1}.
The tensor is cut into a multiple of N equal chunks so owners carry equal shares.
"""

from __future__ import annotations

import math

from core.plan import ChunkGroup, Job, Plan, make_layout

from ..view import NetworkView


def plan(view: NetworkView, job: Job) -> Plan:
    view.require_connected(job.participants)
    return ring_plan("ring", job, sorted(job.participants))


def ring_plan(scheme: str, job: Job, ring: list[int]) -> Plan:
    """Ring all-reduce along `ring` (the members in ring order)."""
    n = len(ring)
    if n == 1:
        layout = make_layout(job.params, job.chunk_params)
        return Plan(0, scheme, (ring[0],), {ring[0]: 1.0}, layout,
                    (ChunkGroup(tuple(range(len(layout))), ring[0], {ring[0]: None}, {}),))
    per_owner = max(1, math.ceil(job.params / job.chunk_params / n))
    chunks = min(n * per_owner, job.params)
    layout = make_layout(job.params, math.ceil(job.params / chunks))
    groups = []
    for j, owner in enumerate(ring):
        mine = tuple(c for c in range(len(layout)) if c % n == j)
        if not mine:
            continue
        order = [ring[(j + 1 + i) % n] for i in range(n)]  # ends at the owner
        parent = {order[i]: order[i + 1] for i in range(n - 1)}
        parent[owner] = None
        down = [owner] + order[:-1]
        children = {down[i]: (down[i + 1],) for i in range(n - 1)}
        groups.append(ChunkGroup(mine, owner, parent, children))
    return Plan(0, scheme, tuple(sorted(ring)), {p: 1.0 for p in ring}, layout, tuple(groups))
