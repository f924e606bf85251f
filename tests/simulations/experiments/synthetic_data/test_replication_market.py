"""The replication-market simulation ([ADS] §6.1.2) end to end through the CLI at tiny sizes,
with the identities its totals must satisfy: group efficiency for ADS, the symmetric split of
Lemma 3.1 for DS."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedvalue.valuation.knn.utility import KnnUtility
from simulations.cli.main import main
from simulations.experiments.synthetic_data.replication_market import PRINTED_RESULTS, ReplicationMarketConfig
from simulations.experiments.synthetic_data.synthetic_data import images_with_augmentations

TINY = ["--train-per-class", "8", "--test-per-class", "6", "--contributors", "4"]


def test_cli_totals_follow_group_efficiency_and_symmetry(tmp_path, capsys):
    first, second = tmp_path / "one", tmp_path / "two"
    assert main(["run", "replication-market", "--out", str(first), *TINY, "--results", str(tmp_path / "kept")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("data: 80 originals owned by 4 contributors") and "copied 2x" in out
    # --results keeps the table as printed (the docs quote it as a block) under the command and the commit.
    kept = (tmp_path / "kept" / PRINTED_RESULTS).read_text().splitlines()
    assert kept[0].startswith(f"# fedvalue run replication-market --out {first} --train-per-class 8 ")
    assert kept[1].startswith("scenario      configuration  ") and len(kept) == 1 + 1 + 3 + 2
    assert "\n".join(kept[1:]) + "\n" in out
    assert main(["run", "replication-market", "--out", str(second), "--quiet", *TINY]) == 0
    for name in ("totals.csv", "contributors.csv", "run.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert (first / "figure3.png").stat().st_size > 10_000

    # Recompute the utilities the totals must add up to, from the same data draw.
    config = ReplicationMarketConfig(train_per_class=8, test_per_class=6, contributors=4)
    data_rng, _ = np.random.default_rng(config.seed).spawn(2)
    data = images_with_augmentations("digits", "", 8, 6, data_rng, rotation=config.rotation, shift=config.shift,
                                     scale=config.scale)
    totals = pd.read_csv(first / "totals.csv").set_index(["scenario", "configuration", "method", "party"])["total"]
    originals = KnnUtility(data.x_original, data.y_original, data.x_test, data.y_test, 5)(range(80))
    for copies, name in ((0, "original"), (1, "copied 1x"), (2, "copied 2x")):
        x = np.vstack([data.x_original] * (copies + 1))
        y = np.concatenate([data.y_original] * (copies + 1))
        everything = KnnUtility(x, y, data.x_test, data.y_test, 5)(range(len(y)))
        # ADS: contributors keep v(originals), the broker gets the rest (group efficiency).
        assert totals[("replication", name, "ADS", "contributors")] == pytest.approx(originals, abs=1e-12)
        assert totals[("replication", name, "ADS", "broker")] == pytest.approx(everything - originals, abs=1e-12)
        # DS: efficient over everything; a copy is worth about its original (exactly, but for
        # distance ties between different images: digits' pixels are multiples of 1/16).
        ds = totals[("replication", name, "DS", "contributors")]
        assert ds + totals[("replication", name, "DS", "broker")] == pytest.approx(everything, abs=1e-12)
        assert ds == pytest.approx(everything / (copies + 1), abs=1e-3)
    assert totals[("augmentation", "augmented, positive kept", "ADS", "contributors")] == pytest.approx(originals,
                                                                                                     abs=1e-12)
    # Per-contributor values add up to the contributors' total.
    parties = pd.read_csv(first / "contributors.csv")
    mine = parties[(parties["configuration"] == "copied 1x") & (parties["method"] == "DS")
                   & (parties["party"] != "broker")]
    assert len(mine) == 4
    assert mine["value"].sum() == pytest.approx(totals[("replication", "copied 1x", "DS", "contributors")], abs=1e-12)


@pytest.mark.parametrize("option, value, message", [
    ("--contributors", "0", "contributors: expected a positive integer"),
    ("--contributors", "1000", "contributors: expected at most one contributor per original"),
    ("--dataset", "breast-cancer", "dataset: expected one of ['digits', 'mnist']"),
    ("--max-copies", "-1", "--max-copies: expected a positive integer"),
    ("--rotation", "-5", "rotation: expected a finite number ≥ 0"),
])
def test_bad_options_exit_2_naming_the_parameter(tmp_path, capsys, option, value, message):
    assert main(["run", "replication-market", "--out", str(tmp_path / "x"), *TINY, option, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedvalue: error: ") and message in err and "Traceback" not in err
