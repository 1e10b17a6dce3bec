"""Build the simulator's input from plain data, with the overlay's one min-hop router.

Every caller (the emulator's topology, the scheduler's view) hands over rates, delays, caps and trace
events and gets the same routes the relays and tc use, so nobody builds a SimNetwork by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from overlay.routing import Routes, adjacency

from .model import SimNetwork

Link = tuple[int, int]


def make_network(rates_mbps: Mapping[Link, float], delays_s: Mapping[Link, float] | None = None, *,
                 uplink_mbps: Mapping[int, float] | None = None, downlink_mbps: Mapping[int, float] | None = None,
                 events: Iterable[tuple[float, int, int, float]] = ()) -> SimNetwork:
    """A SimNetwork over the directed links of `rates_mbps` (in that order), routed by overlay.routing.

    delays_s: one-way delay per link (missing links: 0); events: (t, src, dst, rate_mbps) trace
    events, in any order (sorted here, as the engines expect).
    """
    links = list(rates_mbps)
    delays = delays_s or {}
    return SimNetwork(
        rates_mbps=dict(rates_mbps),
        delays_s={k: delays.get(k, 0.0) for k in links},
        route=Routes(adjacency(links)).route,
        uplink_mbps=dict(uplink_mbps or {}),
        downlink_mbps=dict(downlink_mbps or {}),
        events=tuple(sorted(events)),
    )
