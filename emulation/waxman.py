"""Seeded large topologies for the simulator: sparse Waxman graphs and the CREW-style full mesh.

These are the sizes in the papers (60, 200, 1,000 nodes) that no machine here can host live, so
they only ever feed `wansync simulate`; both return an ordinary `Topology`, so the same adapter,
planners and routes apply. Everything is drawn from one numpy generator seeded by `seed`.
"""

from __future__ import annotations

import numpy as np

from .link import LinkSpec
from .topotypes import INTERNET2_DELAY_S, PAPER_RATE_RANGE, Topology, TopologyError

CREW_UNIT_MBPS = 25.0


def waxman(nodes: int, seed: int = 1, mean_degree: float = 3.0, alpha: float = 0.15,
           lo: float = PAPER_RATE_RANGE[0], hi: float = PAPER_RATE_RANGE[1],
           max_delay_s: float = 0.050) -> Topology:
    """Waxman graph on the unit square: P(edge) = beta * exp(-d / (alpha * L)).

    beta is solved from the wanted mean degree rather than given, so sizes stay comparable; the
    few components left over are joined to the rest by their shortest edge (which adds a handful
    of edges, so the mean degree ends a little above `mean_degree`). Every direction of every edge
    draws an integer rate in [lo, hi] Mbit/s as in NetStorm's scripts; the one-way delay grows with
    distance (`max_delay_s` for the farthest pair of points), as propagation delay does.
    """
    if nodes < 2:
        raise TopologyError(f"nodes: waxman needs at least 2 nodes, got {nodes}")
    rng = np.random.default_rng(seed)
    pos = rng.random((nodes, 2))
    iu, ju = np.triu_indices(nodes, 1)
    dist = np.hypot(pos[iu, 0] - pos[ju, 0], pos[iu, 1] - pos[ju, 1])
    span = float(dist.max()) or 1.0
    weight = np.exp(-dist / (alpha * span))
    beta = min(1.0, mean_degree * nodes / 2 / float(weight.sum()))
    keep = rng.random(len(weight)) < beta * weight
    edges = set(zip(iu[keep].tolist(), ju[keep].tolist(), strict=True))
    edges |= _joining_edges(pos, edges, nodes)
    links: dict[tuple[int, int], LinkSpec] = {}
    for a, b in sorted(edges):
        delay = max_delay_s * float(np.hypot(*(pos[a] - pos[b]))) / span
        for s, d in ((a, b), (b, a)):
            links[(s, d)] = LinkSpec(float(rng.integers(int(lo), int(hi) + 1)), delay)
    return Topology(f"waxman{nodes}", nodes, links)


def _joining_edges(pos: np.ndarray, edges: set[tuple[int, int]], nodes: int) -> set[tuple[int, int]]:
    """Shortest edges that connect every component to the largest one (Topology demands connectivity).
    scipy is imported here, not with the module: an agent imports the topologies but never draws one."""
    from scipy.sparse import coo_array
    from scipy.sparse.csgraph import connected_components

    if edges:
        a, b = np.array(sorted(edges)).T
    else:
        a = b = np.zeros(0, dtype=int)
    graph = coo_array((np.ones(len(a)), (a, b)), shape=(nodes, nodes))
    ncomp, label = connected_components(graph, directed=False)
    if ncomp == 1:
        return set()
    main = int(np.bincount(label).argmax())
    inside = np.flatnonzero(label == main)
    added: set[tuple[int, int]] = set()
    for comp in range(ncomp):
        if comp == main:
            continue
        members = np.flatnonzero(label == comp)
        d = np.hypot(pos[members, None, 0] - pos[None, inside, 0], pos[members, None, 1] - pos[None, inside, 1])
        i, j = np.unravel_index(int(d.argmin()), d.shape)
        u, v = int(members[i]), int(inside[j])
        added.add((min(u, v), max(u, v)))
        inside = np.concatenate([inside, members])
    return added


def crew_mesh(nodes: int, seed: int = 1, unit_mbps: float = CREW_UNIT_MBPS,
              delay_s: float = INTERNET2_DELAY_S) -> Topology:
    """CREW's full mesh: each direction gets unit_mbps times an integer from N(5, 1), clipped to 1..10."""
    if nodes < 2:
        raise TopologyError(f"nodes: crew needs at least 2 nodes, got {nodes}")
    rng = np.random.default_rng(seed)
    mult = np.clip(np.rint(rng.normal(5.0, 1.0, size=(nodes, nodes))), 1, 10)
    links = {(a, b): LinkSpec(unit_mbps * float(mult[a, b]), delay_s)
             for a in range(nodes) for b in range(nodes) if a != b}
    return Topology(f"crew{nodes}", nodes, links)


def from_spec(spec: str) -> Topology:
    """`waxman:N[:seed=S][:x=F]` or `crew:N[:seed=S][:x=F]`, the command line's names for these
    generators; x multiplies every rate (default 1), so a live run can be sized to what the machine
    emulating it can carry (CREW's 25-250 Mbit/s on every direction of a 16-node mesh cannot all run
    at once in one Python process per node on two cores)."""
    name, *args = spec.split(":")
    if name not in ("waxman", "crew") or not args:
        raise TopologyError(f"topology: {spec!r} is not {name}:N[:seed=S][:x=F]")
    try:
        nodes = int(args[0])
        opts = dict(a.split("=", 1) for a in args[1:])
        seed = int(opts.pop("seed", 1))
        factor = float(opts.pop("x", 1.0))
    except ValueError:
        raise TopologyError(f"topology: cannot parse {spec!r}; use {name}:N[:seed=S][:x=F]") from None
    if opts:
        raise TopologyError(f"topology: unknown option(s) {sorted(opts)} in {spec!r}")
    if not (factor > 0 and np.isfinite(factor)):
        raise TopologyError(f"topology: {spec!r}: x must be a finite positive number, got {factor}")
    topo = waxman(nodes, seed=seed) if name == "waxman" else crew_mesh(nodes, seed=seed)
    return topo if factor == 1.0 else topo.with_rates({k: v.rate_mbps * factor for k, v in topo.links.items()})
