"""What a worker does with the models other workers multicast to it (progress mcast-bsp, mcast-ssp).

SelMcast (digest 000) says who sends to whom and when a worker may go on, not what a receiver does
with what it gets: "receivers apply a model only after a complete delivery" (§3.3) and never a
partial one (§7.3); the paper evaluates no training. The rule here is ours [ours], written down
before it was built (docs/training-progress.md says the same for users):

Which models. Worker i finishes iteration k (its script called step(): its model x_i^k is its
contribution, multicast to the receivers the chooser picked). Before it computes iteration k + 1 it
combines x_i^k with, per sender j, the NEWEST model x_j^t it received completely since its last
combination (a receiver dropped from a multicast, or one whose delivery failed its check, has
nothing from it) — provided t >= k - s, s being the job's staleness bound (mcast-ssp's `--staleness`,
0 under mcast-bsp). An older one, and any model of j superseded by a newer one, is discarded unapplied
(and counted: `stale_dropped`, `superseded`).

With what weights. Uniform: x_i <- (x_i^k + sum_{j in R} x_j^t) / (1 + |R|), R the senders whose model
it applies. The agent hands the script the float32 sum (summed in float64) and the weight 1 + |R|;
wt.Optimizer's model mode divides, as it divides a reduce's weighted sum by its weights' sum. A worker
that received nothing this time keeps its own model (R empty, weight 1).

When. Under mcast-bsp after GO(k + 1), which comes once every multicast of round k is over: then R
holds the round-k models of every sender that chose i (t = k). Under mcast-ssp after GO(k + 1) too:
whatever has arrived by then; later arrivals wait for the next combination.

What the staleness bound guarantees. SSP lets i compute k + 1 only when min_j d_j >= k - s (d_j: the
last iteration of j whose multicast is over; scheduler/progress/ssp.py). So when i combines after k,
every worker has finished and sent iteration k - s at least, and i never applies a model more than s
iterations older than its own (k - t <= s): the filter above makes that hold whatever the network
delays, and the test replays it from the recorded combinations. It does not guarantee that i heard
from every worker: SelMcast picks receivers; its consistency rule (every pair at least once in k_c + 1
of the sender's rounds) bounds how long i can go without a model from j.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

LOG_MAX = 1000  # combinations logged per job (the STATS message stays under the wire's 65,536 entries)
APPLIED_MAX = 12_000  # their (k, sender, iteration) entries


@dataclass
class Combination:
    """One combination: after iteration `k`, the senders' models applied (sender -> its iteration)."""

    k: int
    applied: dict[int, int]
    total: np.ndarray  # own + the applied models, float32 (with their check trailers: linear)
    weight: float


@dataclass
class Inbox:
    """The newest complete model from each sender since this worker's last combination."""

    node: int
    staleness: int
    models: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict)  # sender -> (iteration, values)
    stale_dropped: int = 0
    superseded: int = 0
    combined: list[int] = field(default_factory=list)  # k of every combination, in order
    applied: list[int] = field(default_factory=list)  # k, sender, its iteration: flat, per model applied

    def put(self, sender: int, iteration: int, values: np.ndarray) -> None:
        """A delivery that passed its check (a multicast's whole result); an older one of the same sender
        is replaced, a late older one ignored."""
        if sender == self.node:
            return
        have = self.models.get(sender)
        if have is not None:
            if have[0] >= iteration:
                self.superseded += 1
                return
            self.superseded += 1
        self.models[sender] = (iteration, values)

    def combine(self, k: int, own: np.ndarray) -> Combination:
        """After iteration k: own plus every fresh model (t >= k - s), summed in float64; the inbox empties."""
        applied: dict[int, int] = {}
        total = own.astype(np.float64)
        for sender in sorted(self.models):
            t, values = self.models[sender]
            if t < k - self.staleness:
                self.stale_dropped += 1
                continue
            total += values
            applied[sender] = t
        self.models.clear()
        if len(self.combined) < LOG_MAX:
            self.combined.append(k)
            for j, t in sorted(applied.items()):
                self.applied += [k, j, t]
        return Combination(k, applied, total.astype(np.float32), float(1 + len(applied)))

    def stats(self) -> dict[str, object]:
        """For the job's STATS (flat lists: the wire's plain values nest at most four deep)."""
        return {"staleness": self.staleness, "combined": self.combined, "applied": self.applied[:APPLIED_MAX],
                "stale_dropped": self.stale_dropped, "superseded": self.superseded}
