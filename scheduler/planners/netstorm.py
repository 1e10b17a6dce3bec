"""NetStorm: multi-root fastest aggregation path trees (Algorithms 1 and 2 of the paper).

Every candidate root r gets the shortest-path tree toward it under w(e) = 1/s(e), directed in the
push direction (child -> parent), built from one Dijkstra predecessor array so it is a tree. Its
delay w(T_r) is the largest distance to r (Theorem 1 with w_proc = 0), its quality q_r = 1/w(T_r).
The N best roots each own a share of the parameters proportional to q, allocated chunk by chunk
round-robin (digest 002 §2.5). The first plan has no measurements; once reports are in, roots and
shares are computed once more and then kept (moving a root moves parameters), unless `reroot`.

Options (Job.options): `roots` (N, default all nodes), `both_directions` (weigh push and pull),
`reroot` (recompute roots and shares on every plan), `state` (the scheduler's per-job dict where
the frozen choice is kept).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import networkx as nx

from ..plan import ChunkGroup, Job, Plan, make_layout, tree_group
from ..view import DisconnectedView, NetworkView


def fastest_trees(view: NetworkView, participants: Sequence[int], *, both_directions: bool = False
                  ) -> dict[int, tuple[dict[int, int | None], float]]:
    """Algorithm 1 + the tree half of Algorithm 2: per root, (parent map, w(T_root))."""
    parts = set(participants)
    g = nx.DiGraph()
    g.add_nodes_from(parts)
    for a, b in view.links():
        if a in parts and b in parts:
            w = 1.0 / max(view.rate(a, b), 1e-9)
            if both_directions and view.g.has_edge(b, a):
                w += 1.0 / max(view.rate(b, a), 1e-9)
            g.add_edge(a, b, w=w)
    rev = g.reverse(copy=False)  # Dijkstra from the root on the reversed graph = paths toward it
    out = {}
    for r in sorted(parts):
        pred, dist = nx.dijkstra_predecessor_and_distance(rev, r, weight="w")
        if len(dist) < len(parts):
            raise DisconnectedView(f"nodes {sorted(parts - set(dist))} cannot reach root {r} over direct links")
        parent: dict[int, int | None] = {n: (min(pred[n]) if pred[n] else None) for n in parts}
        out[r] = (parent, max(dist.values()))
    return out


def allocate(layout: Sequence[tuple[int, int]], roots: Sequence[int], q: dict[int, float]) -> dict[int, list[int]]:
    """Chunks per root: shares of the parameter count proportional to q, handed out round-robin."""
    total = sum(n for _, n in layout)
    qsum = sum(q[r] for r in roots)
    quota = {r: math.ceil(q[r] / qsum * total) for r in roots}
    filled = dict.fromkeys(roots, 0)
    owned: dict[int, list[int]] = {r: [] for r in roots}
    k = 0
    for c, (_, n) in enumerate(layout):
        for _ in range(len(roots)):
            r = roots[k % len(roots)]
            if filled[r] < quota[r]:
                break
            k += 1
        r = roots[k % len(roots)]
        owned[r].append(c)
        filled[r] += n
        k += 1
    return owned


def plan(view: NetworkView, job: Job) -> Plan:
    view.require_connected(job.participants)
    opts = job.options
    state = opts.get("state", {})
    trees = fastest_trees(view, job.participants, both_directions=bool(opts.get("both_directions", False)))
    layout = make_layout(job.params, job.chunk_params)
    frozen = state.get("frozen")
    if frozen is None or opts.get("reroot"):
        n_roots = int(opts.get("roots") or len(job.participants))
        if not 1 <= n_roots <= len(job.participants):
            raise ValueError(f"roots must be in 1..{len(job.participants)}, got {n_roots}")
        q = {r: 1.0 / w if w > 0 else math.inf for r, (_, w) in trees.items()}
        roots = sorted(q, key=lambda r: (-q[r], r))[:n_roots]
        owned = allocate(layout, roots, q)
        choice = {"roots": roots, "owned": owned, "q": q}
        if view.samples > 0:  # measured: keep this choice from now on
            state["frozen"] = choice
    else:
        choice = frozen
    state["last"] = choice
    groups: list[ChunkGroup] = [tree_group(choice["owned"][r], r, trees[r][0])
                                for r in choice["roots"] if choice["owned"][r]]
    return Plan(0, "netstorm", tuple(sorted(job.participants)), {n: 1.0 for n in job.participants}, layout,
                tuple(groups))
