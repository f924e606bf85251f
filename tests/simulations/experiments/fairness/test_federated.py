"""The fairness simulation: its data, its checks, and one small real run on Ray."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from fedvalue.scoring.fairness.objectives import GroupFairness
from simulations.cli.main import main as cli
from simulations.experiments.fairness.data import GAUSSIAN_MEANS, GERMAN_CSV, build_federation, german_frame
from simulations.experiments.fairness.federated import (
    POLICIES,
    FairnessConfig,
    fairness_from_run,
    held_out_halves,
    run_fairness,
    utility_from_run,
)
from simulations.runner import EngineSettings


def test_german_credit_ships_with_the_project_under_an_open_data_license():
    frame = german_frame()
    assert len(frame) == 1000 and {"risk", "sex"} <= set(frame.columns)
    assert set(frame["sex"]) == {"male", "female"} and set(frame["risk"]) == {0, 1}
    license_text = GERMAN_CSV.with_name("german_credit_LICENSE.txt").read_text()
    assert "Database Contents License" in license_text and "Statlog" in license_text


@pytest.mark.parametrize("dataset", ["gaussian", "german", "slid"])
def test_federations_split_every_row_once_with_skewed_mixes(dataset):
    data = build_federation(dataset, num_clients=10, concentration=0.3, seed=4, examples_per_client=30)
    sizes = [len(y) for y in data.client_y]
    assert min(sizes) >= 1
    if dataset in ("german", "slid"):
        assert sum(sizes) + len(data.y_test) == {"german": 1000, "slid": 3987}[dataset]
    mixes = data.mixes()
    assert mixes["group1_share"].max() - mixes["group1_share"].min() > 0.5  # clients hold different mixes
    assert all(x.shape[1] == data.num_features for x in data.client_x)
    again = build_federation(dataset, num_clients=10, concentration=0.3, seed=4, examples_per_client=30)
    assert all(np.array_equal(a, b) for a, b in zip(data.client_x, again.client_x))


def test_gaussian_example_orders_the_means_as_the_paper_does():
    m = GAUSSIAN_MEANS
    assert m[(0, 0)] < m[(1, 0)] < 0 < m[(0, 1)] < m[(1, 1)]
    data = build_federation("gaussian", num_clients=4, concentration=1.0, seed=0)
    x, z = data.x_test[:, 0], data.z_test
    # The group 1 is favoured: its rows lie further right within each label.
    assert x[(z == 1) & (data.y_test == 1)].mean() > x[(z == 0) & (data.y_test == 1)].mean()


@pytest.mark.parametrize(("change", "message"), [
    ({"drops": (0,)}, "drops: expected integers in"),
    ({"drops": (8,)}, "drops: expected integers in"),
    ({"lams": (-1.0,)}, "lams: expected numbers > 0"),
    ({"datasets": ("adult",)}, "datasets: expected distinct names"),
    ({"gap": "parity"}, "gap: expected one of"),
    ({"clients_per_round": 30}, "clients_per_round: expected at most num_clients"),
    ({"tail": 21}, "tail: expected at most rounds"),
    ({"seeds": 0}, "seeds: expected a positive integer"),
    ({"policies": ("drop-k",)}, "policies: expected distinct names among"),
    ({"policies": ("fedavg", "drop-k-hessian")}, "policies: expected distinct names among"),
    ({"confidence": 1.0}, "confidence: expected a number in the open interval"),
    ({"damping": 0.0}, "damping: expected"),
])
def test_bad_settings_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(FairnessConfig(), **change).check()


def test_the_cli_names_a_bad_option(capsys):
    assert cli(["run", "fairness", "--out", "/nonexistent-never-written", "--drops", "0"]) == 2
    assert "drops: expected integers in" in capsys.readouterr().err


def test_the_held_out_rows_split_in_two_disjoint_halves_that_decide_and_report():
    decide, report = held_out_halves(601, 3)
    assert len(decide) == 300 and len(report) == 301 and not set(decide) & set(report)
    assert sorted({*decide, *report}) == list(range(601))
    saved = {"dataset": "gaussian", "num_clients": 4, "concentration": 1.0, "examples_per_client": 10, "gap": "dp",
             "seed": 3}
    data = build_federation("gaussian", num_clients=4, concentration=1.0, seed=3, examples_per_client=10)
    decide, report = held_out_halves(len(data.y_test), 3)
    assert np.array_equal(utility_from_run(saved).y.numpy(), data.y_test[decide])
    assert np.array_equal(fairness_from_run(saved).z.numpy(), data.z_test[decide])
    assert np.array_equal(fairness_from_run(saved, "report").z.numpy(), data.z_test[report])


def test_a_small_run_writes_tables_figure_and_auditable_ledgers(tmp_path, capsys):
    config = FairnessConfig(datasets=("gaussian",), seeds=2, num_clients=6, clients_per_round=4, rounds=2,
                            local_epochs=3, examples_per_client=20, drops=(1,), lams=(30.0,), tail=1,
                            engine=EngineSettings(max_parallel_clients=1))
    tables = run_fairness(config, tmp_path / "out")
    out = tmp_path / "out"
    for name in ("per_round.csv", "tradeoff.csv", "comparison.csv", "scoring.csv", "clients.csv", "fairness.png"):
        assert (out / name).stat().st_size > 0, name
    per_round = pd.read_csv(out / "per_round.csv")
    assert len(per_round) == 2 * len(POLICIES) * 3  # two seeds, every rule, rounds 0..2
    assert set(per_round["policy"]) == set(POLICIES)
    versus = tables["comparison"]
    assert set(versus["policy"]) == set(POLICIES) - {"fedavg", "random"} and (versus["seeds"] == 2).all()
    # A paired difference is the mean of the per-seed differences of the report-half metrics.
    last = per_round[per_round["round"] == 2].set_index(["policy", "seed"])
    row = versus[versus["policy"] == "drop-k-exact"].iloc[0]
    expected = (last.loc["drop-k-exact", "dp_gap"] - last.loc["random", "dp_gap"]).mean()
    assert row["dp_gap_diff"] == pytest.approx(expected, abs=1e-12)
    assert row["dp_gap_diff_low"] <= row["dp_gap_diff"] <= row["dp_gap_diff_high"]
    scored = tables["scoring"]
    assert set(scored["score"]) == {"first-order", "renormalized", "curvature-unrenormalized", "curvature"}
    assert ((scored["top_is_best"] >= 0) & (scored["top_is_best"] <= 1)).all()
    # Round 0 is A_0 for every rule; the rules then part ways.
    first = per_round[per_round["round"] == 0]
    assert (first.groupby("seed")["dp_gap"].nunique() == 1).all()
    table = tables["tradeoff"]
    assert table.loc[table["policy"] == "fedavg", "accuracy_cost"].item() == 0.0
    # The per-round metrics are the objective's own, on the realized states the ledgers hold.
    run_dir = out / "gaussian" / "seed-0" / "ijack-30"
    saved = pd.read_json(run_dir / "run.json", typ="series").to_dict()
    objective = fairness_from_run(saved)
    assert isinstance(objective, GroupFairness) and utility_from_run(saved).metric == "accuracy"
    capsys.readouterr()
    assert cli(["audit", str(run_dir)]) == 0
    printed = capsys.readouterr().out
    assert "recomputed every value of 2 rounds" in printed and "intact" in printed
    assert cli(["audit", str(out / "gaussian" / "seed-1" / "drop-k-curvature-1")]) == 0
    printed = capsys.readouterr().out
    assert "recomputed every value of 2 rounds" in printed and "intact" in printed
    assert cli(["report", str(out / "gaussian" / "seed-0" / "drop-k-1")]) == 0
    printed = capsys.readouterr().out
    for column in ("total_ads_fairness", "total_loo_fairness", "total_fairness_influence", "total_selected",
                   "total_fairness_influence_curvature"):
        assert column in printed
