"""The centralized reproductions: [FAIRINFL] §5's toy direction (Fig. 1, Prop. 5.2) and the
[FAIRIJ] protocol's split discipline on SLID."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from simulations.cli.main import main
from simulations.experiments.fairness.data import slid_frame
from simulations.experiments.fairness.central import (
    FairnessCentralConfig,
    exact_solver,
    slid_erm,
    slid_features,
    tabular_seed,
    tabular_summary,
    threshold_lever,
    toy_seed,
    toy_summary,
)
from tests.fedvalue.scoring.fairness.test_objectives import one_thread  # noqa: F401 - one torch thread, as there



def test_toy_pruning_by_fairness_moves_the_threshold_right_and_lowers_dp():
    config = FairnessCentralConfig(experiment="toy", keep_fractions=(0.6,), gammas=(0.0,))
    rows = pd.DataFrame([r for seed in range(10) for r in toy_seed(config, seed)])
    summary = toy_summary(rows, 0.95).set_index("order")
    # Fig. 1 (right) / Prop. 5.2: down-weighting small-|S(i)| examples shifts the threshold right
    # and lowers the DP violation; random pruning moves neither.
    assert summary.at["fairness", "fig1_direction"]
    assert summary.at["fairness", "threshold_shift_low"] > 0 and summary.at["fairness", "dp_change_high"] < 0
    assert summary.at["random", "threshold_shift_low"] < 0 < summary.at["random", "threshold_shift_high"]
    # The instance has a lever: at the accurate threshold, moving right lowers DP (symmetric means: none).
    assert rows.loc[rows["order"] == "erm", "lever"].max() < -0.05
    assert abs(threshold_lever((-1.5, -0.3, 0.3, 1.5), 0.0)) < 1e-12


def test_tabular_protocol_decides_on_validation_and_reports_on_test():
    config = FairnessCentralConfig(experiment="tabular", lams=6, seeds=2)
    frame = slid_frame()
    assert len(frame) == 3987
    rows = pd.DataFrame(tabular_seed(config, 0, frame))
    erm = rows[rows["edit"] == "erm"].iloc[0]
    assert erm["test_accuracy"] > erm["majority"] + 0.1  # the model clearly beats the majority class
    assert erm["test_dp_gap"] > 0.25
    # Changing the test rows' labels changes no decision, only the reported test figures.
    order = np.random.default_rng([0, 47]).permutation(len(frame))
    test = order[3 * len(frame) // 4:]
    flipped = frame.copy()
    wages = flipped["wages"].to_numpy().copy()
    wages[test] = wages[test][::-1]
    flipped["wages"] = wages
    again = pd.DataFrame(tabular_seed(config, 0, flipped))
    decided = ["curvature", "edit", "variant", "strength", "changed", "validation_accuracy", "validation_dp_gap"]
    pd.testing.assert_frame_equal(rows[decided], again[decided])
    assert not np.allclose(rows["test_accuracy"], again["test_accuracy"])
    rules = rows[(rows["variant"] == "rule") & (rows["edit"] != "erm")]
    assert (rules["validation_dp_gap"] <= erm["validation_dp_gap"]).all()
    assert (rules.loc[rules["edit"].isin(["ijack", "simjack"]), "validation_dp_gap"] < erm["validation_dp_gap"]).all()
    summary = tabular_summary(pd.concat([rows, pd.DataFrame(tabular_seed(config, 1, frame))]), "dp", 0.95)
    assert {"beats_random", "test_dp_gap_vs_matched", "test_accuracy_vs_gradient"} <= set(summary.columns)


def test_bad_options_are_named(capsys):
    assert main(["run", "fairness-central", "--toy-means", "1,2,3,4"]) == 2
    assert "toy_means" in capsys.readouterr().err.replace("-", "_")
    assert main(["run", "fairness-central", "--seeds", "1"]) == 2
    assert main(["run", "fairness-central", "--keep-fractions", "0.5,1.5"]) == 2
    with pytest.raises(ValueError, match="gap"):
        dataclasses.replace(FairnessCentralConfig(), gap="xx").check()


def test_the_mlp_variant_damps_an_indefinite_hessian_and_uses_its_hidden_layer():
    config = FairnessCentralConfig(experiment="tabular", lams=3, hidden=4, fit_iterations=15)
    frame = slid_frame()
    (x, y, z), (train, _, _), model, risk, theta = slid_erm(config, 0, frame)
    features = slid_features(config, model, theta, x[train])
    assert features.shape == (len(train), 4)
    first = model.unflatten(theta)
    expected = torch.nn.functional.selu(torch.as_tensor(x[train]) @ first["0.weight"].T + first["0.bias"])
    assert np.allclose(features, expected.numpy())
    saddle = torch.diag(torch.tensor([2.0, -1.0], dtype=torch.float64))
    assert exact_solver(saddle, 0.5).damping == pytest.approx(1.5)
    assert exact_solver(torch.eye(2, dtype=torch.float64), 0.5).damping == 0.0
    rows = pd.DataFrame(tabular_seed(config, 0, frame))
    assert set(rows["edit"]) == {"erm", "fair-ij", "drop-upweight", "ijack", "simjack", "gradient"}
