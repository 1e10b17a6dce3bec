"""Max-min fair rates by progressive filling: the one rate rule under the simulator's engines, the
paper's big switch (sim/switch.py) and the scheduler's split of node caps between classed flows
(core/capshare.py). Pure numpy, so both sides share it."""

from __future__ import annotations

import numpy as np


def max_min_rates(pair_flow: np.ndarray, pair_res: np.ndarray, capacity: np.ndarray, nflows: int,
                  weights: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rates by progressive filling: every unfrozen flow grows by the same step until a
    resource saturates, whose flows then freeze. (pair_flow[i], pair_res[i]) says flow uses resource.
    Frozen pairs are dropped as it goes, so big instances get cheaper with every level.
    weights: weighted max-min instead (flow f grows by weights[f] per step; all > 0)."""
    rate = np.zeros(nflows)
    left = np.asarray(capacity, dtype=float).copy()
    nres = len(left)
    level = 0.0
    pf, pr = np.asarray(pair_flow), np.asarray(pair_res)
    w = None if weights is None else np.asarray(weights, dtype=float)
    while len(pf):
        count = np.bincount(pr, minlength=nres) if w is None else np.bincount(pr, weights=w[pf], minlength=nres)
        used = np.flatnonzero(count)
        share = np.maximum(left[used], 0.0) / count[used]
        step = float(share.min())
        level += step
        left[used] -= step * count[used]
        full = np.zeros(nres, dtype=bool)
        full[used[share <= step * (1 + 1e-12) + 1e-15]] = True
        done = np.zeros(nflows, dtype=bool)
        done[pf[full[pr]]] = True
        rate[done] = level if w is None else level * w[done]
        live = ~done[pf]
        pf, pr = pf[live], pr[live]
    return rate
