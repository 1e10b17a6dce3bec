"""What every emulated topology is: the `Topology` record (nodes, each direction's link, node caps) and
`TopologyError`. Its own module so that the generators (bigswitch, gpumesh, switch, waxman) build on
it without importing the registry that finds them (emulation/topology.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from overlay.routing import Routes, adjacency

from .link import LinkSpec

INTERNET2_DELAY_S = 0.030
PAPER_RATE_RANGE = (20, 155)  # Mbit/s, integer draws as in the authors' scripts


class TopologyError(ValueError):
    """A topology (file or arguments) that cannot be built; the message names the field."""


@dataclass(frozen=True)
class Topology:
    name: str
    nodes: int
    links: Mapping[tuple[int, int], LinkSpec]  # directed; every overlay link appears both ways
    uplink_mbps: Mapping[int, float] = field(default_factory=dict)
    downlink_mbps: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for (a, b) in self.links:
            if (b, a) not in self.links:
                raise TopologyError(f"links: {a}->{b} has no reverse direction {b}->{a}")
        adj = adjacency(self.links)
        if self.nodes > 1 and (len(adj) < self.nodes or self._components(adj) > 1):
            raise TopologyError(f"nodes: the {self.nodes} nodes are not all connected by links")

    @staticmethod
    def _components(adj: Mapping[int, set[int]]) -> int:
        seen: set[int] = set()
        count = 0
        for start in adj:
            if start in seen:
                continue
            count += 1
            stack = [start]
            while stack:
                u = stack.pop()
                if u not in seen:
                    seen.add(u)
                    stack.extend(adj[u] - seen)
        return count

    @property
    def full_mesh(self) -> bool:
        return len(self.links) == self.nodes * (self.nodes - 1)

    def neighbors(self, node: int) -> list[int]:
        return sorted(b for (a, b) in self.links if a == node)

    def undirected(self) -> list[tuple[int, int]]:
        return sorted((a, b) for (a, b) in self.links if a < b)

    def routes(self) -> Routes:
        return Routes(adjacency(self.links))

    def scaled(self, scale: float) -> Topology:
        """Delays shrink with --scale (rates do not), so a scaled run keeps the full-size shape."""
        links = {k: replace(v, delay_s=v.delay_s * scale, jitter_s=v.jitter_s * scale)
                 for k, v in self.links.items()}
        return replace(self, links=links)

    def with_rates(self, rates: Mapping[tuple[int, int], float]) -> Topology:
        links = {k: replace(v, rate_mbps=rates.get(k, v.rate_mbps)) for k, v in self.links.items()}
        return replace(self, links=links)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "nodes": self.nodes,
            "links": [{"src": a, "dst": b, "rate_mbps": s.rate_mbps, "delay_ms": s.delay_s * 1e3,
                       "jitter_ms": s.jitter_s * 1e3} for (a, b), s in sorted(self.links.items())],
            "caps": [{"node": n, "uplink_mbps": self.uplink_mbps.get(n),
                      "downlink_mbps": self.downlink_mbps.get(n)}
                     for n in sorted(set(self.uplink_mbps) | set(self.downlink_mbps))],
        }
