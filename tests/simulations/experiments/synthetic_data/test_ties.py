"""[ADS] Figure 2 with rankings that mean something: tie shares computed by hand, tied values left
unranked, and MC-ADS / LOO under the K-NN likelihood (few ties) beside the paper's accuracy."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedvalue.valuation.knn.monte_carlo import KnnLikelihoodPrefixes, knn_loo
from fedvalue.valuation.knn.utility import KnnUtility
from fedvalue.valuation.prefix_mc import prefix_values
from simulations.cli.main import main
from simulations.experiments.synthetic_data.augmentation import (
    AugmentationConfig,
    intervention_curves,
    splits_no_tie,
    tie_shares,
    value_synthetic,
)
from simulations.experiments.synthetic_data.synthetic_data import (
    originals_and_synthetic,
)


def test_tie_shares_of_a_tiny_instance_by_hand():
    # Synthetic values 0, 0, 0, 0.5, 0.5, 1 (two tie groups: 5 of 6 tied, 3 of 6 zero, 3 distinct); originals ignored.
    values = pd.DataFrame({"group": ["original"] * 2 + ["synthetic"] * 6,
                           "loo": [9.0, 9.0, 0.0, 0.0, 0.0, 0.5, 0.5, 1.0],
                           "random": [9.0, 9.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]})
    table = tie_shares(values, ["loo", "random"]).set_index("method")
    assert table.loc["loo", "tied"] == pytest.approx(5 / 6) and table.loc["loo", "zero"] == pytest.approx(3 / 6)
    assert table.loc["loo", "distinct"] == 3 and table.loc["loo", "instances"] == 6
    assert table.loc["random", "tied"] == 0 and table.loc["random", "distinct"] == 6


@pytest.mark.parametrize(("cut", "decided"), [(0, True), (1, False), (2, False), (3, True), (4, False), (5, True),
                                              (6, True)])
def test_a_cut_is_decided_only_between_different_values(cut, decided):
    assert splits_no_tie(np.array([0.0, 0.0, 0.0, 0.5, 0.5, 1.0]), cut) is decided


def test_knn_likelihood_prefixes_equal_the_knn_likelihood_of_every_subset():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 3)), rng.integers(0, 3, 30)
    x_test, y_test = rng.normal(size=(12, 3)), rng.integers(0, 3, 12)
    masks = rng.random((40, 30)) < 0.3
    masks[0] = False  # the empty set is worth 0
    prefixes = KnnLikelihoodPrefixes(x, y, x_test, y_test, 4)
    # Brute force: sort each test point's distances to the subset's members, count right labels among the 4 nearest.
    distances = ((x_test[:, None, :] - x[None, :, :]) ** 2).sum(axis=2)
    for mask, value in zip(masks, prefix_values(prefixes, masks)):
        members = np.flatnonzero(mask)
        hits = sum(int((y[members[np.argsort(distances[j, members], kind="stable")[:4]]] == y_test[j]).sum())
                   for j in range(12))
        assert value == hits / (4 * 12)
        assert value == KnnUtility(x, y, x_test, y_test, 4)(members)
    # Grown one instance at a time (the MC walk) it returns the same floats.
    state, grown = prefixes.start(np.zeros((1, 30), dtype=bool)), []
    for i in rng.permutation(30):
        grown.append(int(i))
        assert prefixes.add(state, np.array([0]), np.array([i]))[0] == KnnUtility(x, y, x_test, y_test, 4)(grown)


@pytest.fixture(scope="module")
def tiny():
    rng = np.random.default_rng(3)
    data = originals_and_synthetic("digits", "", 5, 4, rng, rotation=30, shift=0.05, scale=0.1, imbalance=0.25,
                                   smote_neighbors=3)
    return data, rng


def test_unranked_ties_leave_split_tie_groups_unmeasured(tiny):
    data, _ = tiny
    config = AugmentationConfig(train_per_class=5, test_per_class=4, permutations=10, fraction_steps=5,
                                max_fraction=1.0)
    values, _ = value_synthetic(data, config, np.random.default_rng(1))
    curves = intervention_curves(data, values, config, np.random.default_rng(0))
    synthetic = np.sort(values.loc[values["group"] == "synthetic", "loo"].to_numpy())
    for _, row in curves[curves["method"] == "loo"].iterrows():
        cut = row["count"] if row["which"] == "lowest" else len(synthetic) - row["count"]
        assert row["decided"] == splits_no_tie(synthetic, cut)
        assert np.isnan(row["relative_accuracy"]) != row["decided"]
    assert curves.loc[curves["method"] == "random", "decided"].all()  # a random ranking has no ties


def test_likelihood_utility_through_the_cli_with_tie_shares(tmp_path, capsys):
    out = tmp_path / "lik"
    assert main(["run", "augmentation", "--out", str(out), "--train-per-class", "6", "--test-per-class", "5",
                 "--permutations", "20", "--seeds", "2", "--fraction-steps", "3", "--utility", "likelihood"]) == 0
    printed = capsys.readouterr().out
    assert "share tied with another value" in printed and "cells decided by the values alone" in printed
    ties = pd.read_csv(out / "ties.csv")
    assert set(ties["seed"]) == {0, 1} and ties["tied"].between(0, 1).all()
    assert main(["run", "augmentation", "--out", str(tmp_path / "bad"), "--utility", "likelihood", "--model",
                 "logistic", "--dataset", "breast-cancer"]) == 2
    assert "utility:" in capsys.readouterr().err


def test_under_the_likelihood_loo_is_knn_leave_one_out_of_the_utility_knn_ads_values(tiny):
    data, _ = tiny
    config = AugmentationConfig(train_per_class=5, test_per_class=4, permutations=10, utility="likelihood")
    values, _ = value_synthetic(data, config, np.random.default_rng(1))
    expected = knn_loo(data.x_train, data.y_train, data.x_test, data.y_test, k=config.k).values.sort_index()
    np.testing.assert_array_equal(values["loo"].to_numpy(), expected.to_numpy(float))
    accuracy, _ = value_synthetic(data, AugmentationConfig(train_per_class=5, test_per_class=4, permutations=10),
                                  np.random.default_rng(1))
    assert not np.array_equal(accuracy["loo"].to_numpy(), values["loo"].to_numpy())
