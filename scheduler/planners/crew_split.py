"""CREW's arithmetic, pure (seed 004): how big each aggregator's block is, which chunks it holds, and who
takes a block over when its aggregator fails.

LP (2), for a group P of initiators and a set A of aggregators (every active worker), with b_ij the
bandwidth i -> j (0: down; b_jj never a bottleneck):

    minimise  T_s + T_m   s.t.  x_j <= a_j T_s,  x_j <= c_j T_m,  sum_j x_j = 1,  x >= 0
    a_j = min_{i in P, i != j} b_ij   (aggregator j's slowest inbound scatter link)
    c_j = min_{i in P, i != j} b_ji   (its slowest outbound multicast link)

Closed form (N-A, "network-aware"): with T_s = alpha T and T_m = (1 - alpha) T the best T for a given
alpha is 1 / f(alpha), f(alpha) = sum_j min(a_j alpha, c_j (1 - alpha)); f is concave and piecewise
linear, so its maximum lies on a breakpoint c_j / (a_j + c_j); x_j = min(a_j alpha*, c_j (1 - alpha*)) /
f(alpha*). An aggregator with a dead link to any member has a_j = 0 or c_j = 0 and gets nothing.
E-D ("even division"): x_j = 1 / |A'| over the aggregators A' with live links both ways to P.

Algorithm 1 cuts k chunks into contiguous blocks by the cumulative bounds U_i = floor(k sum_{m<=i} x_m)
(U_n = k); Algorithm 2 re-arranges a current assignment to new weights, moving the fewest chunks and
out of each block its largest indexes (senders send a block in increasing order: those are the least
likely sent). Eq. (3) picks the replacement for a failed aggregator's block: among the workers with
live links both ways to every other member of P, the least (load + block) / bottleneck bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Bandwidth = Callable[[int, int], float]  # b(i, j): bytes/s (any unit) from i to j; 0 = down


@dataclass(frozen=True)
class Split:
    """Block sizes (fractions of the model) per aggregator, and LP (2)'s times in model / bandwidth
    units (seconds for a model of 1 byte at bytes/s: multiply by the model's bytes)."""

    aggregators: tuple[int, ...]
    x: tuple[float, ...]
    t_scatter: float
    t_multicast: float

    @property
    def t(self) -> float:
        """T = T_s + T_m, LP (2)'s objective; the real time lies in [T / 2, T] (chunks pipeline)."""
        return self.t_scatter + self.t_multicast

    def weights(self) -> dict[int, float]:
        return dict(zip(self.aggregators, self.x, strict=True))


def bottlenecks(members: Sequence[int], aggregators: Sequence[int], b: Bandwidth) -> tuple[np.ndarray, np.ndarray]:
    """(a, c) per aggregator: its slowest inbound link from, and outbound link to, the other members."""
    if len(set(members)) < 2:
        raise ValueError(f"members: a partial reduce needs at least 2 members, got {list(members)}")
    a = np.array([min(b(i, j) for i in members if i != j) for j in aggregators], dtype=float)
    c = np.array([min(b(j, i) for i in members if i != j) for j in aggregators], dtype=float)
    if (a < 0).any() or (c < 0).any() or not (np.isfinite(a).all() and np.isfinite(c).all()):
        raise ValueError("bandwidths must be finite and >= 0")
    return a, c


def times(x: np.ndarray, a: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    """(T_s, T_m) of a split: max_j x_j / a_j and max_j x_j / c_j over the blocks that are not empty."""
    used = x > 0
    if ((a[used] <= 0) | (c[used] <= 0)).any():
        return math.inf, math.inf
    return float((x[used] / a[used]).max(initial=0.0)), float((x[used] / c[used]).max(initial=0.0))


def solve_na(a: Sequence[float], c: Sequence[float]) -> tuple[np.ndarray, float, float]:
    """LP (2) in closed form: (x, T_s, T_m). O(n log n) over the breakpoints; ValueError if no
    aggregator has live links both ways."""
    a, c = np.asarray(a, dtype=float), np.asarray(c, dtype=float)
    ok = (a > 0) & (c > 0)
    if not ok.any():
        raise ValueError("no aggregator has live links to and from every member")
    aa, cc = a[ok], c[ok]
    alpha = cc / (aa + cc)  # breakpoint of each term: a alpha = c (1 - alpha)
    order = np.argsort(alpha, kind="stable")
    al, a_s, c_s = alpha[order], aa[order], cc[order]
    # at breakpoint alpha_(m), terms up to m are on their c side, the rest on their a side
    c_cum = np.cumsum(c_s)
    a_tail = np.concatenate([np.cumsum(a_s[::-1])[::-1][1:], [0.0]])
    f = (1 - al) * c_cum + al * a_tail
    best = int(np.argmax(f))
    alpha_star, f_star = float(al[best]), float(f[best])
    x = np.zeros(len(a))
    x[ok] = np.minimum(aa * alpha_star, cc * (1 - alpha_star)) / f_star
    x /= x.sum()  # exact up to rounding; keeps sum x == 1 to the last bit it can
    t = 1.0 / f_star
    return x, alpha_star * t, (1 - alpha_star) * t


def solve_ed(a: Sequence[float], c: Sequence[float]) -> tuple[np.ndarray, float, float]:
    """Even division over the aggregators with live links both ways: (x, T_s, T_m)."""
    a, c = np.asarray(a, dtype=float), np.asarray(c, dtype=float)
    ok = (a > 0) & (c > 0)
    if not ok.any():
        raise ValueError("no aggregator has live links to and from every member")
    x = np.where(ok, 1.0 / ok.sum(), 0.0)
    ts, tm = times(x, a, c)
    return x, ts, tm


def split(members: Sequence[int], aggregators: Sequence[int], b: Bandwidth, mode: str = "na") -> Split:
    """Block sizes over `aggregators` for the group `members`: mode "na" (LP (2)) or "ed" (even)."""
    if mode not in ("na", "ed"):
        raise ValueError(f"split: mode must be 'na' (network-aware, LP (2)) or 'ed' (even division), got {mode!r}")
    aggs = tuple(aggregators)
    if len(set(aggs)) != len(aggs) or not aggs:
        raise ValueError(f"aggregators must be non-empty and unique, got {list(aggs)}")
    a, c = bottlenecks(members, aggs, b)
    x, ts, tm = (solve_na if mode == "na" else solve_ed)(a, c)
    return Split(aggs, tuple(float(v) for v in x), ts, tm)


# --- chunks ------------------------------------------------------------------------------------------
def bounds(x: Sequence[float], k: int) -> list[int]:
    """Integer cumulative bounds U_0 = 0 <= U_1 <= ... <= U_n = k (Algorithm 1, integer-safe)."""
    if k < 1:
        raise ValueError(f"k must be >= 1 chunk, got {k}")
    out, y = [0], 0.0
    for v in x:
        if v < 0 or not math.isfinite(v):
            raise ValueError(f"weights must be finite and >= 0, got {list(x)}")
        y += v
        out.append(min(k, max(out[-1], math.floor(k * y + 1e-9))))
    if abs(y - 1.0) > 1e-6:
        raise ValueError(f"weights must sum to 1, got {y}")
    out[-1] = k
    return out


def assign(x: Sequence[float], k: int) -> list[list[int]]:
    """Algorithm 1: block i holds chunks U_{i-1} .. U_i - 1 (contiguous; empty when x_i k < 1)."""
    u = bounds(x, k)
    return [list(range(u[i], u[i + 1])) for i in range(len(x))]


def rearrange(x: Sequence[float], current: Sequence[Sequence[int]]) -> list[list[int]]:
    """Algorithm 2: blocks for the new weights x from the current ones, moving the fewest chunks; a
    block with a surplus gives up its largest indexes, a block short of chunks takes the smallest
    of those given up. Every chunk moves at most once."""
    if len(x) != len(current):
        raise ValueError(f"{len(x)} weights for {len(current)} blocks")
    k = sum(len(c) for c in current)
    every = sorted(i for c in current for i in c)
    if every != list(range(k)):
        raise ValueError("current blocks must hold every chunk 0..k-1 exactly once")
    u = bounds(x, k)
    blocks = [sorted(c) for c in current]
    d = [len(blocks[i]) - (u[i + 1] - u[i]) for i in range(len(x))]
    loose: list[int] = []
    for i, di in enumerate(d):
        if di > 0:
            loose += blocks[i][-di:]
            blocks[i] = blocks[i][:-di]
    loose.sort()
    for i, di in enumerate(d):
        if di < 0:
            blocks[i] = sorted(blocks[i] + loose[:-di])
            loose = loose[-di:]
    assert not loose
    return blocks


def ranges(chunks: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted chunk indexes as half-open ranges [lo, hi) (a block's compact form)."""
    out: list[tuple[int, int]] = []
    for c in sorted(chunks):
        if out and out[-1][1] == c:
            out[-1] = (out[-1][0], c + 1)
        else:
            out.append((c, c + 1))
    return out


# --- failover -----------------------------------------------------------------------------------------
def replacement(members: Sequence[int], failed: int, block: float, candidates: Iterable[int], b: Bandwidth,
                load: Mapping[int, float]) -> int | None:
    """Eq. (3): who takes over the block (a fraction of the model) of the failed aggregator `failed`.
    Candidates other than it with live links both ways to every other member of P; the one with the
    least max over those members of (its load + the block) / min(b_qk, b_kq). None: nobody can (the
    task must be abandoned)."""
    best: tuple[float, int] | None = None
    for k in sorted(set(candidates) - {failed}):
        others = [q for q in members if q != k]
        if not others:
            continue
        bw = [min(b(q, k), b(k, q)) for q in others]
        if min(bw) <= 0:
            continue
        cost = max((load.get(k, 0.0) + block) / w for w in bw)
        if best is None or cost < best[0]:
            best = (cost, k)
    return None if best is None else best[1]
