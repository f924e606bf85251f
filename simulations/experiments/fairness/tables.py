"""The federated fairness study's tables (:mod:`simulations.experiments.fairness.federated`): the trade-off per rule,
the paired comparison of every rule with random drops over seeds, and how well each
first-order score predicts the exact drop effect.

All metrics here are on the *report* half of the held-out rows; every decision of the runs
(the fairness books, the rules' scores, the accuracy books) was taken on the other half.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from fedvalue import Method, Status
from fedvalue.ledger import load_run
from fedvalue.utilities import drop_scores

METRICS = ("accuracy", "dp_gap", "eop_gap", "eo_gap")
#: First-order scores judged against the exact drop effect, and how each is read from a ledger.
SCORED = ("first-order", "renormalized", "curvature-unrenormalized", "curvature")


def interval(values, confidence: float) -> tuple[float, float, float]:
    """Mean and Student-t interval of the mean of ``values`` (NaN bounds for one value)."""
    v = np.asarray(values, dtype=np.float64)
    mean = float(v.mean())
    if len(v) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + confidence / 2, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return mean, mean - half, mean + half


def run_means(per_round: pd.DataFrame, tail: int) -> pd.DataFrame:
    """Per data set, seed and rule: each metric averaged over the last ``tail`` rounds."""
    last = per_round[per_round["round"] > per_round["round"].max() - tail]
    return last.groupby(["dataset", "seed", "policy", "parameter"], sort=False)[list(METRICS)].mean().reset_index()


def tradeoff(per_round: pd.DataFrame, tail: int, confidence: float) -> pd.DataFrame:
    """Per data set and rule: each metric's mean over seeds with its Student-t interval, the
    majority-class accuracy of the report rows, and the accuracy cost and DP-gap reduction
    against FedAvg on the same seeds (paired, with intervals)."""
    runs = run_means(per_round, tail)
    base = runs[runs["policy"] == "fedavg"].set_index(["dataset", "seed"])
    rows = []
    for (dataset, policy, parameter), group in runs.groupby(["dataset", "policy", "parameter"], sort=False):
        row = {"dataset": dataset, "policy": policy, "parameter": parameter, "seeds": len(group)}
        for metric in METRICS:
            row[metric], row[f"{metric}_low"], row[f"{metric}_high"] = interval(group[metric], confidence)
        paired = base.loc[list(zip(group["dataset"], group["seed"]))]
        row["accuracy_cost"], row["accuracy_cost_low"], row["accuracy_cost_high"] = interval(
            paired["accuracy"].to_numpy() - group["accuracy"].to_numpy(), confidence)
        row["dp_gap_reduction"], row["dp_gap_reduction_low"], row["dp_gap_reduction_high"] = interval(
            paired["dp_gap"].to_numpy() - group["dp_gap"].to_numpy(), confidence)
        rows.append(row)
    return pd.DataFrame(rows)


def against_random(per_round: pd.DataFrame, tail: int, confidence: float) -> pd.DataFrame:
    """Every rule (not FedAvg, not random) against dropping K random clients, for each K run,
    paired by seed: the differences rule − random of accuracy and each gap, with intervals.

    ``beats_random``: the rule's gap is below random's by an interval excluding 0 while its
    accuracy is not below random's by an interval excluding 0 (equal accuracy cost, as far
    as the seeds can tell); computed for the study's gap (DP) and reported for EOP and EO."""
    runs = run_means(per_round, tail).set_index(["dataset", "policy", "parameter", "seed"]).sort_index()
    rows = []
    keys = runs.index.droplevel("seed").unique()
    for dataset, policy, parameter in keys:
        if policy in ("fedavg", "random"):
            continue
        rule = runs.loc[(dataset, policy, parameter)]
        for _, random_policy, k in [key for key in keys if key[0] == dataset and key[1] == "random"]:
            rand = runs.loc[(dataset, random_policy, k)]
            seeds = rule.index.intersection(rand.index)
            row = {"dataset": dataset, "policy": policy, "parameter": parameter, "random_k": int(k),
                   "seeds": len(seeds)}
            for metric in METRICS:
                diff = rule.loc[seeds, metric].to_numpy() - rand.loc[seeds, metric].to_numpy()
                row[f"{metric}_diff"], row[f"{metric}_diff_low"], row[f"{metric}_diff_high"] = interval(diff, confidence)
            accuracy_not_worse = not (row["accuracy_diff_high"] < 0)
            for gap in ("dp", "eop", "eo"):
                row[f"beats_random_{gap}"] = bool(row[f"{gap}_gap_diff_high"] < 0 and accuracy_not_worse)
            rows.append(row)
    return pd.DataFrame(rows)


def round_scores(run_dir: Path) -> pd.DataFrame:
    """Per round and valid client of a run's ledger: the exact drop effect (−loo_fairness) and
    every first-order score (:data:`SCORED`), as booked (the renormalized first-order one
    from ``fairness_influence`` and the booked example counts)."""
    ledger = load_run(run_dir).ledger
    ledger = ledger[ledger["status"] == Status.OK]
    wide = ledger.pivot_table(index=["round", "client_id"], columns="method", values="value").reset_index()
    counts = ledger[ledger["method"] == Method.FAIRNESS_INFLUENCE].set_index(["round", "client_id"])["num_examples"]
    wide["num_examples"] = counts.loc[list(zip(wide["round"], wide["client_id"]))].to_numpy(np.float64)
    wide["exact"] = -wide[Method.LOO_FAIRNESS]
    wide["first-order"] = wide[Method.FAIRNESS_INFLUENCE]
    wide["curvature-unrenormalized"] = wide[Method.FAIRNESS_INFLUENCE_CURVATURE]
    wide["curvature"] = wide[Method.FAIRNESS_WEIGHT_DERIVATIVE]
    wide["renormalized"] = np.nan
    for t, group in wide.groupby("round"):
        # The drop rule's own definition of the score (fedvalue.scoring.fairness.curvature.drop_scores).
        derivative = drop_scores("renormalized", influences=dict(zip(group["client_id"], group[Method.FAIRNESS_INFLUENCE])),
                                 weights=dict(zip(group["client_id"], group["num_examples"])))
        wide.loc[group.index, "renormalized"] = [derivative[c] for c in group["client_id"]]
    return wide[["round", "client_id", "exact", *SCORED]]


def scoring(run_dirs: dict[tuple[str, int], Path], confidence: float) -> pd.DataFrame:
    """Each first-order score against the exact drop effect, over the FedAvg runs' rounds.

    Per round: Pearson correlation with the exact effect; whether the client it ranks first
    is the best exact drop; whether dropping that client raised the gap (exact effect < 0);
    and the gap reduction its top drop achieves as a share of the best single drop's.
    Means over rounds per seed, then mean and interval over seeds, per data set."""
    per_seed = []
    for (dataset, seed), run_dir in run_dirs.items():
        scores = round_scores(run_dir)
        rounds = []
        for _, group in scores.groupby("round"):
            if len(group) < 2:
                continue
            exact = group["exact"].to_numpy()
            best = float(exact.max())
            for score in SCORED:
                values = group[score].to_numpy()
                top = int(np.argmax(values))
                rounds.append({"score": score,
                               "correlation": float(np.corrcoef(values, exact)[0, 1]) if values.std() > 0 and
                               exact.std() > 0 else np.nan,
                               "top_is_best": float(exact[top] == best),
                               "top_raises_gap": float(exact[top] < 0),
                               "share_of_best": float(exact[top] / best) if best > 0 else np.nan})
        frame = pd.DataFrame(rounds)
        means = frame.groupby("score", sort=False).mean().reset_index()
        means.insert(0, "seed", seed)
        means.insert(0, "dataset", dataset)
        per_seed.append(means)
    per_seed = pd.concat(per_seed, ignore_index=True)
    rows = []
    for (dataset, score), group in per_seed.groupby(["dataset", "score"], sort=False):
        row = {"dataset": dataset, "score": score, "seeds": len(group)}
        for column in ("correlation", "top_is_best", "top_raises_gap", "share_of_best"):
            row[column], row[f"{column}_low"], row[f"{column}_high"] = interval(group[column].dropna(), confidence)
        rows.append(row)
    return pd.DataFrame(rows)


def verdicts(versus: pd.DataFrame) -> list[str]:
    """One line per data set: which rules beat random drops at equal accuracy cost (DP gap)."""
    lines = []
    for dataset, group in versus.groupby("dataset", sort=False):
        winners = group[group["beats_random_dp"]]
        names = sorted({f"{p} {v:g} (vs random K={k})" for p, v, k in
                        zip(winners["policy"], winners["parameter"], winners["random_k"])})
        lines.append(f"{dataset}: " + (f"beat random drops at equal accuracy cost on the DP gap: {', '.join(names)}"
                                       if names else "no rule beats random drops at equal accuracy cost on the DP gap"))
    return lines
