"""The augmentation simulation ([ADS] §6.1.1) end to end through the CLI at tiny sizes, its
pieces against independent computations (the logistic model against scikit-learn's
liblinear fit), and its input errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedvalue.valuation.knn.utility import KnnUtility
from fedvalue.valuation.prefix_mc import prefix_values
from simulations.experiments.synthetic_data.augmentation import (
    METHODS,
    PRINTED_RESULTS,
    AugmentationConfig,
    intervention_curves,
    value_synthetic,
)
from simulations.experiments.synthetic_data.models import LogisticPrefixes
from simulations.cli.main import main
from simulations.experiments.synthetic_data.synthetic_data import augment_images, originals_and_synthetic

TINY = ["--train-per-class", "6", "--test-per-class", "5", "--permutations", "20", "--seeds", "2",
        "--fraction-steps", "3"]


def test_cli_writes_tables_and_figure_and_is_deterministic(tmp_path, capsys):
    first, second = tmp_path / "one", tmp_path / "two"
    assert main(["run", "augmentation", "--out", str(first), *TINY, "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "seed 1: values by knn-ads, mc-ads, knn-ds, tmc-ds, loo, random" in out and "ADS beats DS and LOO" in out
    # --results keeps the tables as printed (the docs quote them as blocks) under the command and the commit.
    kept = (tmp_path / "results" / PRINTED_RESULTS).read_text().splitlines()
    assert kept[0].startswith(f"# fedvalue run augmentation --out {first} --train-per-class 6 ")
    assert kept[1] == "mean relative accuracy over fractions > 0 (better: (a), (d) higher; (b), (c) lower)"
    assert "\n".join(kept[1:]) in out and kept[-1].startswith("random ")
    assert main(["run", "augmentation", "--out", str(second), "--quiet", *TINY]) == 0
    assert "seed 0 (1/2)" not in capsys.readouterr().out
    for name in ("values.csv", "curves.csv", "summary.csv", "orderings.csv", "convergence.csv", "run.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert (first / "figure2.png").stat().st_size > 10_000
    curves = pd.read_csv(first / "curves.csv")
    assert set(curves["method"]) == set(METHODS) and set(curves["panel"]) == {"a", "b", "c", "d"}
    assert len(curves) == 2 * len(METHODS) * 4 * 4
    # Zero fraction is the baseline itself in every panel.
    assert np.all(curves.loc[curves["fraction"] == 0, "relative_accuracy"] == 1.0)
    orderings = pd.read_csv(first / "orderings.csv")
    assert list(orderings["panel"]) == ["a", "b", "c", "d"]
    assert {"knn-ads_beats_knn-ds_and_loo", "mc-ads_beats_tmc-ds_and_loo"} <= set(orderings.columns)
    convergence = pd.read_csv(first / "convergence.csv")
    assert set(convergence["method"]) == {"mc-ads", "tmc-ds"} and (convergence["permutations"] == 20).all()
    # MC-ADS walks the synthetic group only; the originals' MC-ADS values are not computed.
    values = pd.read_csv(first / "values.csv")
    assert values.loc[values["group"] == "original", "mc-ads"].isna().all()
    assert values.loc[values["group"] == "synthetic", "mc-ads"].notna().all()
    # A non-empty directory is refused without --overwrite.
    assert main(["run", "augmentation", "--out", str(first), *TINY]) == 2
    assert "out:" in capsys.readouterr().err


def test_breast_cancer_with_borderline_smote_through_the_cli(tmp_path):
    out = tmp_path / "bc"
    assert main(["run", "augmentation", "--dataset", "breast-cancer", "--out", str(out), "--quiet",
                 "--train-per-class", "60", "--test-per-class", "20", "--permutations", "10", "--seeds", "1",
                 "--fraction-steps", "2"]) == 0
    values = pd.read_csv(out / "values.csv")
    synthetic = values[values["group"] == "synthetic"]
    assert 0 < len(synthetic) <= 60 - 15  # Borderline-SMOTE rows up to balance 60 : 15
    logistic = tmp_path / "logistic"
    assert main(["run", "augmentation", "--dataset", "breast-cancer", "--model", "logistic", "--out", str(logistic),
                 "--quiet", "--train-per-class", "60", "--test-per-class", "20", "--permutations", "10",
                 "--seeds", "1", "--fraction-steps", "2"]) == 0
    curves = pd.read_csv(logistic / "curves.csv")
    assert set(curves["method"]) == {"mc-ads", "tmc-ds", "loo", "random"} and curves["knn_utility"].isna().all()


def test_mnist_from_a_local_npz(tmp_path):
    rng = np.random.default_rng(0)
    images = (rng.random((60, 28, 28)) * 255).astype(np.uint8)
    labels = np.arange(60) % 10
    path = tmp_path / "mnist.npz"
    np.savez(path, x_train=images[:40], y_train=labels[:40], x_test=images[40:], y_test=labels[40:])
    out = tmp_path / "mnist-run"
    assert main(["run", "augmentation", "--dataset", "mnist", "--mnist-path", str(path), "--out", str(out),
                 "--quiet", "--train-per-class", "3", "--test-per-class", "2", "--permutations", "5", "--seeds", "1",
                 "--fraction-steps", "1"]) == 0
    assert pd.read_csv(out / "values.csv").shape[0] == 60


@pytest.mark.parametrize("option, value, message", [
    ("--k", "0", "k: expected a positive integer"),
    ("--dataset", "diabetes", "dataset: expected one of"),
    ("--max-fraction", "1.5", "--max-fraction: expected a share"),
    ("--scale", "1.2", "scale: expected a zoom range"),
    ("--seeds", "0", "seeds: expected a positive integer"),
    ("--model", "tree", "model: expected one of"),
    ("--model", "logistic", "model: 'logistic' is the binary logistic regression"),
    ("--truncation-tolerance", "-1", "--truncation-tolerance: expected a finite number"),
    ("--train-per-class", "500", "train_per_class/test_per_class: class 0 has"),
    ("--dataset", "mnist", "--mnist-path: expected"),
])
def test_bad_options_exit_2_naming_the_parameter(tmp_path, capsys, option, value, message):
    assert main(["run", "augmentation", "--out", str(tmp_path / "x"), option, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedvalue: error: ") and message in err and "Traceback" not in err


def test_augmentation_keeps_images_close_and_zero_range_is_identity():
    images = originals_and_synthetic("digits", "", 2, 1, np.random.default_rng(0), rotation=0, shift=0, scale=0,
                                     imbalance=0.25, smote_neighbors=3)
    np.testing.assert_allclose(images.x_synthetic, images.x_original, atol=1e-12)
    rng = np.random.default_rng(1)
    moved = augment_images(images.x_original, rng, rotation=15, shift=0.0625, scale=0.1)
    assert moved.shape == images.x_original.shape and moved.min() >= 0 and moved.max() <= 1
    assert 0 < np.abs(moved - images.x_original).mean() < 0.3


def test_curves_refit_the_right_sets():
    config = AugmentationConfig(train_per_class=5, test_per_class=4, permutations=10, fraction_steps=2,
                                max_fraction=0.5, ties="random")
    rng = np.random.default_rng(3)
    data = originals_and_synthetic("digits", "", 5, 4, rng, rotation=30, shift=0.05, scale=0.1, imbalance=0.25,
                                   smote_neighbors=3)
    values, _ = value_synthetic(data, config, rng)
    curves = intervention_curves(data, values, config, np.random.default_rng(0))
    utility = KnnUtility(data.x_train, data.y_train, data.x_test, data.y_test, config.k)
    n, originals = len(data.y_train), data.num_original
    # The ranking by hand: ascending value, ties by the same random draw.
    tie_breaker = np.random.default_rng(0).random(n - originals)
    ranked = originals + np.lexsort((tie_breaker, values["knn-ads"].to_numpy()[originals:]))
    expected = {
        "a": np.setdiff1d(np.arange(n), ranked[:25]),
        "b": np.setdiff1d(np.arange(n), ranked[-25:]),
        "c": np.concatenate([np.arange(originals), np.sort(ranked[:25])]),
        "d": np.concatenate([np.arange(originals), np.sort(ranked[-25:])]),
    }
    for panel, members in expected.items():
        row = curves[(curves["method"] == "knn-ads") & (curves["panel"] == panel) & (curves["fraction"] == 0.5)]
        baseline = np.arange(n) if panel in "ab" else np.arange(originals)
        assert row["accuracy"].item() == utility.accuracy(members)
        assert row["relative_accuracy"].item() == utility.accuracy(members) / utility.accuracy(baseline)
        assert row["knn_utility"].item() == utility(members)


def _binary_problem(seed: int = 0):
    return originals_and_synthetic("breast-cancer", "", 40, 20, np.random.default_rng(seed), rotation=0, shift=0,
                                   scale=0, imbalance=0.25, smote_neighbors=3)


def test_logistic_model_is_liblinears_fit_from_any_start():
    """The optimum scikit-learn's liblinear finds (intercept penalized, C = 1), whatever the start."""
    from sklearn.linear_model import LogisticRegression

    data = _binary_problem()
    model = LogisticPrefixes(data.x_train, data.y_train, data.x_test, data.y_test)
    rng = np.random.default_rng(1)
    masks = rng.random((4, len(data.y_train))) < 0.6
    cold = model.start(masks)
    for row, mask in enumerate(masks):
        fitted = LogisticRegression(solver="liblinear", C=1.0, tol=1e-12, max_iter=10_000).fit(
            data.x_train[mask], data.y_train[mask])
        np.testing.assert_allclose(cold["weights"][row], np.r_[fitted.coef_[0], fitted.intercept_], atol=1e-6)
        assert model.utilities(cold)[row] == np.mean(fitted.predict(data.x_test) == data.y_test)
    # Grown one instance at a time from a warm start, a subset ends at the cold fit's optimum.
    state = model.start(np.zeros((1, len(data.y_train)), dtype=bool))
    for instance in rng.permutation(np.flatnonzero(masks[0])):
        model.add(state, np.array([0]), np.array([instance]))
    np.testing.assert_allclose(state["weights"][0], cold["weights"][0], atol=1e-8)
    # The empty subset has an optimum too: w = 0, which predicts class 0.
    empty = prefix_values(model, np.zeros((1, len(data.y_train)), dtype=bool))[0]
    assert empty == np.mean(data.y_test == 0)
