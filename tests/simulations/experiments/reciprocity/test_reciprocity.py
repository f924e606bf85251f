"""The centralized reciprocity reproduction of [RECIP] §5.2 and its CLI.

References: per-example TracIn (Eq. 4) by explicit loops over (training, inference)
example pairs and gradient-descent steps, written here from the loss formulas; Marginal
influence (Eq. 3) by retraining one pipeline at a time; the reciprocity figures of the
split-averaged flows recomputed from the per-individual table.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from fedvalue.flows.marginal import marginal_losses
from fedvalue.flows.reciprocity_measures import reciprocity
from simulations.cli.main import main
from simulations.experiments.reciprocity.centralized import (
    PAPER,
    ReciprocityConfig,
    _load,
    _split,
    run_centralized_reciprocity,
)
from simulations.experiments.reciprocity.training import fit_losses, initial_weights, marginal_split, tracin_split


def brute_force_tracin(model: str, design: np.ndarray, y: np.ndarray, train: np.ndarray, infer: np.ndarray,
                       steps: int, learning_rate: float, w: np.ndarray) -> tuple[dict[int, float], dict[int, float]]:
    """Outflow of each training row and inflow of each inference row, pair by pair (Eq. 4), from ``w``."""
    outflow = {int(u): 0.0 for u in train}
    inflow = {int(v): 0.0 for v in infer}

    def gradient(row: int) -> np.ndarray:
        score = float(design[row] @ w)
        if model == "logistic":
            return (1.0 / (1.0 + math.exp(-score)) - y[row]) * design[row]
        return 2.0 * (score - y[row]) * design[row]

    w = w.copy()
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


def _small(dataset: str, size: int = 24):
    x, y = _load(dataset, "raw")
    rows = np.random.default_rng(3).choice(len(y), size=size, replace=False)
    x, y = x[rows], y[rows]
    train, infer = _split(np.random.default_rng(4), len(y))
    return PAPER[dataset]["model"], x, y, train, infer


@pytest.mark.parametrize("initialization", ["average-label", "zero"])
@pytest.mark.parametrize("dataset", ["breast-cancer", "diabetes"])
def test_one_split_flows_equal_per_example_tracin(dataset, initialization):
    model, x, y, train, infer = _small(dataset)
    flows = tracin_split(model, x, y, train, infer, steps=3, learning_rate=0.05, initialization=initialization,
                         checkpoint_every=1)
    # The simulation standardizes with the training split's statistics and adds an intercept column.
    mean, std = x[train].mean(axis=0), x[train].std(axis=0)
    design = np.hstack([(x - mean) / np.where(std > 0, std, 1.0), np.ones((len(x), 1))])
    w0 = np.zeros(design.shape[1])
    if initialization == "average-label":  # the workshop version: the model predicts the mean training label
        mean_label = y[train].mean()
        w0[-1] = math.log(mean_label / (1 - mean_label)) if model == "logistic" else mean_label
    expected_out, expected_in = brute_force_tracin(model, design, y, train, infer, 3, 0.05, w0)
    np.testing.assert_allclose(flows.outflow, [expected_out[int(u)] for u in train], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(flows.inflow, [expected_in[int(v)] for v in infer], rtol=1e-9, atol=1e-12)
    # Every flow leaves one individual and reaches another; the last checkpoint is the total.
    assert flows.outflow.sum() == pytest.approx(flows.inflow.sum(), rel=1e-12)
    assert flows.checkpoints.tolist() == [1, 2, 3]
    np.testing.assert_array_equal(flows.cumulative_outflow[-1], flows.outflow)
    assert 0 <= flows.first_order_gap < 0.5


def test_average_label_start_predicts_the_mean_training_label():
    for model, labels in (("logistic", np.array([0.0, 1.0, 1.0, 1.0])), ("linear", np.array([10.0, 20.0, 60.0]))):
        w = initial_weights(model, labels, 5, "average-label")
        assert np.all(w[:-1] == 0)
        prediction = 1 / (1 + math.exp(-w[-1])) if model == "logistic" else w[-1]
        assert prediction == pytest.approx(labels.mean(), rel=1e-12)
    assert np.all(initial_weights("linear", labels, 5, "zero") == 0)


@pytest.mark.parametrize("dataset", ["breast-cancer", "diabetes"])
def test_batched_marginal_equals_retraining_one_pipeline_at_a_time(dataset):
    """M_{Z∖{z}}: statistics, start and T steps of Z∖{z}, for every z, against fit_losses one by one."""
    model, x, y, train, infer = _small(dataset, 20)
    full, removed = marginal_split(model, x, y, train, infer, steps=15, learning_rate=0.05)
    local = lambda kept: train[kept]  # noqa: E731 - rows of ``train`` kept -> dataset rows
    expected_full, expected = marginal_losses(
        local, lambda rows: fit_losses(model, x, y, rows, infer, steps=15, learning_rate=0.05), len(train),
        [[k] for k in range(len(train))])
    scale = np.abs(expected).max()
    np.testing.assert_allclose(full, expected_full, rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(removed, expected, rtol=1e-10, atol=1e-12 * scale)
    # A removal changes the model: the marginals are not all zero.
    assert np.abs(removed - full).max() > 1e-6 * scale


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


@pytest.fixture(scope="module")
def diabetes_both():
    """One small run with both influences, shared by the tests below."""
    return run_centralized_reciprocity(ReciprocityConfig(dataset="diabetes", repetitions=6, steps=20,
                                                         influence="both", checkpoint_every=5))


def test_report_is_recomputed_from_the_per_individual_table(diabetes_both):
    result = diabetes_both
    for influence in ("tracin", "marginal"):
        table = result.individuals.dropna(subset=[f"{influence}_inflow", f"{influence}_outflow"])
        again = reciprocity(table[f"{influence}_inflow"], table[f"{influence}_outflow"], p=0.75)
        assert result.reports[influence, "conditional"].alpha == pytest.approx(again.alpha)
        assert result.reports[influence, "conditional"].pearson == pytest.approx(again.pearson)
    assert result.report is result.reports["tracin", "conditional"]
    assert result.num_left_out == len(result.individuals) - len(table)
    # Conditional averaging: each individual's outflow is the mean over the splits that trained on it.
    assert ((table["times_train"] > 0) & (table["times_inference"] > 0)).all()
    frame = result.to_frame()
    # 20 steps is not the paper's T = 200: its alpha is not set beside ours.
    assert np.isnan(frame.loc["tracin alpha_at_p=0.75 (conditional)", "paper"])
    paper_steps = run_centralized_reciprocity(ReciprocityConfig(dataset="diabetes", repetitions=2, influence="both"))
    frame = paper_steps.to_frame()
    assert frame.loc["tracin alpha_at_p=0.75 (conditional)", "paper"] == 0.76
    assert frame.loc["tracin alpha_at_p=0.75 (all-splits)", "paper"] == 0.76
    assert frame.loc["marginal alpha_at_p=0.75 (conditional)", "paper"] == 0.36
    assert frame.loc["marginal outflow_snr_p90", "paper"] == 0.55


def test_longer_training_is_set_beside_the_workshops_1000_step_figure():
    result = run_centralized_reciprocity(ReciprocityConfig(dataset="diabetes", repetitions=2, steps=1000,
                                                           checkpoint_every=100))
    frame = result.to_frame()
    assert frame.loc["tracin alpha_at_p=0.75 (conditional)", "paper"] == 0.20  # workshop Fig. 6
    assert frame.loc["tracin alpha at step 200", "paper"] == 0.76
    steps = result.alpha_by_step.set_index("step")["conditional"]
    assert frame.loc["tracin alpha at step 200", "measured"] == steps[200]


def test_both_averagings_and_reciprocity_along_training(diabetes_both):
    result = diabetes_both
    steps = result.alpha_by_step
    assert steps["step"].tolist() == [5, 10, 15, 20]
    for averaging in ("conditional", "all-splits"):  # the last checkpoint is the whole run
        assert steps[averaging].iloc[-1] == pytest.approx(result.reports["tracin", averaging].alpha)
    # All-splits means divide by every repetition: the same ratio only when u sat on each side equally often.
    times = result.individuals[["times_train", "times_inference"]]
    assert (times["times_train"] + times["times_inference"] == 6).all()
    assert set(result.snr.index) == {"tracin", "marginal"}


def test_same_seed_same_figures_other_seed_other_splits():
    config = ReciprocityConfig(dataset="diabetes", repetitions=3, steps=10)
    first, again = run_centralized_reciprocity(config), run_centralized_reciprocity(config)
    pd.testing.assert_frame_equal(first.individuals, again.individuals)
    other = run_centralized_reciprocity(ReciprocityConfig(dataset="diabetes", repetitions=3, steps=10, seed=1))
    assert not first.individuals["times_train"].equals(other.individuals["times_train"])


def test_cli_prints_the_table_next_to_the_paper_and_writes_it(tmp_path, capsys):
    out = tmp_path / "reciprocity"
    assert main(["run", "reciprocity", "--dataset", "all", "--repetitions", "2", "--steps", "30",
                 "--initializations", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "breast-cancer: logistic regression, T=30" in printed and "diabetes: linear regression" in printed
    assert "tracin alpha_at_p=0.75 (conditional)" in printed and "tracin alpha (all splits)" in printed
    assert "movielens (dslabs stand-in: 81915 ratings, 671 users, 2245 movies" in printed
    figures = pd.read_csv(out / "breast-cancer-figures.csv", index_col="metric")
    # T = 30 is not the paper's 600: no paper figure beside it; the split counts are.
    assert np.isnan(figures.loc["tracin alpha_at_p=0.75 (conditional)", "paper"])
    assert figures.loc["repetitions", "paper"] == 100
    curve = pd.read_csv(out / "diabetes-alpha-curve.csv")
    assert curve["alpha"].is_monotonic_decreasing or (curve["alpha"].diff().dropna() <= 1e-12).all()
    assert (out / "movielens-figure1.png").stat().st_size > 10_000
    assert (out / "diabetes-alpha-by-step.png").stat().st_size > 10_000
    saved = json.loads((out / "reciprocity.json").read_text())
    assert [r["config"]["dataset"] for r in saved["results"]] == ["breast-cancer", "diabetes", "movielens"]
    # A second run into the same directory is refused unless asked to overwrite.
    assert main(["run", "reciprocity", "--repetitions", "1", "--steps", "2", "--out", str(out)]) == 2
    assert "out:" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "named"), [
    (["--dataset", "mnist"], "dataset"),
    (["--repetitions", "-1"], "repetitions"),
    (["--averaging", "median"], "averaging"),
    (["--p", "1.5"], "p"),
    (["--target", "standardized", "--dataset", "breast-cancer"], "target"),
    (["--influence", "shapley"], "influence"),
    (["--initialization", "random"], "initialization"),
    (["--dataset", "movielens", "--initialization", "zero"], "initialization"),
    (["--initializations", "3"], "initializations"),
    (["--train-fraction", "0.8"], "train_fraction"),
    (["--dataset", "movielens", "--marginal-users", "1"], "marginal_users"),
    (["--local-steps", "2"], "local_steps"),
    (["--dataset", "movielens", "--local-steps", "2", "--influence", "both"], "local_steps"),
])
def test_cli_bad_input_names_the_parameter_without_traceback(args, named, capsys):
    assert main(["run", "reciprocity", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedvalue: error: --{named.replace('_', '-')}:") and "Traceback" not in err


def test_every_option_of_the_paper_simulations_has_its_own_help():
    """A simulation's help mapping names its options; one simulation's text never shows in another's."""
    import argparse

    from simulations.cli.main import build_parser

    parser = build_parser()
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    simulations = next(a for a in run._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in ("reciprocity", "augmentation", "procurement", "replication-market"):
        for action in simulations[name]._actions:
            if action.option_strings and action.dest not in ("help", "out", "overwrite", "quiet"):
                assert not action.help.startswith(" (default"), (name, action.dest)
    helps = {name: {a.dest: a.help for a in simulations[name]._actions} for name in simulations}
    assert helps["reciprocity"]["steps"].startswith("full-batch gradient-descent steps T (0 = the paper's: 600")
    assert "1000 movielens" in helps["reciprocity"]["steps"]
    assert helps["augmentation"]["seeds"].startswith("seeds run and averaged in the figure")
    assert not helps["noisy-clients-study"]["seeds"].startswith("seeds run and averaged in the figure")
