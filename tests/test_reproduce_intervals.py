"""The order-statistic interval of `wansync reproduce`'s summaries against hand-computed binomial values
(and scipy's binomial distribution)."""

from __future__ import annotations

import pytest
from scipy.stats import binom

from wansync.reproduce.intervals import coverage, interval, order_k

pytestmark = pytest.mark.unit


def test_coverage_is_the_binomial_probability_between_the_pair():
    assert coverage(6, 1) == pytest.approx(1 - 2 / 64)  # [min, max] of 6: 96.875 %
    assert coverage(9, 2) == pytest.approx(1 - 2 * 10 / 512)  # [2nd, 8th] of 9: 96.09 %
    assert coverage(9, 3) == pytest.approx(1 - 2 * 46 / 512)  # [3rd, 7th] of 9: 82.0 %
    assert coverage(5, 1) == pytest.approx(1 - 2 / 32)  # [min, max] of 5: 93.75 %
    for n in range(1, 25):
        for k in range(1, (n + 1) // 2 + 1):
            assert coverage(n, k) == pytest.approx(binom.cdf(n - k, n, 0.5) - binom.cdf(k - 1, n, 0.5))


@pytest.mark.parametrize(("n", "k", "ok"), [(1, 1, False), (5, 1, False), (6, 1, True), (8, 1, True),
                                            (9, 2, True), (10, 2, True), (12, 3, True), (20, 6, True)])
def test_the_tightest_pair_that_reaches_95_percent(n, k, ok):
    assert order_k(n) == (k, ok)
    if ok:
        assert coverage(n, k) >= 0.95
        if k + 1 <= (n + 1) // 2:
            assert coverage(n, k + 1) < 0.95  # one step tighter falls short


def test_six_seeds_give_min_max_at_96_9_percent():
    iv = interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0])
    assert (iv.median, iv.lo, iv.hi, iv.k) == (3.5, 1.0, 6.0, 1)
    assert iv.coverage == pytest.approx(0.96875) and iv.meets_target
    assert iv.label() == "[min, max] of 6: 96.9 %"


def test_nine_seeds_give_the_2nd_and_8th():
    iv = interval(range(1, 10))
    assert (iv.median, iv.lo, iv.hi) == (5.0, 2.0, 8.0)
    assert iv.label() == "[2nd, 8th] of 9: 96.1 %"


def test_five_seeds_say_there_is_no_95_percent_interval():
    iv = interval([5, 1, 4, 2, 3])
    assert (iv.lo, iv.hi, iv.meets_target) == (1.0, 5.0, False)
    assert iv.coverage == pytest.approx(0.9375)
    assert "no 95 % interval" in iv.label() and "93.8 %" in iv.label()


def test_no_values_is_an_error():
    with pytest.raises(ValueError):
        interval([])
