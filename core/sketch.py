"""The in-band check of a float sum, in memory that does not grow with the model.

A contribution x (P float32 values) carries K = 4 sketch values R x and ||x||_1 after it; summation
is linear, so a result's trailer holds sum_j w_j R x_j and sum_j w_j ||x_j||_1, and a receiver checks
|R r - trailer| <= 2 (m + 2) u sum_j w_j ||x_j||_1 per row (u = 2^-24; agents.training derives the
bound). R's rows are +-1 signs that repeat with period FOLD, a prime: R x = S fold(x), where fold(x)
sums x's elements with equal index mod FOLD, so the signs take 4 x FOLD doubles (8 MB) whatever P is,
and a check costs one pass over the result. What it catches is what the full matrix caught: a
corrupted value, a chunk of another round, and a chunk landed at a wrong offset, because an offset
moves by a multiple d of the chunk size, and a prime above the chunk sizes divides d only when d is
FOLD chunks or more.

Beyond the sketch a trailer may hold `flags`: one slot per rank that a contribution sets to say "my
values were not finite, I sent zeros instead", so every receiver can name who failed a sync.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

import numpy as np

U32 = 2.0 ** -24  # float32's unit roundoff
ROWS = 4
FOLD = 262_139  # the largest prime below 2^18


def trailer_len(flags: int = 0) -> int:
    """Values after the model: the sketch rows, the L1 norm, then `flags` per-rank slots."""
    return ROWS + 1 + flags


@lru_cache(maxsize=4)
def signs(period: int, seed: int) -> np.ndarray:
    """ROWS x period of +-1 as float64 (the same on every worker for a seed)."""
    rng = np.random.default_rng(10_007 + seed)
    return (rng.integers(0, 2, (ROWS, period), dtype=np.int8) * 2 - 1).astype(np.float64)


def fold(x: np.ndarray) -> tuple[np.ndarray, float]:
    """x's elements summed by index mod FOLD (float64), and ||x||_1: one pass over x in blocks of FOLD
    (each block, read once, feeds both while it is in cache), so nothing the size of x is allocated.
    The L1 of each block is summed in float32 (numpy's pairwise sum: relative error ~30 u, which the
    check's 0.1 % margin on the bound absorbs; the trailer stores it in float32 anyway), the blocks in
    float64; a block whose float32 sum overflows is summed again in float64. A non-finite x gives a
    non-finite fold."""
    n = len(x)
    if n <= FOLD:
        return x.astype(np.float64), _l1(x, np.empty(n, np.float32) if x.dtype == np.float32 else None)
    out = np.zeros(FOLD, np.float64)
    tmp = np.empty(FOLD, np.float32) if x.dtype == np.float32 else None
    l1 = 0.0
    for i in range(0, n, FOLD):
        block = x[i:i + FOLD]
        np.add(out[:len(block)], block, out=out[:len(block)])
        l1 += _l1(block, tmp)
    return out, l1


def _l1(block: np.ndarray, tmp: np.ndarray | None) -> float:
    if tmp is None:  # not float32: no faster sum than float64's
        return float(np.abs(block).sum(dtype=np.float64))
    a = np.abs(block, out=tmp[:len(block)])
    with np.errstate(over="ignore"):
        part = float(a.sum())
    if part == np.inf and np.isfinite(block).all():
        part = float(a.sum(dtype=np.float64))
    return part


def fold_sum(x: np.ndarray) -> np.ndarray:
    """fold's sum alone (the check needs no L1): one reduction over x seen as rows of FOLD (numpy casts
    in small buffers, so nothing the size of x is allocated), then the short last row."""
    n = len(x)
    if n <= FOLD:
        return x.astype(np.float64)
    rows = n // FOLD
    out = x[:rows * FOLD].reshape(rows, FOLD).sum(axis=0, dtype=np.float64)
    tail = x[rows * FOLD:]
    out[:len(tail)] += tail
    return out


def sketch(x: np.ndarray, seed: int) -> np.ndarray:
    """R x (ROWS values, float64)."""
    f = fold_sum(x)
    return signs(len(f), seed) @ f


def trailer(x: np.ndarray, seed: int) -> np.ndarray:
    """A contribution's sketch and L1 norm (float64; the caller stores them as float32). Non-finite
    where x is."""
    f, l1 = fold(x)
    return np.concatenate([signs(len(f), seed) @ f, [l1]])


class Folder:
    """A contribution's trailer, built while its values are written: each piece is folded at its offset
    as it is written (`scaled_copy`: scaled into place and folded in one pass where core.sketchjit's
    compiled loop is installed; `add`: a piece already in place), and `trailer` gives what `trailer`
    would give for the whole contribution (the same sketch rows; the L1 summed in float64).
    `covered` counts the values folded, so a caller can tell a trailer that missed some (`complete`)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.acc = np.zeros(min(n, FOLD), np.float64)
        self.l1 = 0.0
        self.covered = 0
        self._tmp: np.ndarray | None = None  # numpy's |x| per block, without the compiled loop
        self.compiled = _jit() is not None

    @property
    def complete(self) -> bool:
        """Every one of the contribution's n values was folded."""
        return self.covered == self.n

    def reset(self) -> None:
        self.acc.fill(0.0)
        self.l1 = 0.0
        self.covered = 0

    def add(self, x: np.ndarray, offset: int) -> None:
        """x (float32, 1-D) holds the contribution's values [offset, offset + len(x))."""
        jit = _jit()
        if jit is not None and x.flags.c_contiguous and x.flags.writeable and x.dtype == np.float32:
            self.l1 += jit.fold_into(x, offset, self.acc)  # writes x back unchanged: one loop for both
        else:
            if self._tmp is None:
                self._tmp = np.empty(len(self.acc), np.float32)
            period, i, j = len(self.acc), 0, offset % len(self.acc)
            while i < len(x):
                run = min(len(x) - i, period - j)
                block, part = x[i:i + run], self.acc[j:j + run]
                np.add(part, block, out=part)
                self.l1 += _l1(block, self._tmp)
                i, j = i + run, 0
        self.covered += len(x)

    def zeros(self, n: int) -> None:
        """n values were set to zero (they add nothing: counted only)."""
        self.covered += n

    def scaled_copy(self, src: np.ndarray, dst: np.ndarray, scale: float, offset: int) -> None:
        """dst = float32(src * scale), then folded as the values [offset, offset + len(dst)); in one
        pass with the compiled loop."""
        jit = _jit()
        if jit is not None and src.flags.c_contiguous and dst.flags.c_contiguous and src.dtype == np.float32:
            self.l1 += jit.scaled_fold(src, dst, np.float32(scale), offset, self.acc)
            self.covered += len(dst)
            return
        np.multiply(src, np.float32(scale), out=dst)
        self.add(dst, offset)

    def trailer(self, seed: int) -> np.ndarray:
        """The sketch rows and the L1 norm (float64), as `trailer` of the whole contribution."""
        return np.concatenate([signs(len(self.acc), seed) @ self.acc, [self.l1]])


_JIT: list = []  # [module or None], once looked up


def warm() -> bool:
    """Load the compiled fold now (numba's import and cache: a second or so), not at the first Folder; True
    if there is one."""
    return _jit() is not None


def _jit() -> Any:
    """core.sketchjit if numba is installed (and WANSYNC_NO_JIT is unset), compiled or loaded now; else None."""
    if not _JIT:
        module = None
        if not os.environ.get("WANSYNC_NO_JIT"):
            try:
                from core import sketchjit
            except ImportError:
                pass
            else:
                sketchjit.warm()
                module = sketchjit
        _JIT.append(module)
    return _JIT[0]


def tolerance(m: int) -> float:
    """Elementwise bound factor for m weighted float32 contributions, any order: (m + 1) u."""
    g = (m + 1) * U32
    return g / (1 - g)


def check(result: np.ndarray, params: int, m: int, seed: int) -> tuple[bool, str]:
    """The in-band check of a weighted sum of m contributions of `params` values each, the trailer
    after them (see the module docstring)."""
    f = fold_sum(result[:params])
    if not np.all(np.isfinite(f)):
        return False, "the model holds non-finite values"
    got = signs(len(f), seed) @ f
    want = result[params:params + ROWS].astype(np.float64)
    l1 = float(result[params + ROWS])
    tol = 2 * tolerance(m + 1) * l1 * 1.001 + 1e-30
    err = float(np.abs(got - want).max())
    if not err <= tol:
        return False, f"sketch of the result is {err:.3g} off the members' sketches (tolerance {tol:.3g})"
    return True, ""
