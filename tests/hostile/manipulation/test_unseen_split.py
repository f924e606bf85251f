"""The crafted update's runs valued again on test images the server's valuation never used: the split is
disjoint from the held-out set and class-balanced, the revaluation with the server's own utility reproduces the
booked ADS (so a difference on the unseen split is the split's), and the bench's table is the study's gain on
the held-out side. One small real study on Ray (Fashion-MNIST, 3 clients, 2 seeds)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench import attack_study
from fedvalue.analysis.run_summary import load_run
from simulations.cli.main import main
from simulations.experiments.attacks.attacks import AttacksConfig
from simulations.experiments.attacks.study import cached_dataset, holdout_rows
from simulations.experiments.attacks.unseen_split import unseen_frames, unseen_gains, unseen_rows

OPTIONS = ["--attacks", "none,crafted-update", "--dataset", "fashion-mnist", "--num-clients", "3",
           "--train-examples", "300", "--holdout-examples", "200", "--rounds", "2", "--local-epochs", "1",
           "--seeds", "2", "--craft-steps", "3", "--quiet"]


def test_the_unseen_split_is_outside_the_held_out_set_class_balanced_and_seeded():
    labels = cached_dataset("fashion-mnist", "test").y
    for seed in (0, 1):
        held, unseen = holdout_rows(labels, seed, 500), unseen_rows(seed, 500)
        assert len(unseen) == 500 and not set(held) & set(unseen)
        assert np.bincount(labels[unseen], minlength=10).tolist() == [50] * 10
        np.testing.assert_array_equal(unseen, unseen_rows.__wrapped__(seed, 500))
    assert set(unseen_rows(0, 500)) != set(unseen_rows(1, 500))
    with pytest.raises(ValueError, match="holdout_examples"):
        unseen_rows.__wrapped__(0, 0)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("unseen") / "iid-fedavg"
    assert main(["run", "attacks", *OPTIONS, "--out", str(out)]) == 0
    return out


@pytest.mark.slow  # its fixture runs a study through Ray
def test_the_server_utility_reproduces_the_booked_ads_and_the_gain(study):
    totals, runs = unseen_frames(study, AttacksConfig, ["crafted-update"])
    assert sorted(runs["attack"]) == ["crafted-update", "crafted-update", "none", "none"]
    for (seed, attack), frame in totals.groupby(["seed", "attack"]):
        ledger = load_run(study / f"iid-fedavg-seed{seed}" / attack).ledger
        booked = ledger[(ledger["method"] == "ads") & (ledger["status"] == "ok")].groupby("client_id")["value"].sum()
        recomputed = frame.set_index("client_id")["ads"]
        assert recomputed.to_dict() == pytest.approx({int(c): v for c, v in booked.items()}, abs=1e-12)
        assert not np.allclose(frame["ads"], frame["ads_unseen"])  # another split, other values
    for _, run in runs.iterrows():
        final = load_run(study / f"iid-fedavg-seed{run['seed']}" / run["attack"]).rounds["utility_realized"].iloc[-1]
        assert run["accuracy_recomputed"] == pytest.approx(final, abs=1e-12)
    table = unseen_gains(totals, runs).set_index("attack")
    gains = pd.read_csv(study / "gains.csv").set_index(["attack", "book"])
    assert table.loc["crafted-update", "gain_held_out"] == pytest.approx(gains.loc[("crafted-update", "ads"), "gain"])


@pytest.mark.slow  # its fixture runs a study through Ray
def test_the_bench_tables_the_unseen_split_and_keeps_its_results_file(study, tmp_path, capsys):
    attack_study.main(["--out", str(study.parent), "--unseen", "--results", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "| iid-fedavg | crafted-update | 2 |" in printed
    kept = pd.read_csv(tmp_path / "attack_gains_unseen.csv", comment="#")
    assert list(kept["attack"]) == ["crafted-update"]
    with pytest.raises(SystemExit):
        attack_study.main(["--out", str(tmp_path / "nothing-here"), "--unseen"])
