"""Receiver selection for peer-to-peer multicast synchronization (SelMcast, seed 000): pure functions.

Every worker multicasts its parameters to a subset of the others; these modules decide the subsets.
They see only numbers — volumes, port bandwidths of a big switch (each worker's uplink b^I and
downlink b^E), counters — and return boolean receiver matrices, so the scheduler's progress policy
(scheduler/progress/mcast.py), the simulator's driver (sim/switch.py) and the tests run the very same
code. Workers are indices 0..n-1 here; callers map node ids to them.

    consistency.py  c[i][j] (rounds of i without a delivery to j) and the forced pairs D = {c >= k}
    selmcast.py     Algorithm 1 (BSP: basic selection on the least-loaded downlinks, then Pareto
                    extras while the estimated completion does not grow) and Algorithm 2 (SSP: online
                    on each READY, eta-stickiness, shrink-only sets, per-task deadlines >= tau_i)
    orpheus.py      the baseline: the forced pairs, then uniformly random receivers up to p
    optimal.py      the exact lexicographic MILP (12) on scipy.optimize.milp (HiGHS), for small n
"""

from .consistency import Consistency
from .orpheus import orpheus
from .selmcast import Selection, SspChoice, completion, ingress_load, selmcast_bsp, selmcast_ssp

__all__ = ["Consistency", "Selection", "SspChoice", "completion", "ingress_load", "orpheus", "selmcast_bsp",
           "selmcast_ssp"]
