"""Incremental KNN MC-ADS / MC-DS / LOO against the plain-utility estimators on the same
game (bit for bit for one seed), against exact KNN-ADS, and input errors."""

from __future__ import annotations

import numpy as np
import pytest

import fedvalue
from fedvalue.valuation.knn.exact import knn_ads
from fedvalue.valuation.knn.monte_carlo import knn_loo, knn_mc_ads
from fedvalue.valuation.knn.utility import KnnUtility


def problem(seed: int, n: int = 30, n_test: int = 20):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, size=(n, 3)).astype(float)  # ties and duplicate rows
    y = rng.integers(0, 3, size=n)
    return x, y, rng.normal(size=(n_test, 3)) * 2, rng.integers(0, 3, size=n_test)


@pytest.mark.parametrize("num_groups", [1, 2, 3])
def test_incremental_mc_equals_mc_with_the_plain_utility(num_groups):
    x, y, x_test, y_test = problem(num_groups)
    order = np.random.default_rng(9).permutation(30)
    groups = [part.tolist() for part in np.array_split(order, num_groups)]
    plain = fedvalue.ads(KnnUtility(x, y, x_test, y_test, 3), groups, method="mc", epsilon=0.25, delta=0.1, seed=11)
    fast = knn_mc_ads(x, y, x_test, y_test, groups, k=3, epsilon=0.25, delta=0.1, seed=11)
    assert fast.num_permutations == plain.num_permutations
    assert list(fast.values.index) == list(plain.values.index)
    np.testing.assert_array_equal(fast.values.to_numpy(float), plain.values.to_numpy(float))
    np.testing.assert_array_equal(fast.stderr.to_numpy(float), plain.stderr.to_numpy(float))
    assert fast.prefix_utilities == plain.prefix_utilities
    np.testing.assert_array_equal(fast.efficiency_gaps.to_numpy(), plain.efficiency_gaps.to_numpy())


def test_mc_converges_to_exact_knn_ads():
    x, y, x_test, y_test = problem(4, n=40)
    groups = [list(range(25)), list(range(25, 40))]
    exact = knn_ads(x, y, x_test, y_test, groups, k=3).instances.values
    mc = knn_mc_ads(x, y, x_test, y_test, groups, k=3, num_permutations=4000, seed=0)
    error = np.abs(mc.values.to_numpy(float) - exact.loc[mc.values.index].to_numpy(float))
    assert np.all(error <= 4 * mc.stderr.to_numpy(float) + 1e-12)
    assert mc.max_efficiency_gap < 1e-12


def test_truncation_keeps_each_group_gap_within_the_tolerance():
    x, y, x_test, y_test = problem(5, n=40)
    groups = [list(range(20)), list(range(20, 40))]
    plain = knn_mc_ads(x, y, x_test, y_test, groups, k=3, num_permutations=200, seed=3)
    truncated = knn_mc_ads(x, y, x_test, y_test, groups, k=3, num_permutations=200, seed=3,
                           truncation_tolerance=0.02)
    assert truncated.method == "ads-tmc"
    assert truncated.num_evaluations < plain.num_evaluations == 200 * 40
    assert truncated.max_efficiency_gap < 0.02
    assert np.abs(truncated.values - plain.values).max() < 0.02


def test_loo_equals_loo_with_the_plain_utility():
    for k in (1, 3, 30, 40):  # k ≥ n: nobody has a successor
        x, y, x_test, y_test = problem(k)
        plain = fedvalue.loo(KnnUtility(x, y, x_test, y_test, k), list(range(30)))
        fast = knn_loo(x, y, x_test, y_test, k=k, chunk_size=7)
        np.testing.assert_array_equal(fast.values.to_numpy(float), plain.values.to_numpy(float))
        assert fast.prefix_utilities == plain.prefix_utilities


def test_input_errors_name_the_parameter():
    x, y, x_test, y_test = problem(0, n=6)
    groups = [list(range(6))]
    for kwargs, message in [
        (dict(num_permutations=0), "num_permutations: expected a positive integer or None; got 0"),
        (dict(truncation_tolerance=-1.0), "truncation_tolerance: expected a finite number ≥ 0; got -1.0"),
        (dict(epsilon=0), "epsilon: expected a finite number > 0"),
        (dict(delta=1.5), r"delta: expected a number in the open interval \(0, 1\)"),
        (dict(seed=-3), "seed: expected a non-negative int"),
    ]:
        with pytest.raises(ValueError, match=message):
            knn_mc_ads(x, y, x_test, y_test, groups, k=2, **kwargs)
    with pytest.raises(ValueError, match="groups: expected each training index in exactly one group"):
        knn_mc_ads(x, y, x_test, y_test, [[0, 1, 2], [2, 3, 4, 5]], k=2)
    with pytest.raises(ValueError, match="k: expected a positive integer"):
        knn_loo(x, y, x_test, y_test, k=-1)
