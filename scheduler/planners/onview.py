"""A plan against the scheduler's view: the bytes it puts on each link, and the simulator's network
the view describes. Planners (auto), the prober and the deadline all read plans this way, so it
lives where planners may import it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping

from core.plan import Plan
from overlay.routing import NoRoute
from sim import SimNetwork, make_network

from ..view import NetworkView

# the least CPU a planner's simulation of one candidate plan is given, whatever is left of its budget
# (auto's candidates, packing's variants): one value for both, so the two searches budget alike
MIN_SIM_S = 0.05


def link_loads(plan: Plan, route: Callable[[int, int], tuple[int, ...]], *, aux: bool = True
               ) -> dict[tuple[int, int], float]:
    """Bytes a plan moves over each directed link per round: every tree edge's chunks along its route
    (auxiliary routes, unless aux=False, counted as if they carried the edge's whole share: an upper
    bound), and every multicast source's parameters to each receiver."""
    loads: dict[tuple[int, int], float] = {}

    def add(path: Iterable[int], nbytes: float) -> None:
        p = tuple(path)
        for hop in zip(p, p[1:], strict=False):
            loads[hop] = loads.get(hop, 0.0) + nbytes

    def along(a: int, b: int, nbytes: float) -> None:
        with contextlib.suppress(NoRoute):
            add(route(a, b), nbytes)

    for g in plan.groups:
        nbytes = 4.0 * sum(plan.layout[c][1] for c in g.chunks)
        for child, parent in g.parent.items():
            if parent is not None:
                along(child, parent, nbytes)
        for node, kids in g.children.items():
            for kid in kids:
                along(node, kid, nbytes)
        for routes in g.aux.values() if aux else ():
            for r in routes:
                add(r, nbytes)
    for src, receivers in (plan.multicast or {}).items():
        for r in receivers:
            along(src, r, 4.0 * plan.params)
    return loads


def port_loads(per_link: Mapping[tuple[int, int], float]) -> dict[tuple[int, str], float]:
    """Each node port's sum of what its links carry: a link a->b crosses a's uplink (a, "up") and b's
    downlink (b, "down"), where a big switch's declared cap binds all of them together."""
    out: dict[tuple[int, str], float] = {}
    for (a, b), x in per_link.items():
        out[(a, "up")] = out.get((a, "up"), 0.0) + x
        out[(b, "down")] = out.get((b, "down"), 0.0) + x
    return out


def view_network(view: NetworkView) -> SimNetwork:
    """The simulator's input from what the scheduler knows: link rates as measured (or nominal; where
    a declared port bound a link's samples, what it carried when none did: NetworkView.capacity), the
    node caps as the nodes declare them (a big switch's ports), no delays."""
    up = {n: c for (n, kind) in view.caps if kind == "up" and (c := view.cap(n, "up")) is not None}
    down = {n: c for (n, kind) in view.caps if kind == "down" and (c := view.cap(n, "down")) is not None}
    return make_network({ln: view.capacity(*ln) for ln in view.links()}, uplink_mbps=up, downlink_mbps=down)
