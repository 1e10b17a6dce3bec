"""A non-blocking switch with uneven host edges (seed 003's network, digest §1 and §4): a full mesh whose
links are never the bottleneck, every node capped up = down = b_i = round(20 u_i, 3) x unit Mbit/s,
u_i ~ U[lambda, 1] (the paper draws Gbit/s: unit 1000; a machine emulating 16 agents uses a few
Mbit/s). Contention happens only at the host edges; every link has the same one-way delay alpha.

    switch:N[:lam=0.05][:unit=1000][:seed=1][:delay_ms=1]
"""

from __future__ import annotations

import random

from .link import LinkSpec
from .topotypes import Topology, TopologyError

LAMBDA = 0.05  # the paper's default skew: b in [1, 20] units
DELAY_S = 0.001  # alpha, 1 ms


def edge_bandwidths(n: int, lam: float = LAMBDA, unit: float = 1000.0, seed: int = 1) -> dict[int, float]:
    """b_i = round(20 u, 3) x unit, u ~ U[lam, 1], seeded: the same draws at any unit."""
    if not 0 < lam <= 1:
        raise TopologyError(f"lam: must be in (0, 1], got {lam}")
    if not unit > 0:
        raise TopologyError(f"unit: must be > 0 Mbit/s, got {unit}")
    rng = random.Random(f"switch/{seed}")
    return {i: round(20 * rng.uniform(lam, 1.0), 3) * unit for i in range(n)}


def switch(n: int, lam: float = LAMBDA, unit: float = 1000.0, seed: int = 1, delay_s: float = DELAY_S) -> Topology:
    if n < 2:
        raise TopologyError(f"nodes: a switch needs at least 2 nodes, got {n}")
    bw = edge_bandwidths(n, lam, unit, seed)
    fabric = 20.0 * unit  # as fast as the fastest edge can be: links never bind
    links = {(a, b): LinkSpec(fabric, delay_s) for a in range(n) for b in range(n) if a != b}
    return Topology("switch", n, links, dict(bw), dict(bw))


def from_spec(spec: str) -> Topology:
    name, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    if name != "switch" or not parts:
        raise TopologyError(f"topology: {spec!r} is not switch:N[:lam=L][:unit=U][:seed=S][:delay_ms=D]")
    try:
        n = int(parts[0])
    except ValueError:
        raise TopologyError(f"topology: {spec!r}: N must be a whole number of nodes") from None
    kw: dict[str, float] = {}
    for opt in parts[1:]:
        key, eq, val = opt.partition("=")
        if not eq or key not in ("lam", "unit", "seed", "delay_ms"):
            raise TopologyError(f"topology: {spec!r}: unknown option {opt!r} (lam, unit, seed, delay_ms)")
        try:
            kw[key] = float(val)
        except ValueError:
            raise TopologyError(f"topology: {spec!r}: {key} must be a number, got {val!r}") from None
    return switch(n, kw.get("lam", LAMBDA), kw.get("unit", 1000.0), int(kw.get("seed", 1)),
                  kw.get("delay_ms", DELAY_S * 1e3) / 1e3)
