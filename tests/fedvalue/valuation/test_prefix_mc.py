"""MC-ADS / TMC / LOO by refitting along permutations, against the plain estimators on the same
set function, and the K-NN accuracy prefix model against KnnUtility.accuracy."""

from __future__ import annotations

import numpy as np
import pytest

import fedvalue
from fedvalue.valuation.plan import mc_num_permutations
from fedvalue.valuation.knn.monte_carlo import KnnAccuracyPrefixes
from fedvalue.valuation.knn.utility import KnnUtility
from fedvalue.valuation.prefix_mc import prefix_loo, prefix_mc_ads, prefix_values
from tests.fedvalue.valuation.knn.test_monte_carlo import problem as knn_problem


def problem(seed: int, n: int = 30, n_test: int = 25):
    return knn_problem(seed, n, n_test)  # ties and duplicate rows


@pytest.mark.parametrize("k", [1, 3, 7])
def test_knn_accuracy_prefixes_equal_the_refit_vote(k):
    x, y, x_test, y_test = problem(k)
    model = KnnAccuracyPrefixes(x, y, x_test, y_test, k)
    utility = KnnUtility(x, y, x_test, y_test, k)
    rng = np.random.default_rng(0)
    masks = rng.random((12, 30)) < rng.random((12, 1))
    masks[0] = False  # the empty set: accuracy 0
    np.testing.assert_array_equal(prefix_values(model, masks), [utility.accuracy(np.flatnonzero(m)) for m in masks])
    # Grown one instance at a time, in any order, a subset ends at the same vote.
    state = model.start(np.zeros((3, 30), dtype=bool))
    orders = [rng.permutation(30) for _ in range(3)]
    for j in range(30):
        grown = model.add(state, np.arange(3), np.array([o[j] for o in orders]))
        np.testing.assert_array_equal(grown, [utility.accuracy(o[: j + 1]) for o in orders])


@pytest.mark.parametrize("num_groups", [1, 2])
def test_refit_mc_equals_mc_of_the_set_function(num_groups):
    x, y, x_test, y_test = problem(num_groups + 10)
    order = np.random.default_rng(9).permutation(30)
    groups = [part.tolist() for part in np.array_split(order, num_groups)]
    utility = KnnUtility(x, y, x_test, y_test, 3)
    plain = fedvalue.ads(lambda s: utility.accuracy(sorted(s)), groups, method="mc", epsilon=0.3, delta=0.1, seed=5)
    m = mc_num_permutations(30, 0.3, 0.1)
    refit = prefix_mc_ads(KnnAccuracyPrefixes(x, y, x_test, y_test, 3), groups, num_permutations=m, seed=5,
                          block_size=7)
    assert refit.num_permutations == plain.num_permutations == m
    assert list(refit.values.index) == list(plain.values.index)
    np.testing.assert_allclose(refit.values.to_numpy(float), plain.values.to_numpy(float), rtol=0, atol=1e-15)
    np.testing.assert_allclose(refit.stderr.to_numpy(float), plain.stderr.to_numpy(float), rtol=1e-12, atol=1e-15)
    assert refit.prefix_utilities == plain.prefix_utilities
    assert refit.max_efficiency_gap < 1e-12


def test_one_group_alone_and_truncation():
    x, y, x_test, y_test = problem(4, n=40)
    groups = [list(range(20)), list(range(20, 40))]
    model = KnnAccuracyPrefixes(x, y, x_test, y_test, 3)
    both = prefix_mc_ads(model, groups, num_permutations=60, seed=1)
    second = prefix_mc_ads(model, groups, num_permutations=60, seed=1, values_of=[1])
    # Group 2's values need group 2's permutations only: the same draws, the same values.
    np.testing.assert_array_equal(second.values.to_numpy(float)[20:], both.values.to_numpy(float)[20:])
    assert np.isnan(second.values.to_numpy(float)[:20]).all()
    truncated = prefix_mc_ads(model, groups, num_permutations=60, seed=1, truncation_tolerance=0.05)
    assert truncated.method == "ads-tmc" and truncated.num_evaluations < both.num_evaluations == 60 * 40
    assert truncated.max_efficiency_gap < 0.05


def test_loo_refits_without_each_instance():
    x, y, x_test, y_test = problem(2)
    utility = KnnUtility(x, y, x_test, y_test, 3)
    loo = prefix_loo(KnnAccuracyPrefixes(x, y, x_test, y_test, 3), block_size=4)
    full = utility.accuracy(range(30))
    expected = [full - utility.accuracy([j for j in range(30) if j != i]) for i in range(30)]
    np.testing.assert_allclose(loo.values.to_numpy(float), expected, rtol=0, atol=1e-15)


def test_bad_inputs_name_the_parameter():
    x, y, x_test, y_test = problem(0)
    model = KnnAccuracyPrefixes(x, y, x_test, y_test, 3)
    with pytest.raises(TypeError, match="model: expected a PrefixModel"):
        prefix_mc_ads(object(), [list(range(30))], num_permutations=2)
    with pytest.raises(ValueError, match="values_of: expected group indices"):
        prefix_mc_ads(model, [list(range(30))], num_permutations=2, values_of=[3])
    with pytest.raises(ValueError, match="masks: expected a boolean"):
        prefix_values(model, np.ones((2, 5), dtype=bool))
