"""The noisy-clients study's results files and its two docs tables, without Ray: the files from made-up study outputs
of the real format (a made-up ledger through the study's own detection, metrics and flagging functions), and the
tables rendered from files holding the docs' current figures, row for row."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from fedvalue import detection_curve, detection_metrics, flagging_rates, summarize_metrics
from simulations.cli.main import main
from simulations.experiments.noisy_clients import study
from simulations.experiments.noisy_clients.markdown import (
    STUDY_RESULTS,
    results_frames,
    study_pair_table,
    study_table,
)
from simulations.runner import read_results, write_results

SEEDS = (5, 6, 7)
#: Final-round accuracy per seed of each (method, k); round 1 is 0.1 lower.
FINAL = {("ads", 3): (0.80, 0.90, 0.85), ("loo", 3): (0.70, 0.80, 0.75), ("random", 3): (0.60, 0.60, 0.60),
         ("ads", 4): (0.81, 0.91, 0.86), ("loo", 4): (0.82, 0.92, 0.87), ("random", 4): (0.50, 0.70, 0.60),
         ("all", 6): (0.75, 0.76, 0.77), ("clean", 6): (0.90, 0.91, 0.92)}


def ledger(clean: bool = False) -> pd.DataFrame:
    """Two rounds of six clients a seed, the first three noisy (none when ``clean``): ADS puts them lowest, LOO the
    first two only."""
    rows = []
    for seed in SEEDS:
        for server_round in (1, 2):
            for i in range(6):
                noisy = i < 3 and not clean
                values = {"ads": -0.03 - 0.01 * i if noisy else 0.01 * i + seed / 1000,
                          "loo": (-0.02 if i < 2 else 0.035) if noisy else 0.01 * i}
                rows += [{"seed": seed, "round": server_round, "client_id": f"{server_round}-{i}", "method": method,
                          "value": value, "status": "ok", "noisy": noisy} for method, value in values.items()]
    return pd.DataFrame(rows)


def study_outputs(out: Path) -> dict:
    """A study's tables as ``write_outputs`` makes them, written into ``out`` as its CSVs."""
    accuracy = pd.DataFrame([{"seed": seed, "method": method, "k": k, "round": server_round,
                              "accuracy": value - (0.1 if server_round == 1 else 0.0)}
                             for (method, k), values in FINAL.items() for seed, value in zip(SEEDS, values)
                             for server_round in (1, 2)])
    noisy = ledger()
    tables = {"accuracy": accuracy, "detection": detection_curve(noisy, methods=study.RANKINGS),
              "metrics": summarize_metrics(detection_metrics(noisy, methods=study.RANKINGS)),
              "flagging": flagging_rates(study.FLAGGING_RULES, [noisy, ledger(clean=True)])}
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        frame.to_csv(out / f"{name}.csv", index=False)
    return {**tables, "timings": {"runs": 1, "rounds": 1.0, "valuation": 0.5}}


def figure(summary: pd.DataFrame, name: str, method: str, **where) -> pd.Series:
    rows = summary[(summary["figure"] == name) & (summary["method"] == method)]
    for column, value in where.items():
        rows = rows[rows[column] == value]
    assert len(rows) == 1, (name, method, where)
    return rows.iloc[0]


def test_the_results_files_from_a_studys_outputs(tmp_path):
    tables = study_outputs(tmp_path / "study")
    frames = results_frames(tmp_path / "study")
    assert list(frames) == list(STUDY_RESULTS)
    write_results(tmp_path / "results", frames, "fedvalue run noisy-clients-study --results results")
    for name in STUDY_RESULTS:
        assert (tmp_path / "results" / name).read_text().startswith(
            "# fedvalue run noisy-clients-study --results results (commit ")
    summary = read_results(tmp_path / "results" / STUDY_RESULTS[0])
    assert (summary["seeds"] == 3).all()
    # the detection curve j = 1..6 per ranking, as the study's detection.csv has it
    detection = summary[summary["figure"] == "detection"]
    assert len(detection) == 3 * 6 and set(detection["j"]) == set(range(1, 7))
    assert figure(summary, "detection", "ads", j=1)["mean"] == pytest.approx(1 / 3)  # a noisy client lowest
    assert figure(summary, "detection", "ads", j=3)["mean"] == pytest.approx(1.0)
    random = tables["detection"].query("method == 'random' and j == 1").iloc[0]
    assert figure(summary, "detection", "random", j=1)[["mean", "ci_low", "ci_high"]].tolist() == pytest.approx(
        random[["mean", "ci_low", "ci_high"]].tolist())
    assert figure(summary, "auc", "ads")["mean"] == pytest.approx(1.0)
    assert figure(summary, "precision_at_k", "loo")["mean"] == pytest.approx(2 / 3)
    assert figure(summary, "auc", "random")["runs"] == 3
    # final accuracy: mean and 1.96 standard errors over the seeds, per ranking and k, and the scored and clean runs
    top3 = figure(summary, "final_accuracy", "ads", k=3)
    half = 1.96 * 0.05 / math.sqrt(3)
    assert [top3["mean"], top3["ci_low"], top3["ci_high"], top3["runs"]] == pytest.approx(
        [0.85, 0.85 - half, 0.85 + half, 3])
    assert figure(summary, "final_accuracy", "random", k=3)["ci_low"] == pytest.approx(0.6)
    assert figure(summary, "final_accuracy", "all", k=6)["mean"] == pytest.approx(0.76)
    assert figure(summary, "final_accuracy", "clean", k=6)["mean"] == pytest.approx(0.91)
    # the flagging rates the prose quotes: the study's flagging.csv, every rule
    flagging = read_results(tmp_path / "results" / STUDY_RESULTS[1])
    assert len(flagging) == len(study.FLAGGING_RULES)
    below_zero = flagging.query("method == 'ads' and kind == 'threshold' and threshold == 0").iloc[0]
    assert below_zero["detection_rate"] == pytest.approx(1.0) and below_zero["false_positive_rate"] == 0
    # and the tables render from them
    rows = study_table(summary)
    assert rows[2] == "| detection at j = 1 | **0.333** [0.333, 0.333] | **0.333** [0.333, 0.333] | " + (
        f"{random['mean']:.3f} (1/6 expected) |")  # both find a noisy client first: tied, both bold
    assert rows[3] == f"| final top-3 accuracy | **0.850 ± {half:.3f}** | 0.750 ± {half:.3f} | 0.600 ± 0.000 |"
    assert rows[4].startswith("| final top-4 accuracy | 0.860 ± ") and "| **0.870 ± " in rows[4]
    assert rows[5].startswith("| ROC AUC (accumulated ranking) | **1.000** | ")
    pair = study_pair_table(summary, summary, columns=("one", "two"))
    assert pair[0] == "| | one: ADS | LOO | random | two: ADS | LOO | random |"
    assert pair[-1] == "| all 6 clients / clean federation | 0.760 / 0.910 | | | 0.760 / 0.910 | | |"


def test_the_study_writes_its_results_files_with_results(tmp_path, monkeypatch):
    """``--results FOLDER`` at the end of a study: its files from the study's outputs (the runs stood in for)."""
    monkeypatch.setattr(study, "run_study", lambda config, out, **_: study_outputs(Path(out)))
    out, results = tmp_path / "study", tmp_path / "results"
    command = ["run", "noisy-clients-study", "--out", str(out), "--seeds", "3", "--results", str(results), "--quiet"]
    assert main(command) == 0
    assert sorted(path.name for path in results.iterdir()) == sorted(STUDY_RESULTS)
    header = (results / STUDY_RESULTS[0]).read_text().split("\n", 1)[0]
    assert header.startswith(f"# fedvalue run noisy-clients-study --out {out} --seeds 3 --results {results} ")
    assert read_results(results / STUDY_RESULTS[0]).equals(results_frames(out)[STUDY_RESULTS[0]].astype(
        {"k": float, "j": float, "runs": int}))


def docs_summary(detection: dict, auc: dict, precision: dict, accuracy: dict, all_clean: tuple[float, float],
                 seeds: int = 20) -> pd.DataFrame:
    """A summary results file's rows holding the figures of one study as the docs quote them: ``detection`` per
    ranking a list (mean, low, high) a j; ``auc`` per ranking (mean, low, high); ``precision`` per ranking its mean;
    ``accuracy`` per (ranking, k) (mean, half-width); the scored run's and the clean run's final accuracy."""
    rows = [{"figure": "detection", "method": m, "j": j, "mean": band[0], "ci_low": band[1], "ci_high": band[2]}
            for m, curve in detection.items() for j, band in enumerate(curve, start=1)]
    rows += [{"figure": "auc", "method": m, "mean": band[0], "ci_low": band[1], "ci_high": band[2]}
             for m, band in auc.items()]
    rows += [{"figure": "precision_at_k", "method": m, "mean": mean} for m, mean in precision.items()]
    rows += [{"figure": "final_accuracy", "method": m, "k": k, "mean": mean, "ci_low": mean - half,
              "ci_high": mean + half} for (m, k), (mean, half) in accuracy.items()]
    rows += [{"figure": "final_accuracy", "method": m, "k": 6, "mean": mean} for m, mean in zip(("all", "clean"),
                                                                                                   all_clean)]
    return pd.DataFrame(rows).assign(runs=seeds, seeds=seeds)


NAN = math.nan
#: The random ranking's figures: seeded, the same in every study of these seeds (its detection curve from the docs'
#: prose, j = 1..6).
RANDOM_DETECTION = [(0.164, NAN, NAN), (0.326, NAN, NAN), (0.51, NAN, NAN), (0.70, NAN, NAN), (0.83, NAN, NAN),
                    (1.0, NAN, NAN)]
RANDOM_AUC, RANDOM_PRECISION = (0.476, NAN, NAN), 0.493
#: A study's figures, as the docs' digits table first quoted them (20 seeds).
DIGITS_FIRST = docs_summary(
    {"ads": [(0.391, 0.367, 0.414), (0.71, NAN, NAN), (0.90, NAN, NAN), (0.98, NAN, NAN), (1, NAN, NAN),
             (1, NAN, NAN)],
     "loo": [(0.279, 0.238, 0.320), (0.48, NAN, NAN), (0.67, NAN, NAN), (0.86, NAN, NAN), (0.94, NAN, NAN),
             (1, NAN, NAN)],
     "random": RANDOM_DETECTION},
    {"ads": (0.972, NAN, NAN), "loo": (0.714, NAN, NAN), "random": RANDOM_AUC},
    {"ads": 0.920, "loo": 0.674, "random": RANDOM_PRECISION},
    {("ads", 3): (0.899, 0.006), ("loo", 3): (0.886, 0.009), ("random", 3): (0.830, 0.019),
     ("ads", 4): (0.899, 0.007), ("loo", 4): (0.893, 0.006), ("random", 4): (0.863, 0.012)},
    (0.885, 0.912))
def test_the_best_of_a_row_is_bold_as_written_ties_and_random_too():
    summary = DIGITS_FIRST.copy()
    auc = summary["figure"] == "auc"
    summary.loc[auc & (summary["method"] == "loo"), "mean"] = 0.9724  # 0.972 as written: tied with ADS
    assert study_table(summary)[-2] == "| ROC AUC (accumulated ranking) | **0.972** | **0.972** | 0.476 |"
    summary.loc[auc & (summary["method"] == "random"), "mean"] = 0.99
    assert study_table(summary)[-2] == "| ROC AUC (accumulated ranking) | 0.972 | 0.972 | **0.990** |"
