"""PLink-like hierarchical all-reduce (Luo et al.): inside each machine one tree to its leader,
between machines one tree over the leaders; reduce up, broadcast down.

The machine's leader is its member with the most rate to other machines; inside a machine every
member sends straight to it (a star: one PCIe hop); the leaders form the widest spanning tree
(maximum over each pair's slower direction), rooted at the leader whose tree is shallowest.
Pipelined chunk by chunk like every plan here (PLink runs its phases one after the other; the data
plane overlaps them, which can only help it). With one node per machine it is the widest spanning
tree over the members.
"""

from __future__ import annotations

import networkx as nx

from core.plan import Job, Plan

from ..view import NetworkView
from .common import single_tree_plan
from .machines import machines_of


def plan(view: NetworkView, job: Job) -> Plan:
    view.require_connected(job.participants)
    machines = machines_of(view, job)
    home = {n: i for i, m in enumerate(machines) for n in m}

    def outward(n: int) -> float:
        return sum(view.rate(n, x) for x in view.g.successors(n) if x in home and home[x] != home[n])
    leaders = [max(m, key=lambda n: (outward(n), -n)) for m in machines]
    parent: dict[int, int | None] = {}
    for m, lead in zip(machines, leaders, strict=True):
        for n in m:
            if n != lead:
                parent[n] = lead
    g = nx.Graph()
    g.add_nodes_from(leaders)
    for i, a in enumerate(leaders):
        for b in leaders[i + 1:]:
            if view.g.has_edge(a, b) and view.g.has_edge(b, a):
                g.add_edge(a, b, w=min(view.rate(a, b), view.rate(b, a)))
    if not nx.is_connected(g):  # leaders without direct links between them: their routes carry it
        g.add_edges_from(((a, b, {"w": 1.0}) for i, a in enumerate(leaders) for b in leaders[i + 1:]
                          if not g.has_edge(a, b)))
    tree = nx.maximum_spanning_tree(g, weight="w")
    root = min(leaders, key=lambda r: (max(nx.single_source_shortest_path_length(tree, r).values(), default=0), r))
    pred = nx.predecessor(tree, root)
    for n in leaders:
        parent[n] = pred[n][0] if pred[n] else None
    return single_tree_plan("plink", job, root, parent)
