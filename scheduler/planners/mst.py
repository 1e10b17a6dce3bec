"""TSEngine reduced to its tree: a maximum-throughput spanning tree over measured links.

Kruskal on weights 1/rate (a link's rate is the slower of its two directions, since partial sums
go up and final values come down the same edge). The root is the node whose tree paths have the
smallest worst-case transfer delay, a stand-in for NetStorm's quality score.
"""

from __future__ import annotations

import networkx as nx

from core.plan import Job, Plan

from ..view import DisconnectedView, NetworkView
from .common import single_tree_plan


def plan(view: NetworkView, job: Job) -> Plan:
    """Option `aggregators`: nodes outside the members the tree may pass through; those it needs stay
    inner nodes (they aggregate and replicate without contributing), the rest are pruned."""
    members = set(job.participants)
    parts = members | {int(n) for n in job.options.get("aggregators", ())}
    view.require_connected(parts)
    g = nx.Graph()
    g.add_nodes_from(parts)
    for a, b in view.links():
        if a < b and a in parts and b in parts and view.g.has_edge(b, a):
            g.add_edge(a, b, w=1.0 / max(1e-9, min(view.rate(a, b), view.rate(b, a))))
    if not nx.is_connected(g):
        raise DisconnectedView("participants are not connected by direct links; mst needs direct links")
    tree = nx.minimum_spanning_tree(g, weight="w", algorithm="kruskal")
    while leaves := [n for n in tree if tree.degree(n) <= 1 and n not in members and len(tree) > 1]:
        tree.remove_nodes_from(leaves)  # an aggregator nothing flows through has no part to play
    parts = set(tree)
    if "root" in job.options:
        root = int(job.options["root"])
    else:
        depth = {r: max(nx.single_source_dijkstra_path_length(tree, r, weight="w").values()) for r in sorted(parts)}
        root = min(sorted(parts), key=lambda r: depth[r])
    pred = nx.predecessor(tree, root)
    parent = {n: (pred[n][0] if pred[n] else None) for n in parts}
    return single_tree_plan("mst", job, root, parent)
