"""The in-band check's fold compiled (numba), for the one place its pass is the floor: a training
script's hand-off (wansync.torch), where each gradient is scaled into the send slot and folded in the
same pass, so sealing a contribution costs no pass of its own (core.sketch.Folder).

Importing this module needs numba (the `torch` extra installs it); core.sketch falls back to numpy
without it. The loops keep core.sketch.fold's arithmetic where it matters: each value is folded as the
float32 it is stored as, in float64, in index order (the same fold, bit for bit); only the L1 norm is
summed in another order (float64 throughout, which the check's 0.1 % margin does not need). The
fastmath flags allow that reassociation and nothing else: no assumption that values are finite, so a
NaN or an infinity still reaches the trailer and marks the contribution."""

from __future__ import annotations

import numba
import numpy as np

FLAGS = {"reassoc", "nsz"}  # reorder the L1 sum (vectorized); never assume finite values


@numba.njit(nogil=True, cache=True, fastmath=FLAGS, boundscheck=False)
def scaled_fold(src: np.ndarray, dst: np.ndarray, scale: np.float32, start: int, acc: np.ndarray) -> float:
    """dst = float32(src * scale); acc[(start + i) % len(acc)] += dst[i]; returns sum |dst| (float64)."""
    n, period = src.shape[0], acc.shape[0]
    total = 0.0
    i, j = 0, start % period
    while i < n:
        run = min(n - i, period - j)
        s, d, a = src[i:i + run], dst[i:i + run], acc[j:j + run]
        part = 0.0
        for t in range(run):
            v = s[t] * scale
            d[t] = v
            w = np.float64(v)
            a[t] += w
            part += abs(w)
        total += part
        i += run
        j = 0
    return total


def fold_into(x: np.ndarray, start: int, acc: np.ndarray) -> float:
    """acc[(start + i) % len(acc)] += x[i]; returns sum |x| (float64). x is written back as it is (times 1
    is exact): the same loop as scaled_fold, for the values a writer put in place itself."""
    return scaled_fold(x, x, np.float32(1.0), start, acc)


def warm() -> None:
    """Compile (or load from numba's cache) the loop now, so no step pays for it."""
    acc = np.zeros(3)
    x = np.ones(4, np.float32)
    scaled_fold(x, np.empty(4, np.float32), np.float32(1.0), 0, acc)
