"""The centralized reciprocity reproduction of [RECIP] §5.2 and its CLI.

References: per-example TracIn (Eq. 4) by explicit loops over (training, inference)
example pairs and gradient-descent steps, written here from the loss formulas; the
reciprocity figures of the split-averaged flows recomputed from the per-individual table.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from fedvalue.reciprocity import reciprocity
from simulations.cli import main
from simulations.reciprocity import (
    PAPER,
    ReciprocityConfig,
    _load,
    _one_split,
    _split,
    run_centralized_reciprocity,
)


def brute_force_tracin(model: str, design: np.ndarray, y: np.ndarray, train: np.ndarray, infer: np.ndarray,
                       steps: int, learning_rate: float) -> tuple[dict[int, float], dict[int, float]]:
    """Outflow of each training row and inflow of each inference row, pair by pair (Eq. 4)."""
    w = np.zeros(design.shape[1])
    outflow = {int(u): 0.0 for u in train}
    inflow = {int(v): 0.0 for v in infer}

    def gradient(row: int) -> np.ndarray:
        score = float(design[row] @ w)
        if model == "logistic":
            return (1.0 / (1.0 + math.exp(-score)) - y[row]) * design[row]
        return 2.0 * (score - y[row]) * design[row]

    for _ in range(steps):
        train_gradients = {int(u): gradient(u) for u in train}
        infer_gradients = {int(v): gradient(v) for v in infer}
        for u, gu in train_gradients.items():
            for v, gv in infer_gradients.items():
                flow = learning_rate / len(train) * float(gu @ gv)
                outflow[u] += flow
                inflow[v] += flow
        w = w - learning_rate / len(train) * sum(train_gradients.values())
    return outflow, inflow


@pytest.mark.parametrize("dataset", ["breast-cancer", "diabetes"])
def test_one_split_flows_equal_per_example_tracin(dataset):
    model = PAPER[dataset]["model"]
    x, y = _load(dataset, "raw")
    rows = np.random.default_rng(3).choice(len(y), size=24, replace=False)
    x, y = x[rows], y[rows]
    train, infer = _split(np.random.default_rng(4), len(y))
    outflow, inflow, gap, _ = _one_split(model, x, y, train, infer, steps=3, learning_rate=0.05)
    # The simulation standardizes with the training split's statistics and adds an intercept column.
    mean, std = x[train].mean(axis=0), x[train].std(axis=0)
    design = np.hstack([(x - mean) / np.where(std > 0, std, 1.0), np.ones((len(x), 1))])
    expected_out, expected_in = brute_force_tracin(model, design, y, train, infer, steps=3, learning_rate=0.05)
    np.testing.assert_allclose(outflow, [expected_out[int(u)] for u in train], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(inflow, [expected_in[int(v)] for v in infer], rtol=1e-9, atol=1e-12)
    # Every flow leaves one individual and reaches another.
    assert outflow.sum() == pytest.approx(inflow.sum(), rel=1e-12)
    assert 0 <= gap < 0.5


def test_splits_put_every_individual_on_either_side_with_probability_one_half():
    # Theorem 3.2 needs P(u ∈ Z) = P(u ∈ Z'); with an odd count the extra example's side is a coin flip.
    rng = np.random.default_rng(0)
    n, trials = 7, 4000
    in_train = np.zeros(n)
    for _ in range(trials):
        train, infer = _split(rng, n)
        assert len(np.intersect1d(train, infer)) == 0 and len(train) + len(infer) == n
        in_train[train] += 1
    # Binomial(4000, 1/2): 5 standard deviations is 158.
    assert np.all(np.abs(in_train - trials / 2) < 5 * math.sqrt(trials) / 2)


def test_report_is_recomputed_from_the_per_individual_table():
    result = run_centralized_reciprocity(ReciprocityConfig(dataset="diabetes", repetitions=4, steps=20))
    table = result.individuals.dropna(subset=["inflow", "outflow"])
    again = reciprocity(table["inflow"], table["outflow"], p=0.75)
    assert result.report.alpha == pytest.approx(again.alpha)
    assert result.report.pearson == pytest.approx(again.pearson)
    assert result.num_left_out == len(result.individuals) - len(table)
    # Conditional averaging: each individual's outflow is the mean over the splits that trained on it.
    assert ((table["times_train"] > 0) & (table["times_inference"] > 0)).all()
    frame = result.to_frame()
    assert frame.loc["alpha_at_p=0.75", "paper"] == 0.76


def test_same_seed_same_figures_other_seed_other_splits():
    config = ReciprocityConfig(dataset="diabetes", repetitions=3, steps=10)
    first, again = run_centralized_reciprocity(config), run_centralized_reciprocity(config)
    pd.testing.assert_frame_equal(first.individuals, again.individuals)
    other = run_centralized_reciprocity(ReciprocityConfig(dataset="diabetes", repetitions=3, steps=10, seed=1))
    assert not first.individuals["times_train"].equals(other.individuals["times_train"])


def test_cli_prints_the_table_next_to_the_paper_and_writes_it(tmp_path, capsys):
    out = tmp_path / "reciprocity"
    assert main(["run", "reciprocity", "--dataset", "all", "--repetitions", "2", "--steps", "30",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "breast-cancer: logistic regression, T=30" in printed and "diabetes: linear regression" in printed
    assert "alpha_at_p=0.75" in printed and "0.93" in printed and "0.76" in printed
    figures = pd.read_csv(out / "breast-cancer-figures.csv", index_col="metric")
    assert figures.loc["alpha_at_p=0.75", "paper"] == 0.93
    curve = pd.read_csv(out / "diabetes-alpha-curve.csv")
    assert curve["alpha"].is_monotonic_decreasing or (curve["alpha"].diff().dropna() <= 1e-12).all()
    saved = json.loads((out / "reciprocity.json").read_text())
    assert [r["config"]["dataset"] for r in saved["results"]] == ["breast-cancer", "diabetes"]
    # A second run into the same directory is refused unless asked to overwrite.
    assert main(["run", "reciprocity", "--repetitions", "1", "--steps", "2", "--out", str(out)]) == 2
    assert "out:" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "named"), [
    (["--dataset", "mnist"], "dataset"),
    (["--repetitions", "0"], "repetitions"),
    (["--averaging", "median"], "averaging"),
    (["--p", "1.5"], "p"),
    (["--target", "standardized", "--dataset", "breast-cancer"], "target"),
])
def test_cli_bad_input_names_the_parameter_without_traceback(args, named, capsys):
    assert main(["run", "reciprocity", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedvalue: error: --{named.replace('_', '-')}:") and "Traceback" not in err
