"""When to give up on a round: derived from what the scheduler observes, never a guessed constant.

Two tests, both adaptive:
- **stall**: no data-plane byte arrived anywhere for `stall_s`. A slow link still delivers bytes,
  so a rate collapse (even 7x) never looks like a stall; a blackholed link, a frozen relay or a
  lost peer eventually stops every flow that depends on it. `stall_s` is a few times the longest
  single-segment time the view predicts on any link (a slow link legitimately goes quiet between
  segments), with a floor of a few heartbeats.
- **overrun**: the round took much longer than the larger of the simulator's prediction for the
  current plan on the scheduler's own view and the rounds already seen with this plan. Each abort
  of the same round doubles the factor, so a wrong estimate costs one retry, not a storm.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from core.plan import Plan
from sim import SimulationStalled, simulate

from .planners.onview import view_network
from .view import NetworkView

SEGMENT_BYTES = 64 * 1024
STALL_SEGMENTS = 8  # a link may be quiet for this many of its segment times
STALL_FLOOR_S = 1.0
SUSPECT_FLOOR_S = 10.0
OVERRUN_FACTOR = 4.0
OVERRUN_FLOOR_S = 5.0


def predict_on_view(plan: Plan, view: NetworkView) -> float | None:
    try:
        return simulate(plan, view_network(view), mode="auto").round_s
    except (SimulationStalled, ValueError, KeyError):
        return None


def stall_s(plan: Plan, view: NetworkView) -> float:
    """Longest quiet time allowed: STALL_SEGMENTS segment times on the slowest link the view knows."""
    slowest = min((view.rate(*ln) for ln in view.links()), default=100.0)
    seg = min(SEGMENT_BYTES, max(n for _, n in plan.layout) * 4)
    return max(STALL_FLOOR_S, STALL_SEGMENTS * seg * 8 / (max(slowest, 1e-3) * 1e6))


def suspect_s(quiet_s: float) -> float:
    """How long a link suspected dead stays out of plans: long enough for the retry to finish
    around it, short enough that a healed link is soon used again."""
    return max(SUSPECT_FLOOR_S, 10 * quiet_s)


def overrun_s(predicted_s: float | None, recent_s: Sequence[float], aborts: int) -> float:
    """Longest a round may take: a factor over what is expected, doubled per abort of this round."""
    expect = max([predicted_s or 0.0, statistics.median(recent_s) if recent_s else 0.0])
    return max(OVERRUN_FLOOR_S, OVERRUN_FACTOR * expect) * 2 ** aborts
