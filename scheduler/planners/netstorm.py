"""NetStorm: multi-root fastest aggregation path trees (Algorithms 1 and 2 of the paper).

Every candidate root r gets the shortest-path tree toward it under w(e) = 1/s(e), directed in the
push direction (child -> parent), built from one Dijkstra predecessor array so it is a tree. Its
delay w(T_r) is the largest distance to r (Theorem 1 with w_proc = 0), its quality q_r = 1/w(T_r).
The N best roots each own a share of the parameters proportional to q, allocated chunk by chunk
round-robin (digest 002 §2.5). The first plan has no measurements; once reports are in, roots and
shares are computed once more and then kept (moving a root moves parameters), unless `reroot`.

Options (Job.options): `roots` (N, default all nodes), `both_directions` (weigh push and pull),
`reroot` (recompute roots and shares on every plan), `aux` (attach Algorithm 3's auxiliary
routes to every tree edge), `aux_mode` (global_prune | per_pair_disjoint), `explore` (with aux:
also one-relay routes over links never measured; default on). The frozen choice is kept in the
job's planner memory (scheduler.planners.PlannerSpec).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import networkx as nx

from core.plan import ChunkGroup, Job, Plan, make_layout, tree_group

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


Routes = dict[tuple[int, int], list[tuple[int, ...]]]


def with_exploration(view: NetworkView, participants: Sequence[int], table: Routes) -> Routes:
    """Passive awareness only sees links that carry chunks (the "avalanche effect"). For every link
    u->v never measured, append a route u -> v -> ... -> w to the pair (u, w), where w is another
    neighbour of u reached from v by the fewest hops avoiding u (a cycle through the link): when a
    tree edge u->w is busy, the auxiliary dispatch sends chunks that way and every hop gets measured.
    Once measured, a link drops out of these extra routes."""
    parts = set(participants)
    g = view.g.subgraph(parts)
    out = {k: list(v) for k, v in table.items()}
    for u, v in sorted(g.edges):
        if g.edges[u, v]["measured"]:
            continue
        others = set(g.successors(u)) - {v}
        if not others:
            continue
        rest = g.subgraph(parts - {u})
        paths = nx.single_source_shortest_path(rest, v)
        reach = sorted((len(paths[w]), w) for w in others if w in paths)
        if not reach:
            continue
        w = reach[0][1]
        route = (u, *paths[w])
        if route not in out.setdefault((u, w), []):
            out[(u, w)].append(route)
    return {k: v for k, v in out.items() if v}


def with_aux(group: ChunkGroup, table: dict[tuple[int, int], list[tuple[int, ...]]]) -> ChunkGroup:
    """Auxiliary routes for every edge of the group's trees, pushing (child->parent) and pulling."""
    aux = {}
    for c, p in group.parent.items():
        if p is None:
            continue
        for a, b in ((c, p), (p, c)):
            if table.get((a, b)):
                aux[(a, b)] = tuple(table[(a, b)])
    return dataclasses.replace(group, aux=aux)


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


def plan(view: NetworkView, job: Job, memory: dict[str, Any] | None = None) -> Plan:
    """memory: what this job's earlier plans chose (its roots once measured, kept under "frozen"; the
    latest choice under "last"); updated here."""
    view.require_connected(job.participants)
    opts = job.options
    state = {} if memory is None else memory
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
    if opts.get("aux"):
        table = aux_paths(view, job.participants, mode=str(opts.get("aux_mode", "global_prune")))
        if opts.get("explore", True):
            table = with_exploration(view, job.participants, table)
        groups = [with_aux(g, table) for g in groups]
    return Plan(0, "netstorm", tuple(sorted(job.participants)), {n: 1.0 for n in job.participants}, layout,
                tuple(groups))


def refresh_aux(view: NetworkView, job: Job, plan: Plan) -> Plan:
    """Algorithm 3 again on the current view, for the trees `plan` already has (§VII-B: auxiliary
    tables change without a new version; source routing keeps chunks in flight safe)."""
    opts = job.options
    table = aux_paths(view, job.participants, mode=str(opts.get("aux_mode", "global_prune")))
    if opts.get("explore", True):
        table = with_exploration(view, job.participants, table)
    return Plan(plan.version, plan.scheme, plan.participants, plan.weights, plan.layout,
                tuple(with_aux(g, table) for g in plan.groups), plan.multicast)


def aux_paths(view: NetworkView, participants: Sequence[int], *, mode: str = "global_prune",
              max_per_pair: int = 4) -> dict[tuple[int, int], list[tuple[int, ...]]]:
    """Algorithm 3: per ordered pair, auxiliary relay paths over links the faster paths left idle.

    global_prune (the paper, literally): every round takes all-pairs shortest paths on what is
    left of the graph and removes every edge any of them used; a pair's k-th path comes from round
    k, so paths of one pair are edge-disjoint and round 1 (the primaries) is skipped.
    per_pair_disjoint (the authors' code): per pair, the cheapest simple paths whose relays are
    disjoint from those already kept, primary links allowed.
    Only paths with at least one relay are returned (a direct link is the primary path).
    """
    parts = set(participants)
    g = nx.DiGraph()
    for a, b in view.links():
        if a in parts and b in parts:
            g.add_edge(a, b, w=1.0 / max(view.rate(a, b), 1e-9))
    out: dict[tuple[int, int], list[tuple[int, ...]]] = {}
    if mode == "global_prune":
        first = True
        while g.number_of_edges():
            used: set[tuple[int, int]] = set()
            paths = dict(nx.all_pairs_dijkstra_path(g, weight="w"))
            for i in sorted(paths):
                for j in sorted(paths[i]):
                    if i == j:
                        continue
                    p = tuple(paths[i][j])
                    used.update(zip(p, p[1:], strict=False))
                    if not first and len(p) >= 3 and len(out.get((i, j), ())) < max_per_pair:
                        out.setdefault((i, j), []).append(p)
            g.remove_edges_from(used)
            first = False
    elif mode == "per_pair_disjoint":
        for i in sorted(parts):
            for j in sorted(parts):
                if i == j:
                    continue
                kept: list[tuple[int, ...]] = []
                relays: set[int] = set()
                for p in nx.shortest_simple_paths(g, i, j, weight="w"):
                    if len(p) < 3:
                        continue
                    if relays.isdisjoint(p[1:-1]):
                        kept.append(tuple(p))
                        relays.update(p[1:-1])
                    if len(kept) >= max_per_pair or len(p) > len(parts):
                        break
                if kept:
                    out[(i, j)] = kept
    else:
        raise ValueError(f"aux mode must be global_prune or per_pair_disjoint, got {mode!r}")
    return out
