"""Predictions from the flow-level simulator for a configured WAN (no agents needed).

`wansync simulate` plans every scheme on an oracle view (the configured rates, as if perfectly
measured) and simulates it; `wansync run` attaches the blind prediction of each round's frozen
plan to the round's record, next to what was measured.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from core.dispatch import DISPATCH, Dispatch
from core.plan import Job, Plan
from emulation.simnet import sim_network
from emulation.topology import Topology
from emulation.trace import Trace
from scheduler import planners
from scheduler.view import NetworkView
from sim import MEASURED, RoundPrediction, SimNetwork, SimulationStalled, WanCosts, simulate


def oracle_view(topo: Topology) -> NetworkView:
    """A view that knows every configured rate: what the planners would see after perfect measurement."""
    view = NetworkView(topo.links)
    for (a, b), spec in topo.links.items():
        e = view.g.edges[a, b]
        e["rate"], e["measured"] = spec.rate_mbps, True
    for n, mbps in topo.uplink_mbps.items():  # node caps as the nodes declare them at registration
        view.set_cap(n, "up", mbps)
    for n, mbps in topo.downlink_mbps.items():
        view.set_cap(n, "down", mbps)
    return view


@dataclass
class SchemePrediction:
    scheme: str
    plan: Plan
    prediction: RoundPrediction
    plan_s: float
    simulate_s: float


def predict(topo: Topology, trace: Trace | None, schemes: Sequence[str], params: int, chunk_params: int,
            options: dict | None = None, costs: WanCosts = MEASURED,
            members: Sequence[int] | None = None) -> list[SchemePrediction]:
    """Every scheme planned on the oracle view and simulated; `costs` are this data plane's own
    (sim/costs.py) by default, `sim.NONE` for a network whose endpoints are not our agents (GPUs);
    `members` the nodes that contribute (default all: a NIC gateway, say, only relays)."""
    view = oracle_view(topo)
    net = sim_network(topo, trace)
    parts = tuple(range(topo.nodes)) if members is None else tuple(sorted(members))
    out = []
    for scheme in schemes:
        t = time.perf_counter()
        spec = planners.resolve(scheme)
        plan = spec.plan(view, Job(params, chunk_params, parts, {**(options or {}), **spec.options}))
        plan = plan.with_version(1).validate(topo.links)
        t1 = time.perf_counter()
        pred = simulate(plan, net, costs=costs)
        out.append(SchemePrediction(scheme, plan, pred, t1 - t, time.perf_counter() - t1))
    return out


class RoundPredictor:
    """Blind prediction for a live round: the frozen plan on the configured topology and trace."""

    def __init__(self, topo: Topology, trace: Trace | None, *, dispatch: Dispatch = DISPATCH) -> None:
        """dispatch: the run's NetStorm knobs (wansync.runspec.dispatch_of), as its agents send by them."""
        self.net: SimNetwork = sim_network(topo, trace)
        self.dispatch = dispatch
        self._cache: dict[tuple[int, int, float], float | None] = {}

    def round_s(self, plan: Plan, start_s: float = 0.0) -> float | None:
        """None where the trace leaves a needed link at rate 0 for good (a CSV trace may): no
        prediction is better than a crashed scheduler."""
        static = not self.net.events
        # auxiliary tables change between versions (AUX_UPDATE): a version's prediction is per table
        aux = hash(tuple(tuple(sorted(g.aux.items())) for g in plan.groups))
        key = (plan.version, aux, 0.0 if static else round(start_s, 3))
        if key not in self._cache:
            try:
                self._cache[key] = simulate(plan, self.net, start_s=max(0.0, start_s), dispatch=self.dispatch,
                                           costs=MEASURED).round_s  # the data plane's own costs, as live
            except SimulationStalled:
                self._cache[key] = None
        return self._cache[key]
