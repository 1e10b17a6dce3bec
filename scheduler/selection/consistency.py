"""The consistency rule: every worker delivers to every other at least once in every k + 1 of its rounds.

c[i][j] counts the consecutive rounds of i whose multicast did not deliver to j; the pairs with
c >= k are forced (D) into i's next multicast, so no pair goes k + 1 rounds without a delivery
(digest 000 §2.1: the paper says both "every k + 1" and "every k"; D = {c >= k} is what makes its
"scale >= 1/(k+1)" argument hold). Only completed deliveries reset c: a receiver dropped from a
running multicast (SSP's shrink-only sets) counts as not delivered.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class Consistency:
    def __init__(self, n: int, k: int | None) -> None:
        """k: the bound (None: no rule, nothing is ever forced)."""
        if n < 1:
            raise ValueError(f"n: need at least one worker, got {n}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ValueError(f"k: must be an integer >= 0 or None, got {k!r}")
        self.n, self.k = n, k
        self.c = np.zeros((n, n), dtype=np.int64)  # the diagonal stays 0: a worker never sends to itself

    def forced(self) -> np.ndarray:
        """D as an n x n boolean matrix: pairs (i, j) that i's next multicast must include."""
        if self.k is None:
            return np.zeros((self.n, self.n), dtype=bool)
        d = self.c >= self.k
        np.fill_diagonal(d, False)
        return d

    def after_round(self, i: int, delivered: Iterable[int]) -> None:
        """Worker i's multicast of a round is over; `delivered`: the receivers that got all of it."""
        got = np.zeros(self.n, dtype=bool)
        got[list(delivered)] = True
        if got[i]:
            raise ValueError(f"delivered: worker {i} cannot deliver to itself")
        row = self.c[i]
        row[got] = 0
        row[~got] += 1
        row[i] = 0
