"""Small hand-made topologies the tests share."""

from __future__ import annotations

import dataclasses

from emulation.link import LinkSpec
from emulation.topology import Topology, uniform


def line(n: int, rate: float = 1000.0, delay: float = 0.0) -> Topology:
    """0 - 1 - ... - n-1, every link `rate` Mbit/s and `delay` s both ways."""
    links = {}
    for a in range(n - 1):
        links[(a, a + 1)] = links[(a + 1, a)] = LinkSpec(rate, delay)
    return Topology("line", n, links)


def shaped_line(n: int, rates: dict[tuple[int, int], float]) -> Topology:
    """A line of 1000 Mbit/s links but for the directed links in `rates`."""
    topo = line(n, rate=1000.0)
    links = dict(topo.links)
    for (a, b), mbps in rates.items():
        links[(a, b)] = dataclasses.replace(links[(a, b)], rate_mbps=mbps)
    return dataclasses.replace(topo, links=links)


def big_switch(downlink_mbps: float = 40.0) -> Topology:
    """Three nodes, links too fast to matter, node 2's downlink the one bottleneck."""
    return dataclasses.replace(uniform(3, rate_mbps=1000.0, delay_s=0.0), downlink_mbps={2: downlink_mbps})
