"""The augmentation runs' ties table, rendered from results files of the real format (made up, no run): the
accuracy run's methods, then the likelihood run's retrained ones, as the docs write them."""

from __future__ import annotations

import pandas as pd

from simulations.experiments.synthetic_data.augmentation import METHODS
from simulations.experiments.synthetic_data.markdown import TIES_RESULTS, count, percent, ties_table
from simulations.runner import read_results, write_results


def ties(seeds: int, tied: dict, zero: dict, distinct: dict) -> pd.DataFrame:
    """tie_shares' rows (method, instances, tied, zero, distinct) for each seed, as ties.csv holds them."""
    return pd.DataFrame([{"method": m, "instances": 500, "tied": tied[m][s], "zero": zero[m][s],
                          "distinct": distinct[m][s], "seed": s} for s in range(seeds) for m in METHODS])


def test_shares_and_counts_read_as_the_docs():
    assert [percent(0.0), percent(0.949), percent(0.0781), percent(1.0)] == ["0 %", "94.9 %", "7.8 %", "100.0 %"]
    assert [count(38.0), count(8 / 3), count(500.0)] == ["38", "2.7", "500"]


def test_the_table_from_two_runs_results_files(tmp_path):
    same = {m: [0.0, 0.0] for m in METHODS}
    accuracy = ties(2, {**same, "knn-ads": [0.95, 0.948], "mc-ads": [0.953, 0.953], "tmc-ds": [0.078, 0.078],
                        "loo": [0.999, 0.999]}, {**same, "knn-ads": [0.878, 0.878], "loo": [0.989, 0.989]},
                    {"knn-ads": [38, 38], "mc-ads": [25, 25], "knn-ds": [500, 500], "tmc-ds": [480, 480],
                     "loo": [2, 3], "random": [500, 500]})
    likelihood = accuracy.assign(tied=accuracy["tied"] / 2)
    write_results(tmp_path / "accuracy", {TIES_RESULTS: accuracy}, "fedvalue run augmentation --results A")
    write_results(tmp_path / "likelihood", {TIES_RESULTS: likelihood}, "fedvalue run augmentation --results L")
    rows = ties_table(read_results(tmp_path / "accuracy" / TIES_RESULTS),
                      read_results(tmp_path / "likelihood" / TIES_RESULTS))
    assert rows == [
        "| method | utility | tied | exactly 0 | distinct values |", "|---|---|---|---|---|",
        "| KNN-ADS (exact) | K-NN likelihood | 94.9 % | 87.8 % | 38 |",
        "| MC-ADS | accuracy (the paper's) | 95.3 % | 0 % | 25 |",
        "| KNN-DS (exact) | K-NN likelihood | 0 % | 0 % | 500 |",
        "| TMC-DS | accuracy | 7.8 % | 0 % | 480 |",
        "| LOO | accuracy | 99.9 % | 98.9 % | 2.5 |",
        "| random | — | 0 % | 0 % | 500 |",
        "| MC-ADS | K-NN likelihood (`--utility likelihood`) | 47.6 % | 0 % | 25 |",
        "| TMC-DS | K-NN likelihood | 3.9 % | 0 % | 480 |",
        "| LOO | K-NN likelihood | 50.0 % | 98.9 % | 2.5 |"]
    assert ties_table(accuracy) == rows[:8]
