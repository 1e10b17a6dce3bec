"""The in-band float check (core.sketch): what it catches, against references computed here."""

from __future__ import annotations

import numpy as np
import pytest

from core import sketch

pytestmark = pytest.mark.unit


def contributions(m: int, n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(m)]


def summed(xs: list[np.ndarray]) -> np.ndarray:
    """A receiver's result: the float32 sum of the members' contributions, each with its trailer."""
    out = np.zeros(len(xs[0]) + sketch.trailer_len(), np.float32)
    for x in xs:
        out += np.concatenate([x, sketch.trailer(x, 1).astype(np.float32)])
    return out


def test_fold_is_the_sum_by_index_mod_fold_and_the_l1():
    x = np.random.default_rng(3).standard_normal(2 * sketch.FOLD + 1234).astype(np.float32)
    f, l1 = sketch.fold(x)
    ref = np.zeros(sketch.FOLD)
    for i in range(0, len(x), sketch.FOLD):  # the definition, written out
        block = x[i:i + sketch.FOLD].astype(np.float64)
        ref[:len(block)] += block
    assert np.allclose(f, ref, rtol=0, atol=1e-9)
    assert np.allclose(sketch.fold_sum(x), ref, rtol=0, atol=1e-9)
    # the L1 only scales the bound (which has a 0.1 % margin) and is stored in float32: float32 blocks will do
    assert l1 == pytest.approx(float(np.abs(x.astype(np.float64)).sum()), rel=1e-6)
    assert sketch.signs(len(f), 1).shape == (sketch.ROWS, sketch.FOLD)  # bounded whatever the model


def test_an_l1_beyond_float32_is_summed_in_float64_not_called_non_finite():
    x = np.full(sketch.FOLD + 10, 1e34, np.float32)  # finite values whose float32 sum overflows
    with np.errstate(over="ignore"):
        assert np.isinf(np.abs(x[:sketch.FOLD]).sum())
    assert sketch.fold(x)[1] == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-6)
    x[7] = np.inf
    assert np.isinf(sketch.fold(x)[1])  # a non-finite value stays non-finite


@pytest.mark.parametrize("n", [1000, sketch.FOLD + 5000])
def test_a_true_sum_passes_and_what_is_not_one_fails(n):
    chunk = min(4000, n // 5)
    xs = contributions(3, n)
    good = summed(xs)
    assert sketch.check(good, n, 3, 1) == (True, "")
    corrupted = good.copy()
    corrupted[n // 2] += 0.5
    assert not sketch.check(corrupted, n, 3, 1)[0]
    shifted = good.copy()  # a chunk landed one chunk further on
    shifted[2 * chunk:3 * chunk] = good[chunk:2 * chunk]
    assert not sketch.check(shifted, n, 3, 1)[0]
    other_round = good.copy()  # a chunk of another round's sum mixed in
    other_round[:chunk] = summed(contributions(3, n, seed=9))[:chunk]
    assert not sketch.check(other_round, n, 3, 1)[0]
    nan = good.copy()
    nan[7] = np.nan
    ok, why = sketch.check(nan, n, 3, 1)
    assert not ok and "non-finite" in why
