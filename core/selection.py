"""Selective reduce's pure selection functions (seed 003, digest §2.1-2.4): BAG, bpaWR, the readiness
probability on an empirical runtime CDF, and the ring cost model (Eq. 2).

Pure and deterministic: the live controller (scheduler/progress/selective.py) and the simulator's job
mode (sim/job.py) call the very same functions through core.selective.Controller. They live in core/
because both sides run them and core/ is the one package both may import.

Worker ids are ints >= 0; bpaWR's virtual workers (predicted arrivals) are negative ints, so one
bandwidth map holds both. Bandwidths and the model size share a unit (Mbit/s and Mbit), so 2v/b is
seconds. The digest's resolutions are kept: BAG's `< p` (A1) and its reset of b* for a new group
(A2), a three-valued bpaWR outcome (A3), floor for the expected arrivals (A11), the probability-
weighted mean bandwidth of the predicted workers (A10), a strict `b > b_hat` filter (A12).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

LAUNCH, WAIT_TOO_FEW, WAIT_REPLACE = "launch", "wait_too_few", "wait_replace"
PROB_MODELS = ("paper", "hazard")


def _order(w: int, bw: Mapping[int, float]) -> tuple[float, int, int]:
    """Non-increasing bandwidth; ties: real workers first (a virtual one at the same bandwidth cannot
    raise a bottleneck), then by id (deterministic)."""
    return (-bw[w], 1 if w < 0 else 0, abs(w))


def bag(workers: Iterable[int], p: int, eta: float, bw: Mapping[int, float]) -> list[list[int]]:
    """Bandwidth-Aware Grouping (Alg. 1): the workers sorted by bandwidth, cut into groups of at least p
    that keep taking workers whose bandwidth is >= (1 - eta) x the group's p-th one. Groups come in
    descending bandwidth order; the last one may hold fewer than p. eta = 0: groups of exactly p (ties
    at the p-th bandwidth still join); eta = 1: one group of all."""
    if p < 1:
        raise ValueError(f"p: a group needs at least 1 worker, got {p}")
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta: must be in [0, 1], got {eta}")
    groups: list[list[int]] = []
    g: list[int] = []
    b_star = 0.0
    for w in sorted(workers, key=lambda w: _order(w, bw)):
        if len(g) < p:  # the paper prints "<= p" (A1)
            g.append(w)
            b_star = bw[w] * (1.0 - eta)  # after p appends: (1 - eta) x the p-th bandwidth
        elif bw[w] >= b_star:
            g.append(w)  # inside the eta band; b* stays
        else:
            groups.append(g)
            g = [w]
            b_star = bw[w] * (1.0 - eta)  # reset (A2; matters only for p = 1)
    if g:
        groups.append(g)
    return groups


class Ecdf:
    """An empirical CDF of computation times, F(t) = P(X <= t): sorted samples and bisect."""

    def __init__(self, samples: Iterable[float] = ()) -> None:
        self.xs: list[float] = sorted(float(x) for x in samples)

    def add(self, x: float) -> None:
        bisect.insort(self.xs, float(x))

    def __len__(self) -> int:
        return len(self.xs)

    def __call__(self, t: float) -> float:
        return bisect.bisect_right(self.xs, t) / len(self.xs) if self.xs else 0.0


def ready_prob(F: Ecdf, t: float, dt: float, model: str = "paper") -> float:
    """The probability that a worker t seconds into its round is ready within dt (Eq. 4). "paper":
    F(t + dt), the paper's form (it sets P(X > t) = 1, so it over-predicts); "hazard": the true
    conditional (F(t + dt) - F(t)) / (1 - F(t)), 0 past the CDF's support."""
    if model == "paper":
        return F(t + dt)
    if model == "hazard":
        f_t = F(t)
        return 0.0 if f_t >= 1.0 else (F(t + dt) - f_t) / (1.0 - f_t)
    raise ValueError(f"prob_model: {model!r} is not one of {', '.join(PROB_MODELS)}")


def t_sync(m: int, min_bw: float, v: float, alpha: float = 0.0) -> float:
    """Eq. 2, exact ring form: 2(m - 1) alpha + 2 (m - 1)/m v / min b (seconds; v and b in one unit).
    A group of one synchronizes with nobody: 0."""
    if m <= 1:
        return 0.0
    return 2 * (m - 1) * alpha + 2 * (m - 1) / m * v / min_bw


@dataclass(frozen=True)
class Training:
    """A worker in training computation, as bpaWR sees it: its bandwidth and time into its round."""

    worker: int
    bw: float
    elapsed: float


@dataclass
class Decision:
    outcome: str  # LAUNCH, WAIT_TOO_FEW, WAIT_REPLACE
    g_delta: list[int]  # real workers the predicted arrivals push out of the group (WAIT_REPLACE)
    predicted: list[tuple[int, float, float]]  # (worker, bandwidth, q) claimed by this group
    k_exp: int = 0
    saved_s: float = 0.0  # t_X: the bottleneck time replacement would save


def predict_workers(S: Sequence[Training], dt: float, b_hat: float, F: Ecdf, model: str = "paper"
                    ) -> list[tuple[int, float, float]]:
    """PREDICT_WORKERS: the training workers faster than the bottleneck (strictly, A12) with their
    probability of being ready within dt."""
    return [(s.worker, s.bw, ready_prob(F, s.elapsed, dt, model)) for s in S if s.bw > b_hat]


def bpawr(S: Sequence[Training], g: Sequence[int], p: int, eta: float, dt: float, v: float,
          bw: Mapping[int, float], theta: float, F: Ecdf, model: str = "paper"
          ) -> tuple[Decision, list[Training]]:
    """Bandwidth- and Progress-Aware Waiting and Replacement (Alg. 2). Returns the decision and what
    is left of S (a predicted worker is claimed by one group only). Waits only when the predicted
    arrivals would push slow members out and save more than theta x dt of sync time."""
    if len(g) < p:
        return Decision(WAIT_TOO_FEW, [], []), list(S)
    b_hat = min(bw[w] for w in g)
    C = predict_workers(S, dt, b_hat, F, model)
    claimed = {w for w, _, _ in C}
    rest = [s for s in S if s.worker not in claimed]
    q_sum = sum(q for _, _, q in C)
    k_exp = math.floor(q_sum + 1e-12)  # floor (A11); the epsilon forgives a sum of exact 1s rounding down
    if k_exp < 1:
        return Decision(LAUNCH, [], C, 0, 0.0), rest
    b_bar = sum(q * b for _, b, q in C) / q_sum  # probability-weighted mean (A10); q_sum >= 1 here
    virtual = {-(j + 1): b_bar for j in range(k_exp)}
    both: dict[Hashable, float] = {**{w: bw[w] for w in g}, **virtual}
    g_star = bag([*g, *virtual], p, eta, both)[0]  # type: ignore[arg-type]
    g_delta = [w for w in g if w not in set(g_star)]
    saved = 2 * v / b_hat - 2 * v / min(both[w] for w in g_star)
    if saved > theta * dt:
        return Decision(WAIT_REPLACE, g_delta, C, k_exp, saved), rest
    return Decision(LAUNCH, [], C, k_exp, saved), rest
