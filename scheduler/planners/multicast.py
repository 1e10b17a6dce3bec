"""Multicast: one source's tensor delivered to a receiver set (SelMcast's unit of synchronization).

The source is the task's only member (weight 1, nothing to aggregate); every chunk's broadcast tree
starts at it. Option `receivers` (default: every other node the view knows); `mode`:

    l7  one unicast per receiver, all at once: the source's tree is a star (each edge follows its
        min-hop route; relays only forward)
    l3  each byte leaves the source once and is replicated where routes part: the min-hop shortest-
        path tree from the source over the view's links, pruned to the receivers; inner nodes that are
        no receivers replicate (an overlay's stand-in for IP multicast)
"""

from __future__ import annotations

from core.plan import ChunkGroup, Job, Plan, PlanError, make_layout

from ..view import NetworkView


def plan(view: NetworkView, job: Job) -> Plan:
    if len(job.participants) != 1:
        raise PlanError(f"a multicast has one source, got members {list(job.participants)}")
    src = job.participants[0]
    receivers = tuple(sorted(int(n) for n in job.options.get("receivers", [n for n in view.nodes if n != src])))
    if not receivers or src in receivers:
        raise PlanError(f"multicast from {src}: receivers {list(receivers)} must be other nodes")
    view.require_connected((src, *receivers))
    mode = job.options.get("mode", "l7")
    if mode == "l7":
        children = {src: receivers}
    elif mode == "l3":
        children = _replication_tree(view, src, set(receivers))
    else:
        raise PlanError(f"multicast mode must be l7 or l3, got {mode!r}")
    layout = make_layout(job.params, job.chunk_params)
    group = ChunkGroup(tuple(range(len(layout))), src, {src: None}, children)
    return Plan(0, f"mcast-{mode}", (src,), {src: 1.0}, layout, (group,), receivers=receivers)


def _replication_tree(view: NetworkView, src: int, receivers: set[int]) -> dict[int, tuple[int, ...]]:
    """Min-hop tree from `src` over the view's links (ties: lowest node id first), keeping only the
    branches that lead to a receiver."""
    parent: dict[int, int] = {}
    seen, frontier = {src}, [src]
    while frontier:
        nxt = []
        for u in sorted(frontier):
            for v in sorted(view.g.successors(u)):
                if v not in seen:
                    seen.add(v)
                    parent[v] = u
                    nxt.append(v)
        frontier = nxt
    keep: set[int] = set()
    for r in receivers:
        while r != src and r not in keep:
            keep.add(r)
            r = parent[r]
    children: dict[int, list[int]] = {}
    for v in sorted(keep):
        children.setdefault(parent[v], []).append(v)
    return {u: tuple(kids) for u, kids in children.items()}
