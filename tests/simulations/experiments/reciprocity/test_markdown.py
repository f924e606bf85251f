"""The healthcare reciprocity tables, rendered from results files that runs' own figures make: results of the real
type built on made-up flows (no training), written by --results' writer, read back and rendered."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedvalue import reciprocity
from simulations.experiments.reciprocity.centralized import CentralizedReciprocityResult
from simulations.experiments.reciprocity.config import ReciprocityConfig
from simulations.experiments.reciprocity.markdown import (
    half_loss_table,
    healthcare_figures_table,
    healthcare_table,
    results_frames,
)
from simulations.runner import read_results, write_results


def result(dataset: str, seed: int, **settings) -> CentralizedReciprocityResult:
    """A result as run_centralized_reciprocity returns it, its reports made from seeded made-up flows."""
    config = ReciprocityConfig(dataset=dataset, influence="both", **settings)
    rng = np.random.default_rng(seed)
    reports = {}
    for influence in ("tracin", "marginal"):
        for k, averaging in enumerate(("conditional", "all-splits")):
            inflow = rng.normal(1.0, 0.3, 40)
            reports[influence, averaging] = reciprocity(inflow, inflow * rng.normal(1.0, 0.2 + k / 10, 40), p=0.75)
    snr = pd.DataFrame({"outflow_p50": [0.5, 0.71], "outflow_p90": [1.5, 1.25], "inflow_p50": [0.5, 0.5],
                        "inflow_p90": [1.0, 1.0]}, index=["tracin", "marginal"])
    steps = config.steps_used
    by_step = pd.DataFrame({"step": [steps // 2, steps], "conditional": [0.7, 0.5], "all-splits": [0.6, 0.4]})
    return CentralizedReciprocityResult(config, reports["tracin", "conditional"], reports, pd.DataFrame(index=range(40)),
                                        0, snr, by_step, 0.1, 54.99, 1.0)


def written(tmp_path, name: str, run: CentralizedReciprocityResult) -> pd.DataFrame:
    write_results(tmp_path / name, results_frames([run]), f"fedvalue run reciprocity --results {name}")
    return read_results(tmp_path / name / f"reciprocity_{run.config.dataset}_figures.csv")


def test_the_healthcare_table_from_four_runs(tmp_path):
    runs = {"bc": result("breast-cancer", 0), "bc-zero": result("breast-cancer", 1, initialization="zero"),
            "diabetes": result("diabetes", 2), "diabetes-zero": result("diabetes", 3, initialization="zero")}
    frames = {name: written(tmp_path, name, run) for name, run in runs.items()}
    rows = healthcare_table(*frames.values())
    assert len(rows) == 8 and rows[1] == "|---|---|---|---|---|---|---|---|"
    bc = runs["bc"].reports
    assert rows[2] == (f"| breast cancer | TracIn | average label (default) | **{bc['tracin', 'conditional'].alpha:.3f}** "
                       f"| {bc['tracin', 'all-splits'].alpha:.3f} | 0.93 | {bc['tracin', 'conditional'].pearson:.3f} | "
                       f"{100 * bc['tracin', 'conditional'].negative_inflow_share:.1f}% / "
                       f"{100 * bc['tracin', 'conditional'].negative_outflow_share:.1f}% |")
    assert [row.split(" | ")[:3] for row in rows[3:]] == [
        ["| breast cancer", "TracIn", "zero"], ["| breast cancer", "Marginal", "average label"],
        ["| diabetes", "TracIn", "average label (default)"], ["| diabetes", "TracIn", "zero"],
        ["| diabetes", "Marginal", "average label"]]
    assert rows[4].split(" | ")[5] == "0.48" and rows[7].split(" | ")[5] == "0.36"


def test_the_figures_and_half_loss_tables(tmp_path):
    bc, diabetes = result("breast-cancer", 0), result("diabetes", 2)
    long = result("diabetes", 4, steps=1000)
    half, half_long = result("diabetes", 5, squared_loss="half"), result("diabetes", 6, steps=1000, squared_loss="half")
    frames = [written(tmp_path, name, run) for name, run in
              (("bc", bc), ("d", diabetes), ("d1000", long), ("half", half), ("half1000", half_long))]
    figures = healthcare_figures_table(*frames[:3])
    assert figures[2] == ("| 90th percentile of the Marginal outflow SNR (workshop §5.2.1), breast cancer / diabetes "
                          "| 0.58 / 0.55 | 1.25 / 1.25 |")
    short, trained = diabetes.reports["tracin", "conditional"].alpha, long.reports["tracin", "conditional"].alpha
    assert figures[4].split(" | ")[1:3] == ["0.76 → 0.20", f"{short:.2f} → {trained:.2f} (all-splits "
                                            f"{diabetes.reports['tracin', 'all-splits'].alpha:.2f} → "
                                            f"{long.reports['tracin', 'all-splits'].alpha:.2f}) |"]
    assert figures[5].endswith("| — | 0.10 / 0.10 |")
    loss = half_loss_table(frames[1], frames[3], frames[2], frames[4])
    assert loss[0] == "| figure | paper | ℓ = (f − y)² (default) | ℓ = ½(f − y)² |"
    assert loss[2].startswith(f"| TracIn α(0.75), T = 200 | 0.76 | {short:.3f} (") and " | **" in loss[2]
    assert loss[5].startswith("| TracIn α(0.75) after 1,000 steps (workshop Fig. 6) | 0.20 | ")
    assert loss[6] == "| inference RMSE, T = 200 | — | 54.99 | 54.99 |"
