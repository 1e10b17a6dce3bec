"""Which members share a machine: the GPU-cluster baselines (double binary tree, PLink) build one
structure inside each machine and another between machines.

From the `machines` option (lists of node ids), else read off the view: the members joined by links
at the fastest rate the view holds between members (PCIe/NVLink against the network), in both
directions, form a machine if every pair of them is so joined. Where that does not hold (a WAN),
every member is a machine of its own and the schemes fall back to their flat forms.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from core.plan import Job

from ..view import NetworkView

SAME_RATE = 1e-6  # relative: links this close to the fastest count as inside a machine


def machines_of(view: NetworkView, job: Job) -> list[list[int]]:
    """The members grouped by machine, each group ascending, groups by their lowest member."""
    members = sorted(job.participants)
    given = job.options.get("machines")
    if given is not None:
        return _given(given, members)
    rates = {(a, b): view.rate(a, b) for a, b in view.links() if a in members and b in members}
    if not rates:
        return [[m] for m in members]
    top = max(rates.values())
    g = nx.Graph()
    g.add_nodes_from(members)
    g.add_edges_from((a, b) for (a, b), r in rates.items()
                     if r >= top * (1 - SAME_RATE) and rates.get((b, a), 0.0) >= top * (1 - SAME_RATE))
    groups = sorted(sorted(c) for c in nx.connected_components(g))
    if any(g.subgraph(grp).number_of_edges() != len(grp) * (len(grp) - 1) // 2 for grp in groups):
        return [[m] for m in members]  # not machines (fully connected inside): no grouping at all
    return groups


def _given(given: object, members: Sequence[int]) -> list[list[int]]:
    try:
        groups = [sorted({int(n) for n in grp}) for grp in given]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(f"machines must be a list of lists of node ids, got {given!r}") from None
    seen: set[int] = set()
    for grp in groups:
        if seen & set(grp):
            raise ValueError(f"machines: node(s) {sorted(seen & set(grp))} are in more than one machine")
        seen |= set(grp)
    missing = sorted(set(members) - seen)
    if missing:
        raise ValueError(f"machines: member(s) {missing} are in no machine")
    member_set = set(members)
    return sorted(g for g in ([n for n in grp if n in member_set] for grp in groups) if g)
