"""What the benchmark measures of each done cell, and the tables over seeds.

Per cell (a run of one policy on one seed's federation):

``final_accuracy``, ``auc``
    The mean test accuracy over the last ``final_window`` rounds (one round's accuracy swings by
    a few points under label skew), and the mean test accuracy over rounds 1..T (the area under
    the accuracy curve divided by T).
``rounds_to_90``, ``rounds_to_95``, ``seconds_to_90``, ``seconds_to_95``
    The first round whose test accuracy reaches 90% (95%) of the clean federation's final test
    accuracy (as above) (same model and seed, random sampling and FedAvg with every client honest), and the
    wall-clock seconds until that round ended (training, queries, valuation and books; empty when
    never reached).
``steady_seconds_to_90``, ``steady_seconds_to_95``
    The same rounds times the run's median seconds per round: what the run would take on a
    machine nobody else loads (on a shared machine another user's job lengthens a few rounds by
    seconds and the sum with them; the median round is not moved by them).
``bad_trained_share``, ``bad_aggregated_share``
    The share of the training slots (sampled client × round) given to bad clients, and of the
    slots whose reply was aggregated (``selected`` or a positive ``value_weight``; every valid
    reply for the other policies).
``ruled_out_precision``, ``ruled_out_recall``
    For policies whose sampler rules clients out (value-ucb, GreedyFed's negative means):
    after the last round, the share of the ruled-out clients that are bad, and the share of the
    bad clients ruled out.
``rejected_precision``, ``rejected_recall``
    For policies that leave valued replies out of the aggregate (top-k, value weighting): over
    all rounds, the share of left-out replies that came from bad clients, and the share of bad
    clients' replies left out.
``valuation_seconds``, ``round_seconds``
    Mean seconds per round of the valuation alone and of the whole round.
``maverick_accuracy``, ``mavericks_ruled_out``
    With mavericks (classes each held by one honest client alone): the mean test accuracy on
    those classes' test images over the last ``final_window`` rounds, and the share of the
    mavericks the sampler has ruled out after the last round.

:func:`paired_differences` gives the "never worse" test: per seed, a policy's measure minus
random's (or another baseline's) on the same federation (same data, same initial model), the 95% t
interval of the mean difference over seeds and the seeds where the difference is above 0 and below
it; for the rounds to a target, a run that never reached it counts as T + 1 rounds (censored, so
the difference is a bound), and the wall-clock is compared as the ratio policy / random over the
seeds where both reached it.

The tables give each measure's mean over seeds with a 95% interval (mean ± t_{0.975, n−1} s/√n),
and for the time-to-target measures the number of seeds that reached the target (the mean is over
those).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from fedvalue import Method, Status
from fedvalue.ledger import load_run

TARGETS = (0.90, 0.95)
MEASURES = ("final_accuracy", "auc", "rounds_to_90", "rounds_to_95", "seconds_to_90", "seconds_to_95",
            "steady_seconds_to_90", "steady_seconds_to_95",
            "bad_trained_share", "bad_aggregated_share", "ruled_out_precision", "ruled_out_recall",
            "rejected_precision", "rejected_recall", "valuation_seconds", "round_seconds",
            "maverick_accuracy", "mavericks_ruled_out")
#: The measures of the paired test against random, with whether larger is better.
PAIRED = (("final_accuracy", True), ("auc", True), ("rounds_to_95", False), ("steady_seconds_to_95", False))


def time_to_target(curve: pd.DataFrame, target: float) -> tuple[float, float]:
    """(first round whose test accuracy ≥ target, wall-clock seconds until it ended), NaN when never."""
    rounds = curve[curve["round"] > 0].reset_index(drop=True)
    reached = np.flatnonzero(rounds["test_accuracy"].to_numpy() >= target)
    if len(reached) == 0:
        return math.nan, math.nan
    first = int(reached[0])
    return float(rounds["round"].iloc[first]), float(rounds["seconds"].iloc[: first + 1].sum())


def _shares(run, bad: set) -> tuple[float, float]:
    """Bad clients' share of the training slots and of the aggregated slots."""
    trained = [c for clients in run.rounds["clients"].astype(str) for c in clients.split()]
    ledger = run.ledger
    marks = ledger[ledger["method"].isin([Method.SELECTED, Method.VALUE_WEIGHT]) & (ledger["status"] == Status.OK)]
    if len(marks):
        aggregated = marks.loc[pd.to_numeric(marks["value"]) > 0, "client_id"].astype(str).tolist()
    else:
        aggregated = trained
    share = (lambda slots: float(np.mean([c in bad for c in slots])) if slots else math.nan)
    return share(trained), share(aggregated)


def _rejections(run, bad: set) -> tuple[float, float]:
    """Precision and recall of the replies the acceptance left out (NaN without acceptance marks)."""
    ledger = run.ledger
    marks = ledger[ledger["method"].isin([Method.SELECTED, Method.VALUE_WEIGHT]) & (ledger["status"] == Status.OK)]
    if marks.empty:
        return math.nan, math.nan
    out = pd.to_numeric(marks["value"]) <= 0
    is_bad = marks["client_id"].astype(str).isin(bad)
    precision = float((out & is_bad).sum() / out.sum()) if out.any() else math.nan
    recall = float((out & is_bad).sum() / is_bad.sum()) if is_bad.any() else math.nan
    return precision, recall


def _ruled_out(decisions: pd.DataFrame, bad: set, last_round: int, has_view: bool) -> tuple[float, float]:
    if not has_view:
        return math.nan, math.nan
    out = decisions[(decisions["round"] == last_round) & (decisions["decision"] == "ruled_out")]
    final = set(out["client"].astype(str))
    precision = len(final & bad) / len(final) if final else math.nan
    return precision, (len(final & bad) / len(bad) if bad else math.nan)


def final_accuracy(curve: pd.DataFrame, window: int) -> float:
    """Mean test accuracy over the last ``window`` rounds."""
    rounds = curve[curve["round"] > 0]
    return float(rounds["test_accuracy"].iloc[-window:].mean())


def cell_measures(curve: pd.DataFrame, decisions: pd.DataFrame, run_dir, *, bad: Iterable, clean_final: float,
                  has_view: bool, window: int, mavericks: Iterable = ()) -> dict:
    """The measures of one done cell (module docstring); ``clean_final`` is the clean federation's
    final test accuracy (NaN when its run is not done), ``has_view`` whether the policy rules clients
    out, ``mavericks`` the clients that alone hold a class."""
    bad, mavericks = {str(c) for c in bad}, {str(c) for c in mavericks}
    run = load_run(run_dir)
    rounds = curve[curve["round"] > 0]
    measures = {"final_accuracy": final_accuracy(curve, window), "auc": float(rounds["test_accuracy"].mean()),
                "valuation_seconds": float(rounds["valuation_seconds"].mean()),
                "round_seconds": float(rounds["seconds"].mean())}
    for target in TARGETS:
        reached_round, seconds = time_to_target(curve, target * clean_final)
        measures[f"rounds_to_{round(target * 100)}"] = reached_round
        measures[f"seconds_to_{round(target * 100)}"] = seconds
        measures[f"steady_seconds_to_{round(target * 100)}"] = reached_round * float(rounds["seconds"].median())
    measures["bad_trained_share"], measures["bad_aggregated_share"] = _shares(run, bad)
    measures["rejected_precision"], measures["rejected_recall"] = _rejections(run, bad)
    last_round = int(rounds["round"].max())
    measures["ruled_out_precision"], measures["ruled_out_recall"] = _ruled_out(decisions, bad, last_round, has_view)
    measures["maverick_accuracy"] = (float(rounds["maverick_accuracy"].iloc[-window:].mean())
                                     if "maverick_accuracy" in rounds else math.nan)
    measures["mavericks_ruled_out"] = _ruled_out(decisions, mavericks, last_round, has_view)[1]
    return measures


def paired_differences(per_cell: pd.DataFrame, rounds: int, baseline: str = "random") -> pd.DataFrame:
    """Per (model, federation, policy other than ``baseline``): for each :data:`PAIRED` measure the
    mean over seeds of policy − baseline with its 95% half-width and n (``<measure>_diff``,
    ``_diff_ci``, ``_diff_n``) and the seeds where the difference is above and below 0
    (``_diff_above``, ``_diff_below``), and ``seconds_ratio`` (policy / baseline steady seconds to 95%)
    likewise (module docstring)."""
    rows = []
    for (model, fed), group in per_cell.groupby(["model", "federation"], sort=False):
        base = group[group["policy"] == baseline].set_index("seed")
        if base.empty:
            continue
        for policy, runs in group[group["policy"] != baseline].groupby("policy", sort=False):
            runs = runs.set_index("seed")
            seeds = runs.index.intersection(base.index)
            row = {"model": model, "federation": fed, "policy": policy, "baseline": baseline, "seeds": len(seeds)}
            for measure, _ in PAIRED:
                mine, theirs = runs.loc[seeds, measure].astype(float), base.loc[seeds, measure].astype(float)
                if measure == "rounds_to_95":
                    mine, theirs = mine.fillna(rounds + 1), theirs.fillna(rounds + 1)
                differences = mine - theirs
                mean, half, n = interval(differences)
                row.update({f"{measure}_diff": mean, f"{measure}_diff_ci": half, f"{measure}_diff_n": n,
                            f"{measure}_diff_above": int((differences > 0).sum()),
                            f"{measure}_diff_below": int((differences < 0).sum())})
            ratio = (runs.loc[seeds, "steady_seconds_to_95"].astype(float)
                     / base.loc[seeds, "steady_seconds_to_95"].astype(float))
            mean, half, n = interval(ratio)
            row.update({"seconds_ratio": mean, "seconds_ratio_ci": half, "seconds_ratio_n": n})
            rows.append(row)
    return pd.DataFrame(rows)


def detection_by_round(decisions: pd.DataFrame, bad: Iterable, rounds: int) -> pd.DataFrame:
    """Per round 1..``rounds``: precision and recall of the clients ruled out after it (NaN
    precision while none is)."""
    bad = {str(c) for c in bad}
    rows, ruled = [], decisions[decisions["decision"] == "ruled_out"]
    for t in range(1, rounds + 1):
        out = set(ruled.loc[ruled["round"] == t, "client"].astype(str))
        rows.append({"round": t, "ruled_out": len(out),
                     "precision": len(out & bad) / len(out) if out else math.nan,
                     "recall": len(out & bad) / len(bad) if bad else math.nan})
    return pd.DataFrame(rows)


def interval(values: Iterable[float]) -> tuple[float, float, int]:
    """(mean, half-width of the 95% t interval, n) of the finite values (half-width NaN for n < 2)."""
    values = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return float(values[0]), math.nan, 1
    from scipy.stats import t

    return float(values.mean()), float(t.ppf(0.975, n - 1) * values.std(ddof=1) / math.sqrt(n)), n


def summary_table(per_cell: pd.DataFrame) -> pd.DataFrame:
    """Per (model, federation, policy): each measure's mean, 95% half-width and number of seeds
    that have it (``<measure>``, ``<measure>_ci``, ``<measure>_n``), and the seeds run."""
    rows = []
    for (model, fed, policy), group in per_cell.groupby(["model", "federation", "policy"], sort=False):
        row = {"model": model, "federation": fed, "policy": policy, "seeds": len(group)}
        for measure in MEASURES:
            mean, half, n = interval(group[measure])
            row.update({measure: mean, f"{measure}_ci": half, f"{measure}_n": n})
        rows.append(row)
    return pd.DataFrame(rows)


def accuracy_bands(curves: pd.DataFrame, *, by: str = "round", grid: np.ndarray | None = None) -> pd.DataFrame:
    """Mean test accuracy and its 95% half-width over seeds per (model, federation, policy) and
    round (``by="round"``) or wall-clock second on ``grid`` (``by="seconds"``: each seed's accuracy
    as a step function of its elapsed time, the last value carried past its end)."""
    rows = []
    for (model, fed, policy), group in curves.groupby(["model", "federation", "policy"], sort=False):
        if by == "round":
            for x, at in group.groupby("round"):
                mean, half, _ = interval(at["test_accuracy"])
                rows.append({"model": model, "federation": fed, "policy": policy, "x": x, "mean": mean, "ci": half})
            continue
        seeds = []
        for _, seed_curve in group.groupby("seed"):
            elapsed = seed_curve["seconds"].cumsum().to_numpy()
            positions = np.searchsorted(elapsed, grid, side="right") - 1
            seeds.append(seed_curve["test_accuracy"].to_numpy()[np.clip(positions, 0, None)])
        for k, x in enumerate(grid):
            mean, half, _ = interval([s[k] for s in seeds])
            rows.append({"model": model, "federation": fed, "policy": policy, "x": float(x), "mean": mean, "ci": half})
    return pd.DataFrame(rows)
