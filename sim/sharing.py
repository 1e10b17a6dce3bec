"""How busy flow keys share resources when traffic classes differ: the data plane's link scheduler at
flow level.

A directed link is written by one sender, which picks the next segment from the class with the highest
priority that has bytes ready, then the earliest absolute deadline, then by weighted fair queuing in
bytes; inside a class its flow keys take turns. At flow level, per link: priority levels (priority,
then deadline) are filled in order, each level weighted max-min on the capacity the levels above
left; a key's weight is its class's weight over the number of busy keys of its class on its first
link (the sender's own round-robin among them). A tree edge's `rates` cap its keys (the sender paces).
Start-time fair queuing, not its fluid limit, decides who goes first when a class wakes up: an idle
class starts at the link's virtual time, so its first segment is sent next whatever its weight. A
transfer of one segment at most that finds its class idle on its first link (the exact engine's
`fresh`) is therefore served first within its level; the next one of the same class waits its
weighted turn. Plans of many thin trees (packing on a dense mesh: ~90 classes of 1-3 chunks) live on
this: modelled as plain weighted max-min, aws10's packing was predicted 10-26 % slower than it ran.

Node uplink/downlink caps: the data plane orders nothing there, every flow crossing one is equal
(the caps' token buckets serve whoever writes). Modelled by alternating: links by class (as above)
under per-key caps, then the node caps plain max-min with those link rates as demands; a key the
node caps hold back gets that as its cap and the links are solved again, until nothing changes (a
few rounds; it then keeps the last feasible answer). So priority and weights hold where the classes
meet on a link; where they only meet at a node cap (senders writing to one receiver) they would
share equally, but live the scheduler gives classed flows there per-flow rates at each classed
task's start and end (core.capshare), and the exact engine does the same (exact.py): they reach
this function as per-key caps (`key_cap`; 0 = held), so priority and weights hold at caps per task.

With a single class among the keys this is the plain max-min over every resource (what the simulator
always did), with the rate caps as one more resource per key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from core.maxmin import max_min_rates

if TYPE_CHECKING:
    from .model import Model

NODE_ROUNDS = 8  # alternations between the links' classes and the node caps


def class_rates(m: Model, keys: Sequence[int], cap: Sequence[float],
                key_cap: Sequence[float] | None = None, fresh: Sequence[bool] | None = None) -> np.ndarray:
    """Rates (bytes/s) of the busy `keys`, which share resources with each other (cap: per resource;
    key_cap: per key, default the plan's m.key_cap; the exact engine passes its own with the
    scheduler's cap rates in it). fresh: per key, its head transfer arrived while its class was idle
    on its first link: within its level it goes first (start-time fair queuing, module docstring)."""
    n = len(keys)
    ks = np.asarray(keys, dtype=np.int64)
    pf, pr = m.pairs(ks)
    capacity = np.asarray(cap, dtype=float)
    pf, pr = without_loose_caps(pf, pr, capacity, m.nlinks, n)
    kc = m.key_cap if key_cap is None else key_cap
    kcap = np.fromiter((kc[k] for k in keys), dtype=float, count=n)
    a = m.arrays()
    cls = a.key_class[ks]
    if n == 0 or (cls == cls[0]).all():
        return _capped(pf, pr, capacity, n, kcap)
    _, inv, count = np.unique(cls * len(capacity) + a.first_res[ks], return_inverse=True, return_counts=True)
    weight = a.class_weight[cls] / count[inv]
    level = a.class_level[cls]
    if fresh is not None:  # a sub-level first within each level: the transfers that arrived fresh
        level = 2 * level + 1 - np.fromiter((fresh[k] for k in keys), dtype=np.int64, count=n)
    link = pr < m.nlinks
    if link.all():
        return _leveled(pf, pr, capacity, n, kcap, level, weight)
    lf, lr, nf, nr = pf[link], pr[link], pf[~link], pr[~link]
    node_cap = np.full(n, np.inf)
    y = np.zeros(n)
    for _ in range(NODE_ROUNDS):
        x = _leveled(lf, lr, capacity, n, np.minimum(kcap, node_cap), level, weight)
        y = _capped(nf, nr, capacity, n, x)
        held = np.where(y < x * (1 - 1e-9), y, np.inf)
        if np.array_equal(held, node_cap):
            break
        node_cap = held
    return y


def without_loose_caps(pf: np.ndarray, pr: np.ndarray, capacity: np.ndarray, nlinks: int,
                        n: int) -> tuple[np.ndarray, np.ndarray]:
    """The pairs less those of node caps that cannot bind: every flow's rate is at most its tightest
    link's capacity, and flows through one link at most that link's together, so a cap at least the
    sum of the distinct tightest links of the flows crossing it never fills. The rates are those of
    the full problem (a resource that never saturates freezes no flow); dropping it spares the
    alternation between links and caps, which costs each reallocation several max-min solves (a
    port of 10 Gbit/s in front of a few hundred Mbit/s of links is no constraint, only work)."""
    node = pr >= nlinks
    if not node.any():
        return pf, pr
    lf, lr = pf[~node], pr[~node]
    tight = np.full(n, -1)
    order = np.lexsort((-capacity[lr], lf))  # by flow; within it the tightest link last, which wins
    tight[lf[order]] = lr[order]
    nf, nr = pf[node], pr[node]
    tl = tight[nf]
    if (tl < 0).any():  # a flow through a cap but no link: keep every cap (never happens in a model)
        return pf, pr
    pair = np.unique(nr.astype(np.int64) * nlinks + tl)
    bound = np.bincount(pair // nlinks, weights=capacity[pair % nlinks], minlength=len(capacity))
    loose = capacity >= bound * (1 + 1e-9)
    keep = ~node | ~loose[pr]
    return (pf, pr) if keep.all() else (pf[keep], pr[keep])


def _capped(pf: np.ndarray, pr: np.ndarray, capacity: np.ndarray, n: int, kcap: np.ndarray,
            weight: np.ndarray | None = None) -> np.ndarray:
    """(Weighted) max-min over the resources the pairs name, each finite kcap one more resource."""
    uniq, res = np.unique(pr, return_inverse=True)
    caps = [capacity[uniq]]
    capped = np.flatnonzero(np.isfinite(kcap))
    if len(capped):
        pf = np.concatenate([pf, capped])
        res = np.concatenate([res, len(uniq) + np.arange(len(capped))])
        caps.append(kcap[capped])
    return max_min_rates(pf, res, np.concatenate(caps), n, weight)


def _leveled(pf: np.ndarray, pr: np.ndarray, capacity: np.ndarray, n: int, kcap: np.ndarray, level: np.ndarray,
             weight: np.ndarray) -> np.ndarray:
    """Levels filled in order (0 first), each weighted max-min on what the levels before it left."""
    rate = np.zeros(n)
    left = capacity.copy()
    for lv in np.unique(level):
        members = np.flatnonzero(level == lv)
        local = np.full(n, -1)
        local[members] = np.arange(len(members))
        mask = local[pf] >= 0
        sub_f, sub_r = local[pf[mask]], pr[mask]
        r = _capped(sub_f, sub_r, np.maximum(left, 0.0), len(members), kcap[members], weight[members])
        rate[members] = r
        left -= np.bincount(sub_r, weights=r[sub_f], minlength=len(left))
    return rate
