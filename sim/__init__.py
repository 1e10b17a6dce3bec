"""Flow-level simulator: replays plans on plain network data and predicts their times, blind.

Its own package so that the scheduler (deadlines, on its view), the emulator (on a configured
topology) and the CLI can all use it; it knows only core/ (the Plan types and the policies the scheduler
runs live: core.capshare's split of node caps, core.selective, core.sspview) and the one min-hop router.
model.py says what is simulated, sharing.py how traffic classes share links, exact.py and fluid.py
are the two engines, network.py builds the input from plain data, job.py drives jobs.

- `simulate(plan)`: one round of one plan. mode="auto" runs the exact engine whenever its estimated
  cost is small, and always for plans with auxiliary routes or traffic classes (fluid refuses them);
  RoundPrediction.mode says which engine ran.
- `simulate_tasks([TaskRun, ...])`: concurrent tasks (arrivals, ready times, multicast, partial
  reduces, traffic classes, the scheduler's rates at node caps) in the exact engine; per task its
  end and receivers' done times.
- `simulate_job(policy, plan_for, ...)` (policies in job.py): BSP, SSP, a ready queue or selective reduce's
  controller (core/selective.py, with the pure BAG/bpaWR of core/selection.py, the one the scheduler runs
  live) forming tasks over a budget; `engine="ring"` replays ring groups with the paper's closed form (ringcost.py);
  `engine="stepped"` (stepped.py) replays one-hop plans as flows in steps, for CREW's n = 60; outage.py adds
  link failures with the caller's repair, nonblocking.py CREW's non-blocking scatter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from core.dispatch import DISPATCH, Dispatch
from core.plan import Plan

from .costs import MEASURED, NONE, WanCosts
from .exact import Exact, exact_cost_s
from .fluid import run_fluid
from .job import JobPrediction, simulate_job
from .model import (
    FLOAT32,
    MBIT,
    Model,
    RoundPrediction,
    SimNetwork,
    SimulationOverBudget,
    SimulationStalled,
    TaskPrediction,
    TaskRun,
    TasksPrediction,
)
from .network import make_network

__all__ = ["EXACT_BUDGET_S", "FLOAT32", "MBIT", "MEASURED", "NONE", "JobPrediction", "Mode", "RoundPrediction",
           "SimNetwork", "SimulationOverBudget", "SimulationStalled", "TaskPrediction", "TaskRun", "TasksPrediction",
           "WanCosts", "make_network", "simulate", "simulate_job", "simulate_tasks"]

EXACT_BUDGET_S = 2.0  # auto mode: the exact engine's estimated run time it may spend

Mode = Literal["auto", "exact", "fluid"]


def simulate(plan: Plan, net: SimNetwork, *, start_s: float = 0.0, segment_bytes: int = 65536,
             mode: Mode = "auto", dispatch: Dispatch = DISPATCH, costs: WanCosts = NONE,
             cap_rates: bool = True, cpu_budget_s: float | None = None) -> RoundPrediction:
    """Predict one synchronization round of `plan` on `net`, starting at `start_s` on the trace's clock.

    mode: `exact` (event driven), `fluid` (static shares, for 1,000-node scale), or `auto`, which
    runs `exact` unless its estimated cost exceeds EXACT_BUDGET_S, and always for plans with
    auxiliary routes or traffic classes (fluid cannot model them and refuses them).
    dispatch: NetStorm's PRIMARY_BUSY_BOUND and AUXILIARY_QUEUE_LENGTH (core.dispatch), as the agents
    run them; they only matter for auxiliary routes.
    costs: what live rounds pay outside link transfer (sim/costs.py; MEASURED for this data plane,
    NONE for links alone).
    cap_rates: classed trees crossing a node cap get the scheduler's per-flow rates (exact.py), as live.
    cpu_budget_s: the exact engine raises SimulationOverBudget past that much CPU (a caller that must
    answer in time: auto's decision, a live round's prediction).
    """
    m = Model([TaskRun(0, plan, start_s)], net, start_s, segment_bytes, costs)
    if mode == "auto":
        mode = "exact" if m.has_aux or m.classed or any(m.direct) or exact_cost_s(m) <= EXACT_BUDGET_S else "fluid"
    if mode == "exact":
        pred = Exact(m, dispatch, cap_rates=cap_rates, cpu_budget_s=cpu_budget_s).run()
        task = pred.tasks[0]
        return RoundPrediction(max(task.node_done_s.values()) - start_s, task.node_done_s, pred.link_bytes,
                               pred.link_busy_s, "exact", pred.aux_bytes)
    if mode == "fluid":
        return run_fluid(m)
    raise ValueError(f"mode must be auto, exact or fluid, got {mode!r}")


def simulate_tasks(tasks: Sequence[TaskRun], net: SimNetwork, *, segment_bytes: int = 65536,
                   dispatch: Dispatch = DISPATCH, costs: WanCosts = NONE, cap_rates: bool = True) -> TasksPrediction:
    """Replay concurrent tasks on one network with the exact engine: they share links and node caps at
    once, each from its own start (and its members' ready times), with traffic classes (model.py,
    sharing.py) and, unless cap_rates=False, the scheduler's per-flow rates at node caps (exact.py)."""
    if not tasks:
        raise ValueError("no tasks to simulate")
    m = Model(tasks, net, segment=segment_bytes, costs=costs)
    return Exact(m, dispatch, cap_rates=cap_rates).run()
