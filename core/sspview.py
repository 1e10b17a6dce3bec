"""What an SSP multicast manager knows on a READY and what it answers (SelMcast, seed 000): the view a
receiver chooser gets, its decision, the chooser's interface, and tau (how long the SSP bound would block a
sender anyway). The live model (scheduler/progress/mcast.py, on the scheduler's estimates), the
choosers (scheduler/selection/choosers.py) and the simulator's SSP driver (sim/mcastjob.py, on exact
state) all speak it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class SspView:
    """What the manager knows when worker `kappa` becomes ready (time `now`)."""

    now: float
    kappa: int
    active: np.ndarray  # bool (n,): senders with a multicast in flight (kappa's new one not yet)
    x: np.ndarray  # bool (n, n): their current receivers (done ones included)
    V: np.ndarray  # float (n, n): bytes each (task, receiver) still has to get
    volume: np.ndarray  # (n,): v_i
    b_in: np.ndarray  # (n,): uplink capacities now
    b_out: np.ndarray  # (n,): downlink capacities now
    tau: np.ndarray  # (n,): seconds each sender would be blocked by the bound anyway


@dataclass(frozen=True)
class SspDecision:
    receivers: Sequence[int]  # kappa's multicast
    drops: Sequence[tuple[int, int]] = ()  # (sender, receiver) leaving running multicasts
    levels: dict[int, tuple[float, ...]] = field(default_factory=dict)  # sender -> priority level (lower first)


class Chooser(Protocol):
    sharing: str  # how the switch shares ports for this scheme: "maxmin" or "priority"

    def ready(self, view: SspView) -> SspDecision: ...

    def delivered(self, sender: int, receivers: Iterable[int]) -> None: ...


def blocked_for(k: int, staleness: int, done: np.ndarray, finish: np.ndarray, per_iter: np.ndarray) -> float:
    """tau: how long a worker whose multicast of iteration k ended now would wait for the SSP bound —
    until every worker u has done iteration k - s. done[u]: u's last done iteration; finish[u]: the
    estimated seconds until u's next iteration (done[u] + 1) is done; per_iter[u]: seconds per further
    iteration (compute plus a multicast). 0 when nobody is that far behind."""
    m = k - staleness
    behind = np.flatnonzero(done < m)
    if not len(behind):
        return 0.0
    return float(max(finish[u] + (m - done[u] - 1) * per_iter[u] for u in behind))
