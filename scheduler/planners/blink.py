"""BLINK-like (Wang et al., MLSys'20): spanning trees packed from one root, reduce then broadcast.

Inside one machine (or on a WAN, where every member is a machine of its own) BLINK packs spanning
trees from one root over the members only (it relays through no inactive GPU): the packing LP
(packing_lp.pack) restricted to that root and those nodes, reduce and broadcast as separate stages
(each may use a link's full rate: T = 2 S / sum chi), from the root whose packing is widest: the
best-connected member first, then (while the members are few) the others, until one reaches the
members' smallest directed cut λ. No root's packing is wider (Edmonds: trees out of a root, and into
it, pack up to its smallest cut each way, and every cut separates it from some member one way or the
other), and on every mesh measured the first root reaches it: one solve, not one per member (an
8-node hetero mesh: 0.07 s, against 0.55 s of solves when every root was packed and the widest kept,
which among equally wide roots was whichever the LP's rounding favoured).
Across machines BLINK is hierarchical (digest 001 §5.4): each machine reduces to its leader over trees
packed inside it, the leaders run a ring all-reduce over the network, and each machine broadcasts back
down its trees. As one plan:
per ring owner and per slice of every machine's trees, one group whose aggregation tree is the
machines' reduce trees into their leaders and the leaders' chain ending at the owner, and whose
broadcast tree is the chain onward from the owner and the machines' broadcast trees. The data plane
pipelines the three phases chunk by chunk (BLINK runs them one after the other), which can only help
it.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.plan import ChunkGroup, Job, Plan

from ..view import NetworkView
from .common import best_hub
from .machines import machines_of
from .packing import (
    FILL,
    children_of,
    chunk_floor,
    compile_packing,
    largest_remainder,
    pair_trees,
    pipelined,
    tree_depth,
)
from .packing_lp import Packing, pack

TRY_EVERY_ROOT = 9  # members up to which every root is tried
WIDE_ENOUGH = 1e-6  # a packing this close to λ (relative) is as wide as any root's: the search ends


def plan(view: NetworkView, job: Job) -> Plan:
    members = sorted(job.participants)
    view.require_connected(members)
    machines = machines_of(view, job)
    if len(machines) > 1 and any(len(m) > 1 for m in machines):
        return _hierarchical(view, job, machines)
    hub = best_hub(view, members)
    roots = [hub, *(m for m in members if m != hub)] if len(members) <= TRY_EVERY_ROOT else [hub]
    return compile_packing(widest(view, members, roots), job, scheme="blink", min_chunk_params=chunk_floor(job))


def widest(view: NetworkView, members: Sequence[int], roots: Sequence[int]) -> Packing:
    """The widest root's packing, roots tried in order (the first of equals wins), until one reaches λ."""
    best: Packing | None = None
    for r in roots:
        pk = _packed(view, members, r)
        if best is None or pk.sum_chi > best.sum_chi:
            best = pk
        if best.sum_chi >= best.lam * (1 - WIDE_ENOUGH):
            break
    assert best is not None
    return best


def _packed(view: NetworkView, nodes: Sequence[int], root: int) -> Packing:
    """Spanning trees from `root` over `nodes` alone, reduce and broadcast as separate stages; one
    root needs as many trees as its cut has links, so no cap on trees per root."""
    capacity = {(a, b): view.rate(a, b) for a, b in view.links() if a in nodes and b in nodes}
    return pack(capacity, nodes, overlap=False, roots=[root], max_trees_per_root=None)


def _hierarchical(view: NetworkView, job: Job, machines: list[list[int]]) -> Plan:
    home = {n: i for i, m in enumerate(machines) for n in m}

    def outward(n: int) -> float:
        return sum(view.rate(n, x) for x in view.g.successors(n) if x in home and home[x] != home[n])
    leaders = [max(m, key=lambda n: (outward(n), -n)) for m in machines]
    # per machine: (reduce parents, broadcast parents, fraction) slices of its packed trees
    slices: list[list[tuple[dict, dict, float]]] = []
    for m, lead in zip(machines, leaders, strict=True):
        if len(m) == 1:
            slices.append([({lead: None}, {lead: None}, 1.0)])
            continue
        pk = _packed(view, m, lead)
        pairs = pair_trees(pk.reduce[lead], pk.broadcast[lead])
        total = sum(a for *_, a in pairs)
        slices.append([(dict(r.parent), dict(b.parent), a / total) for r, b, a in pairs])
    # cut [0, 1) where any machine moves to its next slice: each piece uses one slice per machine
    cuts = sorted({0.0, 1.0} | {round(sum(f for *_, f in s[:k + 1]), 12) for s in slices for k in range(len(s))})
    pieces = [(hi - lo, [_slice_at(s, (lo + hi) / 2) for s in slices])
              for lo, hi in zip(cuts, cuts[1:], strict=False) if hi - lo > 1e-9]
    n_owner = len(leaders)
    shares = [frac / n_owner for _ in range(n_owner) for frac, _ in pieces]
    sizes = largest_remainder(job.params, shares)
    layout: list[tuple[int, int]] = []
    groups: list[ChunkGroup] = []
    off = 0
    k = 0
    for j in range(n_owner):
        chain = [leaders[(j + 1 + i) % n_owner] for i in range(n_owner)]  # the ring, ending at owner j
        for _, pick in pieces:
            n = sizes[k]
            k += 1
            if n == 0:
                continue
            parent: dict[int, int | None] = {}
            bparent: dict[int, int | None] = {}
            for (r, b), lead in zip(pick, leaders, strict=True):
                parent.update({x: p for x, p in r.items() if x != lead})
                bparent.update({x: p for x, p in b.items() if x != lead})
            for a, nxt in zip(chain, chain[1:], strict=False):
                parent[a] = nxt
            parent[chain[-1]] = None
            down = [chain[-1], *chain[:-1]]
            for a, nxt in zip(down, down[1:], strict=False):
                bparent[nxt] = a
            bparent[chain[-1]] = None
            first = len(layout)
            layout += pipelined(off, n, tree_depth(parent) + tree_depth(bparent), FILL, chunk_floor(job))
            off += n
            groups.append(ChunkGroup(tuple(range(first, len(layout))), chain[-1], parent, children_of(bparent)))
    return Plan(0, "blink", tuple(job.participants), {n: 1.0 for n in job.participants}, tuple(layout),
                tuple(groups))


def _slice_at(slices: list[tuple[dict, dict, float]], x: float) -> tuple[dict, dict]:
    """The (reduce, broadcast) trees of the slice covering x in [0, 1) (slices in order, fractions)."""
    acc = 0.0
    for r, b, f in slices:
        acc += f
        if x < acc:
            return r, b
    return slices[-1][0], slices[-1][1]
