"""A simulation that must answer in time has a CPU budget: the exact engine gives up past it
(SimulationOverBudget), and `auto` skips a candidate whose simulation would overrun its decision's
budget instead of holding the decision up (found live: tree packing under node caps took tens of
CPU-seconds to simulate, and one decision took 109 s)."""

from __future__ import annotations

import time

import pytest

from core.plan import Job
from emulation.simnet import sim_network
from emulation.topology import from_dict
from scheduler import planners
from scheduler.planners import auto
from sim import MEASURED, SimulationOverBudget, simulate
from wansync.predict import oracle_view

N, PARAMS, CHUNK = 6, 200_000, 10_000


def capped():
    """Ring links at 400 Mbit/s, chords at 20, every node's ports at 100: classed trees under caps,
    the slowest kind of plan to simulate."""
    rates = [[0 if a == b else (400.0 if (b - a) % N in (1, N - 1) else 20.0) for b in range(N)] for a in range(N)]
    return from_dict({"nodes": N, "matrix": rates, "defaults": {"delay_ms": 0},
                      "caps": [{"node": k, "uplink_mbps": 100.0, "downlink_mbps": 100.0} for k in range(N)]})


def plan_of(scheme: str, topo):
    spec = planners.resolve(scheme)
    return spec.plan(oracle_view(topo), Job(PARAMS, CHUNK, tuple(range(N)), dict(spec.options)))


@pytest.mark.unit
def test_the_exact_engine_gives_up_past_its_cpu_budget():
    topo = capped()
    plan, net = plan_of("packing", topo), sim_network(topo, None)
    t = time.thread_time()
    full = simulate(plan, net, costs=MEASURED).round_s
    took = time.thread_time() - t
    assert full > 0
    with pytest.raises(SimulationOverBudget):
        simulate(plan, net, costs=MEASURED, cpu_budget_s=0.0)
    # a budget it fits in changes nothing
    assert simulate(plan, net, costs=MEASURED, cpu_budget_s=10 * took + 1.0).round_s == full


@pytest.mark.unit
def test_auto_skips_a_candidate_whose_simulation_overruns_and_keeps_the_scheme_in_force():
    topo = capped()
    view = oracle_view(topo)
    specs = [planners.resolve("star"), planners.resolve("packing")]
    job = Job(PARAMS, CHUNK, tuple(range(N)), {"variants": 1})  # packing's own search would spend the budget
    cands, plans = auto.evaluate(view, job, specs, {}, budget_s=0.5, prune=False)
    by = {c.scheme: c for c in cands}
    assert by["star"].round_s is not None  # simulated first (one tree), within the budget
    assert "no prediction in time" in by["packing"].skipped and "packing" not in plans
    # the scheme in force whose simulation overruns stays runnable (kept when nothing else is predicted)
    cands, plans = auto.evaluate(view, job, [planners.resolve("packing")], {}, budget_s=0.0, in_force="packing")
    assert "no prediction in time" in cands[0].skipped and "packing" in plans
