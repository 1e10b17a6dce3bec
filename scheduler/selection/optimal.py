"""The exact BSP receiver selection: the paper's MILP (12), solved lexicographically with HiGHS.

    x_ij in {0, 1} (i != j), t >= 0;  sum_j x_ij >= p_i;  x_ij = 1 on the forced pairs D
    egress   sum_i v_i x_ij <= b^E_j t                       for every receiver j     (11)
    ingress  L7: sum_j v_i x_ij <= b^I_i t;  L3: v_i x_ij <= s_i <= b^I_i t             (9, 10)
    stage 1: minimise t -> t*;  stage 2: maximise sum x_ij subject to t <= t* (1 + 1e-6)

NP-hard (Theorem 1: set partition), so only for small n; each stage has a time limit (the paper:
60 s, Gurobi). A stage that ends at its limit keeps its incumbent and says it is not proven: only
proven optima are fair yardsticks (the benchmark leaves the others out and counts them).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from .selmcast import instance

REL_GAP = 1e-6  # a stage is "proven" when HiGHS closes the gap to this
T_SLACK = 1e-6  # stage 2 keeps t within this of stage 1's optimum


@dataclass(frozen=True)
class Optimum:
    x: np.ndarray | None  # bool n x n, None if no feasible selection was found within the limit
    t: float  # stage 1's objective (the fluid completion), inf if none found
    proven: bool  # stage 1 solved to optimality (gap <= REL_GAP)
    proven_scale: bool  # stage 2 too
    gap: float  # stage 1's relative MIP gap when it stopped
    seconds: float  # both stages


def optimal_bsp(volume: np.ndarray, b_in: np.ndarray, b_out: np.ndarray, p: int | Sequence[int], *,
                mode: str = "l3", forced: np.ndarray | None = None, time_limit_s: float = 60.0) -> Optimum:
    n = len(volume)
    v, b_in, b_out, mins, d = instance(volume, b_in, b_out, p, mode, forced)
    start = time.perf_counter()
    # normalised units keep HiGHS's tolerances meaningful: volumes in the largest, rates in the mean
    vs, bs = float(v.max()) or 1.0, float(np.concatenate([b_in, b_out]).mean())
    vn, bin_n, bout_n = v / vs, b_in / bs, b_out / bs
    ii, jj = np.nonzero(~np.eye(n, dtype=bool))
    m = len(ii)  # x variables, then t, then (L3) s_i
    nt = m
    nvar = m + 1 + (n if mode == "l3" else 0)
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lo: list[np.ndarray] = []
    hi: list[np.ndarray] = []
    r0 = 0

    def block(r: np.ndarray, c: np.ndarray, val: np.ndarray, nrows: int, lb: float, ub: float) -> None:
        nonlocal r0
        rows.append(r + r0)
        cols.append(c)
        vals.append(val)
        lo.append(np.full(nrows, lb))
        hi.append(np.full(nrows, ub))
        r0 += nrows

    pair = np.arange(m)
    block(ii, pair, np.ones(m), n, 0.0, np.inf)  # sum_j x_ij >= p_i (lower bounds set below)
    lo[-1] = mins.astype(float)
    block(np.concatenate([jj, np.arange(n)]), np.concatenate([pair, np.full(n, nt)]),
          np.concatenate([vn[ii], -bout_n]), n, -np.inf, 0.0)  # egress (11)
    if mode == "l7":
        block(np.concatenate([ii, np.arange(n)]), np.concatenate([pair, np.full(n, nt)]),
              np.concatenate([vn[ii], -bin_n]), n, -np.inf, 0.0)  # ingress (10) with s_i = sum
    else:
        block(np.concatenate([pair, pair]), np.concatenate([pair, m + 1 + ii]),
              np.concatenate([vn[ii], -np.ones(m)]), m, -np.inf, 0.0)  # v_i x_ij <= s_i
        block(np.concatenate([np.arange(n), np.arange(n)]), np.concatenate([m + 1 + np.arange(n), np.full(n, nt)]),
              np.concatenate([np.ones(n), -bin_n]), n, -np.inf, 0.0)  # s_i <= b^I_i t
    A = coo_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r0, nvar)).tocsr()
    cons = LinearConstraint(A, np.concatenate(lo), np.concatenate(hi))
    lb = np.zeros(nvar)
    ub = np.full(nvar, np.inf)
    ub[:m] = 1.0
    lb[:m] = d[ii, jj].astype(float)  # forced pairs (5)
    integrality = np.zeros(nvar)
    integrality[:m] = 1
    c1 = np.zeros(nvar)
    c1[nt] = 1.0
    opts = {"time_limit": time_limit_s, "mip_rel_gap": REL_GAP, "disp": False}
    r1 = milp(c1, integrality=integrality, bounds=Bounds(lb, ub), constraints=cons, options=opts)
    if r1.x is None:
        return Optimum(None, float("inf"), False, False, float("inf"), time.perf_counter() - start)
    t_star = float(r1.x[nt])
    gap = float(getattr(r1, "mip_gap", 0.0) or 0.0)
    proven = r1.status == 0
    ub2 = ub.copy()
    ub2[nt] = t_star * (1 + T_SLACK)
    c2 = np.zeros(nvar)
    c2[:m] = -1.0
    left = max(1.0, time_limit_s - (time.perf_counter() - start))
    r2 = milp(c2, integrality=integrality, bounds=Bounds(lb, ub2), constraints=cons,
              options={**opts, "time_limit": left})
    sol = r2.x if r2.x is not None else r1.x
    x = np.zeros((n, n), dtype=bool)
    x[ii, jj] = sol[:m] > 0.5
    return Optimum(x, t_star * vs / bs, proven, proven and r2.status == 0, gap, time.perf_counter() - start)
