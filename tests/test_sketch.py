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


@pytest.fixture(params=["compiled", "numpy"])
def folding(request, monkeypatch):
    """Folder with core.sketchjit's compiled loops, and with numpy's (no numba, or WANSYNC_NO_JIT)."""
    if request.param == "numpy":
        monkeypatch.setattr(sketch, "_JIT", [None])
    else:
        pytest.importorskip("numba")
        monkeypatch.setattr(sketch, "_JIT", [])
    return request.param


@pytest.mark.parametrize("n", [1000, 2 * sketch.FOLD + 4321])
def test_a_trailer_folded_piece_by_piece_is_the_whole_vectors(folding, n):
    """Pieces written at their offsets (scaled copies, pieces added after they were written, zeros),
    some crossing a multiple of FOLD: the same sketch rows as sketch.trailer of the vector they make,
    bit for bit, and its L1 (computed here in float64)."""
    rng = np.random.default_rng(5)
    fold = sketch.Folder(n)
    assert fold.compiled == (folding == "compiled")
    x = np.zeros(n, np.float32)
    cuts = sorted({0, n, *rng.integers(1, n, 6).tolist(), *(c for c in (sketch.FOLD - 7, sketch.FOLD + 3) if c < n)})
    for i, (lo, hi) in enumerate(zip(cuts, cuts[1:], strict=False)):
        src = rng.standard_normal(hi - lo).astype(np.float32)
        if i % 3 == 0:
            fold.scaled_copy(src, x[lo:hi], 0.25, lo)
            want = src * np.float32(0.25)
            assert np.array_equal(x[lo:hi], want)  # the copy itself: float32(src * scale)
        elif i % 3 == 1:
            x[lo:hi] = src
            fold.add(x[lo:hi], lo)
        else:
            fold.zeros(hi - lo)
    assert fold.covered == n
    got, ref = fold.trailer(1), sketch.trailer(x, 1)
    assert np.array_equal(got[:sketch.ROWS], ref[:sketch.ROWS])
    # the L1 only scales the bound: float64 with the compiled loop, float32 blocks with numpy's
    assert got[sketch.ROWS] == pytest.approx(float(np.abs(x.astype(np.float64)).sum()), rel=1e-6)


def test_a_folded_trailer_passes_the_check_and_a_wrong_one_fails(folding):
    """Two contributions sealed by Folder, summed as a receiver sums them: the check passes; one whose
    trailer missed a piece (the writer folded less than it wrote) fails it."""
    n = sketch.FOLD + 999
    xs = contributions(2, n, seed=9)
    out = np.zeros(n + sketch.trailer_len(), np.float32)
    for j, x in enumerate(xs):
        fold, slot = sketch.Folder(n), np.empty(n, np.float32)
        fold.scaled_copy(x, slot, 1.0, 0)
        if j == 1:
            slot[:10] += 1.0  # written after it was folded: the trailer no longer says what the slot holds
        out += np.concatenate([slot, fold.trailer(1).astype(np.float32)])
    ok, why = sketch.check(out, n, 2, 1)
    assert not ok and "sketch" in why
    out = np.zeros(n + sketch.trailer_len(), np.float32)
    for x in xs:
        fold, slot = sketch.Folder(n), np.empty(n, np.float32)
        fold.scaled_copy(x, slot, 1.0, 0)
        out += np.concatenate([slot, fold.trailer(1).astype(np.float32)])
    assert sketch.check(out, n, 2, 1) == (True, "")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_makes_the_folded_trailer_non_finite(folding, bad):
    """The agent tells a non-finite contribution by its trailer: the compiled loops' fastmath must not
    assume finite values away."""
    n = 5000
    src = np.ones(n, np.float32)
    src[1234] = bad
    fold = sketch.Folder(n)
    fold.scaled_copy(src, np.empty(n, np.float32), 0.5, 0)
    assert not np.isfinite(fold.trailer(1)).all()
    fold = sketch.Folder(n)
    fold.add(src, 0)
    assert not np.isfinite(fold.trailer(1)).all()
