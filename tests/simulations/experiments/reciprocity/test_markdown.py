"""The healthcare reciprocity tables, rendered from results files that runs' own figures make: results of the real
type built on made-up flows (no training), written by --results' writer, read back and rendered."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

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


# -------------------------------------------------------------------------- MovieLens, on the docs' own figures

#: The paper's figures as a MovieLens figures file carries them (the ``paper`` column of ``to_frame()``).
MOVIELENS_PAPER_FIGURES = {
    "tracin alpha (single split)": 0.16, "tracin pearson (single split)": 0.89,
    "tracin negative_inflow_share (single split)": 0.007, "tracin negative_outflow_share (single split)": 0.196,
    "tracin alpha (all splits)": 0.58, "tracin pearson (all splits)": 0.98,
    "tracin negative_inflow_share (all splits)": 0.001, "tracin negative_outflow_share (all splits)": 0.08,
    "first_order_discrepancy_p80 (median run)": 0.011, "tracin outflow_snr_p10 (across splits)": 76.0,
    "inference_rmse (mean)": 0.925, "inference_rmse (std)": 0.009, "splits": 10.0, "initializations per split": 10.0,
    "subsample marginal outflow_snr_p90": 0.49}


def movielens_figures(splits: int, initializations: int, rmse: tuple[float, float], single: tuple, every: tuple | None,
                      first_order: float, snr: float, marginal: tuple | None = None) -> pd.DataFrame:
    """A MovieLens figures file's rows: ``single`` and ``every`` are α, Pearson and the negative shares of the single
    split and of all splits, ``marginal`` the subsample's users, Marginal SNR p90, Marginal α and TracIn α."""
    measured = {"splits": splits, "initializations per split": initializations, "inference_rmse (mean)": rmse[0],
                "inference_rmse (std)": rmse[1], "first_order_discrepancy_p80 (median run)": first_order,
                "tracin outflow_snr_p10 (across splits)": snr}
    for averaged, values in (("single split", single), ("all splits", every or single)):
        measured |= {f"tracin {key} ({averaged})": value for key, value in zip(
            ("alpha", "pearson", "negative_inflow_share", "negative_outflow_share"), values)}
    if marginal is not None:
        users, marginal_snr, marginal_alpha, tracin_alpha = marginal
        measured |= {"subsample users": users, "subsample marginal outflow_snr_p90": marginal_snr,
                     "subsample marginal alpha": marginal_alpha, "subsample tracin alpha": tracin_alpha}
    return pd.DataFrame({"metric": list(measured), "measured": list(measured.values()),
                         "paper": [MOVIELENS_PAPER_FIGURES.get(metric, np.nan) for metric in measured]})


def along_training(every: int, last: int, single: tuple, every_split: tuple) -> pd.DataFrame:
    """α along training at every ``every``-th step to ``last``: piecewise linear through (step, α) points."""
    steps = np.arange(every, last + 1, every)
    return pd.DataFrame({"step": steps, "single_split": np.interp(steps, *zip(*single)),
                         "all_splits": np.interp(steps, *zip(*every_split))})


def kept(tmp_path, name: str, frames: dict) -> list[pd.DataFrame]:
    """``frames`` written as one run's results files into ``tmp_path / name`` and read back, in their order."""
    write_results(tmp_path / name, frames, f"fedvalue run reciprocity --dataset movielens --results {name}")
    return [read_results(tmp_path / name / file) for file in frames]


def docs_table(header: str) -> list[str]:
    from tests.test_reproductions_tables import DOC, tables

    return next(table for table in tables(DOC) if table[0] == header)


def prefixes(alphas, initializations, pearsons=None, inflows=None, outflows=None) -> pd.DataFrame:
    count = len(alphas)
    return pd.DataFrame({"splits": range(1, count + 1), "initializations": initializations, "alpha": alphas,
                         "pearson": pearsons or [0.99] * count, "spearman": 0.9,
                         "negative_inflow_share": inflows or [0.0] * count,
                         "negative_outflow_share": outflows or [0.05] * count})


#: The docs' 10 × 10 run over its first k splits, and the 10 × 1 run's α over the first 1, 2, 3 and 10.
TEN_BY_TEN = prefixes([0.247, 0.401, 0.450, 0.489, 0.508, 0.548, 0.572, 0.600, 0.581, 0.598], 10,
                      [0.954, 0.978, 0.982, 0.986, 0.989, 0.989, 0.990, 0.991, 0.991, 0.991], [0.006] + [0.0] * 9,
                      [0.137, 0.076, 0.063, 0.058, 0.058, 0.049, 0.046, 0.036, 0.040, 0.037])
TEN_BY_ONE = prefixes([0.21, 0.40, 0.44, 0.45, 0.47, 0.50, 0.52, 0.55, 0.56, 0.57], 1)


def test_the_movielens_prefix_tables_are_the_docs_from_the_docs_figures(tmp_path):
    from simulations.experiments.reciprocity.markdown import (
        MOVIELENS_PREFIXES,
        movielens_prefix_alphas_table,
        movielens_prefixes_table,
    )

    figures = movielens_figures(10, 10, (0.903, 0.007), (0.247, 0.954, 0.006, 0.137), (0.598, 0.991, 0.0, 0.037),
                                0.0094, 0.39)
    paper, paper_figures = kept(tmp_path, "10x10", {MOVIELENS_PREFIXES: TEN_BY_TEN,
                                                    "reciprocity_movielens_figures.csv": figures})
    rows = movielens_prefixes_table(paper, paper_figures)
    assert rows == docs_table(rows[0])
    (one,) = kept(tmp_path, "10x1", {MOVIELENS_PREFIXES: TEN_BY_ONE})
    rows = movielens_prefix_alphas_table(one, paper)
    assert rows == docs_table(rows[0])
    with pytest.raises(ValueError, match="expected 1 initializations per split; got \\[10\\]"):
        movielens_prefix_alphas_table(paper, paper)


def movielens_columns() -> dict[str, dict]:
    """The docs' four MovieLens runs as results frames: the 10 × 1 run with Marginal, split 0 × 10, 3 × 1 with
    Marginal, the federated 3 × 1 (α along training in rounds of E = 5)."""
    figures = "reciprocity_movielens_figures.csv"
    steps = "reciprocity_movielens_alpha_by_step.csv"
    return {
        "10x1": {figures: movielens_figures(10, 1, (0.902, 0.006), (0.21, 0.95, 0.021, 0.145), (0.57, 0.99, 0.0, 0.042),
                                            0.0095, 0.37, (30, 3.3, 0.68, 0.44)),
                 steps: along_training(10, 1000, ((10, 0.03), (80, 0.65), (1000, 0.21)),
                                       ((10, 0.0), (90, 0.86), (1000, 0.57)))},
        "1x10": {figures: movielens_figures(1, 10, (0.899, 0.004), (0.25, 0.95, 0.006, 0.137), None, 0.0094, np.nan),
                 steps: along_training(10, 1000, ((10, 0.04), (70, 0.6), (1000, 0.25)), ((10, 0.04), (70, 0.6),
                                                                                           (1000, 0.25)))},
        "3x1": {figures: movielens_figures(3, 1, (0.901, 0.005), (0.21, 0.95, 0.021, 0.145), (0.44, 0.98, 0.003, 0.076),
                                           0.0095, 0.38, (30, 7.3, 0.50, 0.31)),
                steps: along_training(10, 1000, ((10, 0.03), (80, 0.65), (1000, 0.21)),
                                      ((10, 0.01), (100, 0.75), (1000, 0.44)))},
        "federated": {figures: movielens_figures(3, 1, (0.901, 0.005), (0.19, 0.95, 0.028, 0.142),
                                                 (0.43, 0.98, 0.004, 0.075), 0.048, 0.39),
                      steps: along_training(2, 200, ((2, 0.05), (18, 0.62), (200, 0.19)),
                                            ((2, 0.01), (20, 0.73), (200, 0.43)))}}


def test_the_movielens_figures_table_is_the_docs_from_the_docs_figures(tmp_path):
    from simulations.experiments.reciprocity.markdown import movielens_figures_table

    frames = [frame for name, files in movielens_columns().items() for frame in kept(tmp_path, name, files)]
    rows = movielens_figures_table(*frames)
    assert rows == docs_table(rows[0])
    with pytest.raises(ValueError, match="split 0: expected a run of 1 splits × 10 initializations; got 10 × 1"):
        movielens_figures_table(*frames[:2], *frames[:2], *frames[4:])
