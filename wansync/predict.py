"""Predictions from the flow-level simulator for a configured WAN (no agents needed).

`wansync simulate` plans every scheme on an oracle view (the configured rates, as if perfectly
measured) and simulates it; `wansync run` attaches the blind prediction of each round's frozen
plan to the round's record, next to what was measured.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

from core.dispatch import DISPATCH, Dispatch
from core.plan import Job, Plan
from emulation.simnet import sim_network
from emulation.topology import Topology
from emulation.trace import Trace
from scheduler import planners
from scheduler.solver import niced_process
from scheduler.view import NetworkView
from sim import MEASURED, RoundPrediction, SimNetwork, SimulationOverBudget, SimulationStalled, WanCosts, simulate


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


PREDICT_BUDGET_S = 30.0  # CPU seconds a live round's prediction may take before it is given up


def _round_s(plan: Plan, net: SimNetwork, start_s: float, dispatch: Dispatch) -> float | None:
    """None where the trace leaves a needed link at rate 0 for good (a CSV trace may), or the
    simulation would take over PREDICT_BUDGET_S: no prediction is better than a crashed scheduler or
    a simulator that never catches up with the run."""
    try:
        return simulate(plan, net, start_s=max(0.0, start_s), dispatch=dispatch, costs=MEASURED,
                        cpu_budget_s=PREDICT_BUDGET_S).round_s  # the data plane's own costs, as live
    except (SimulationStalled, SimulationOverBudget):
        return None


class RoundPredictor:
    """Blind prediction for a live round: the frozen plan on the configured topology and trace.

    A round's simulation can take many CPU-seconds (classed trees under node caps reallocate rates
    at every chunk), so `submit` runs it in a niced process of its own and answers with a future:
    the scheduler's loop never waits for it, and the agents keep the CPU. Predictions queue one
    behind another; past MAX_QUEUED a round gets none (None at once, counted in `skipped`) rather
    than a prediction that lags the run further and further."""

    MAX_QUEUED = 2

    def __init__(self, topo: Topology, trace: Trace | None, *, dispatch: Dispatch = DISPATCH) -> None:
        """dispatch: the run's NetStorm knobs (wansync.runspec.dispatch_of), as its agents send by them."""
        self.net: SimNetwork = sim_network(topo, trace)
        self.dispatch = dispatch
        self._cache: dict[tuple[int, int, float], Future[float | None]] = {}
        self._pool: ProcessPoolExecutor | None = None
        self._queued: set[Future[float | None]] = set()
        self.skipped = 0

    def _key(self, plan: Plan, start_s: float) -> tuple[int, int, float]:
        static = not self.net.events
        # auxiliary tables change between versions (AUX_UPDATE): a version's prediction is per table
        aux = hash(tuple(tuple(sorted(g.aux.items())) for g in plan.groups))
        return plan.version, aux, 0.0 if static else round(start_s, 3)

    def round_s(self, plan: Plan, start_s: float = 0.0) -> float | None:
        """The prediction, computed here (blocking)."""
        key = self._key(plan, start_s)
        if key not in self._cache:
            fut: Future[float | None] = Future()
            fut.set_result(_round_s(plan, self.net, start_s, self.dispatch))
            self._cache[key] = fut
        return self._cache[key].result()

    def submit(self, plan: Plan, start_s: float = 0.0) -> Future[float | None]:
        """The prediction off this process: done at once when known (or skipped), else when the
        simulator's process has it."""
        key = self._key(plan, start_s)
        if key in self._cache:
            return self._cache[key]
        self._queued = {f for f in self._queued if not f.done()}
        if len(self._queued) >= self.MAX_QUEUED:
            self.skipped += 1
            skipped: Future[float | None] = Future()
            skipped.set_result(None)
            return skipped
        if self._pool is None:
            self._pool = niced_process()
        fut = self._pool.submit(_round_s, plan, self.net, start_s, self.dispatch)
        self._cache[key] = fut
        self._queued.add(fut)
        return fut

    def close(self) -> None:
        """Stop the simulator's process (predictions still under way are dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
