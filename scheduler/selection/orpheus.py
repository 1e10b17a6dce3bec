"""The baseline, Orpheus with the paper's consistency modification (digest 000 §2.5): a sender takes
every worker it has not delivered to in the last k rounds (the forced pairs), then uniformly random
others until it has p. Bandwidth-blind; never more than p unless forced; chosen once per task (under
SSP it never drops anyone). Transfers then share the network max-min fairly."""

from __future__ import annotations

import numpy as np


def orpheus(src: int, n: int, p: int, *, forced: np.ndarray | None = None,
            rng: np.random.Generator | None = None) -> np.ndarray:
    """The receivers of `src`'s multicast, as a sorted array of worker indices. forced: D's row for src."""
    if not 0 <= src < n:
        raise ValueError(f"src: worker {src} outside 0..{n - 1}")
    if p < 0:
        raise ValueError(f"p: must be >= 0, got {p}")
    rng = rng if rng is not None else np.random.default_rng(0)
    must = np.zeros(n, dtype=bool) if forced is None else np.asarray(forced, dtype=bool).copy()
    if must.shape != (n,):
        raise ValueError(f"forced: expected {n} values for sender {src}, got shape {must.shape}")
    must[src] = False
    rest = np.flatnonzero(~must)
    rest = rest[rest != src]
    more = max(0, min(p, n - 1) - int(must.sum()))
    if more:
        must[rng.choice(rest, size=more, replace=False)] = True
    return np.flatnonzero(must)
