"""The synthetic workload's contributions and sums against the formula written out again here.

agents.workload computes them from 4096-entry tables over one 2048-element period; the references
below compute every element from its definition (helpers.exact), so a wrong period, cell or table
shows as differing elements."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.exact import closed_form, exact_sum

from agents.workload import CHECK_ROWS, PERIOD, contribution, expected, expected_period, mismatches

pytestmark = pytest.mark.unit

SIZES = (1, 31, 2047, 2048, 2049, 70_001)


@pytest.mark.parametrize("params", SIZES)
def test_a_contribution_is_the_formula_at_every_element(params):
    for rnd, attempt, node in ((0, 0, 0), (3, 1, 5), (77, 2, 300), (1000, 0, 257)):
        got = contribution(rnd, attempt, node, params)
        assert got.dtype == np.float32 and got.shape == (params,)
        assert np.array_equal(got, closed_form(rnd, node, params, attempt).astype(np.float32))


@pytest.mark.parametrize("params", SIZES)
def test_the_sum_of_members_is_the_exact_sum(params):
    nodes = [0, 2, 9, 300, 511]
    assert np.array_equal(expected(4, 0, nodes, params), exact_sum(4, nodes, params))
    iters = {2: 5, 300: 3}
    assert np.array_equal(expected(4, 0, nodes, params, iters=iters), exact_sum(4, nodes, params, iters=iters))
    weights = {n: float(n % 3 + 1) for n in nodes}
    assert np.array_equal(expected(4, 0, nodes, params, weights=weights),
                          exact_sum(4, nodes, params, weights=weights))


def test_fractional_weights_sum_each_weighted_contribution_in_float64():
    params, nodes = 5000, [1, 4, 6]
    weights = {1: 0.5, 4: 0.3, 6: 1.7}
    acc = np.zeros(params, np.float64)
    for n in nodes:
        acc += closed_form(9, n, params).astype(np.float32) * np.float32(weights[n])
    assert np.array_equal(expected(9, 0, nodes, params, weights=weights), acc.astype(np.float32))


@pytest.mark.parametrize("params", (*SIZES, PERIOD * CHECK_ROWS * 2 + 5))
def test_the_receivers_check_counts_every_element_that_differs_from_the_exact_sum(params):
    """mismatches() compares a result with one period of the sum, a block at a time: against the sum
    computed element by element here, it finds nothing on the exact result and exactly the elements
    changed, wherever they are (first, last, in the tail past the last whole period, across blocks)."""
    nodes, iters = [0, 3, 7], {3: 2}
    want = exact_sum(5, nodes, params, iters=iters)
    period = expected_period(5, 0, nodes, iters=iters)
    assert mismatches(want.copy(), period) == 0
    hit = sorted({0, params - 1, params // 2, min(params - 1, PERIOD * CHECK_ROWS + 1)})
    for n in range(1, len(hit) + 1):
        bad = want.copy()
        bad[hit[:n]] += 1.0
        assert mismatches(bad, period) == n
    bad = want.copy()
    bad[-1] = np.nan
    assert mismatches(bad, period) == 1
    with pytest.raises(ValueError, match="one period"):
        mismatches(want, period[:-1])
