"""NetStorm's topology metric: a tree's synchronization delay with transfer and blockage delays.

Theorem 1: with per-chunk pipelining (no exposed processing delay), a tree's delay is its largest
leaf-to-root sum of transfer delays; blockage (waiting for the slowest child) is what makes the
max, not the sum over children, the right aggregate. The recursive form below also returns each
node's blockage, which is what explains a slow tree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


def tree_delay(parent: Mapping[int, int | None], w_trans: Callable[[int, int], float],
               w_proc: Mapping[int, float] | None = None) -> tuple[float, dict[int, float]]:
    """(w(T), ready time of every node). w_trans(child, parent) is the transfer delay of that edge.

    ready(v) = 0 for a leaf, else max over children c of (ready(c) + w_trans(c, v)) + w_proc(v).
    """
    children: dict[int, list[int]] = {}
    root = None
    for v, p in parent.items():
        if p is None:
            if root is not None:
                raise ValueError(f"two roots: {root} and {v}")
            root = v
        else:
            children.setdefault(p, []).append(v)
    if root is None:
        raise ValueError("the tree has no root")
    ready: dict[int, float] = {}
    order = [root]  # BFS, then fill bottom-up
    for v in order:
        order.extend(children.get(v, ()))
    if len(order) != len(parent):
        raise ValueError("the parent map is not a tree (a cycle or an unreachable node)")
    for v in reversed(order):
        kids = children.get(v, ())
        ready[v] = (max(ready[c] + w_trans(c, v) for c in kids) + (w_proc or {}).get(v, 0.0)) if kids else 0.0
    return ready[root], ready


def blockage(parent: Mapping[int, int | None], w_trans: Callable[[int, int], float]) -> dict[int, float]:
    """How long each node's partial sum waits at its parent for the parent's slowest other child."""
    _, ready = tree_delay(parent, w_trans)
    arrive = {c: ready[c] + w_trans(c, p) for c, p in parent.items() if p is not None}
    last: dict[int, float] = {}
    for c, p in parent.items():
        if p is not None:
            last[p] = max(last.get(p, 0.0), arrive[c])
    return {c: last[p] - arrive[c] for c, p in parent.items() if p is not None}
