"""NCCL's double binary tree (Sanders et al., NCCL 2.4): two binary trees over the machines, each
carrying half the tensor, shaped so a machine is an inner node in at most one of them; inside a
machine the GPUs form a chain hanging off the machine's tree node (its head).

Tree 1 is NCCL's btree on ranks 0..M-1 (a rank's lowest set bit gives its parent and children;
rank 0 has one child); tree 2 is tree 1 shifted by one rank when M is even, mirrored (r -> M-1-r)
when it is odd. Tree 1 enters each machine at its first GPU and chains up the others in order;
tree 2 at its last GPU, chaining the other way, so the two use different GPUs' links. With one node
per machine (a WAN) it is the double binary tree over the members; pairs that are not neighbours
follow their min-hop routes.
"""

from __future__ import annotations

from core.plan import Job, Plan, make_layout, tree_group

from ..view import NetworkView
from .machines import machines_of


def btree(rank: int, n: int) -> int | None:
    """The parent of `rank` in NCCL's binary tree on ranks 0..n-1 (None at the root, rank 0)."""
    if rank == 0:
        return None
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return up if up < n else rank ^ bit


def dtree(rank: int, n: int) -> int | None:
    """The parent of `rank` in the second tree: the first one shifted (n even) or mirrored (n odd)."""
    if n % 2 == 0:
        p = btree((rank - 1) % n, n)
        return None if p is None else (p + 1) % n
    p = btree(n - 1 - rank, n)
    return None if p is None else n - 1 - p


def plan(view: NetworkView, job: Job) -> Plan:
    view.require_connected(job.participants)
    machines = machines_of(view, job)
    layout = make_layout(job.params, job.chunk_params)
    if len(layout) < 2:
        layout = make_layout(job.params, max(1, (job.params + 1) // 2))
    half = (len(layout) + 1) // 2
    groups = []
    for t, (tree, chunks) in enumerate(((btree, range(half)), (dtree, range(half, len(layout))))):
        heads = [m[0] if t == 0 else m[-1] for m in machines]
        parent: dict[int, int | None] = {}
        for r, m in enumerate(machines):
            up = tree(r, len(machines))
            parent[heads[r]] = None if up is None else heads[up]
            chain = m if t == 0 else m[::-1]
            for a, b in zip(chain[1:], chain, strict=False):  # each GPU hands its sum to the one before
                parent[a] = b
        root = next(n for n, p in parent.items() if p is None)
        if chunks:
            groups.append(tree_group(chunks, root, parent))
    return Plan(0, "dbtree", tuple(job.participants), {n: 1.0 for n in job.participants}, layout, tuple(groups))
