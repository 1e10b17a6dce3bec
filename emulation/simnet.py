"""Adapter from the emulated WAN (Topology + Trace) to the simulator's plain input.

sim/ knows nothing of emulation/, so this side translates: link rates, the mean delay the shaper
applies, node caps and the trace's events; sim.make_network adds the overlay's min-hop routes.
"""

from __future__ import annotations

from sim import SimNetwork, make_network

from .topotypes import Topology
from .tracetypes import Trace


def sim_network(topo: Topology, trace: Trace | None = None) -> SimNetwork:
    """The simulator's view of a configured WAN: link rates and delays, routes, caps, trace events."""
    links = sorted(topo.links)
    return make_network(
        {k: topo.links[k].rate_mbps for k in links},
        # the shaper adds uniform(0, jitter) to every delay: its mean is the blind expectation
        {k: topo.links[k].delay_s + topo.links[k].jitter_s / 2 for k in links},
        uplink_mbps=topo.uplink_mbps,
        downlink_mbps=topo.downlink_mbps,
        events=() if trace is None else ((e.t, e.src, e.dst, e.rate_mbps) for e in trace.events),
    )
