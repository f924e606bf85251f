"""The docs' markdown tables of the fairness simulations, rendered from their results files alone.

``fedvalue run fairness --results FOLDER`` writes :data:`FEDERATED_RESULTS` (the frames of
:mod:`simulations.experiments.fairness.tables`) and ``fedvalue run fairness-adult --results FOLDER``
:data:`ADULT_RESULTS`, each headed by the command and the commit; the functions here turn those files into the tables
of docs/reproductions.md, row for row, so a test can hold the docs to the files.
"""

from __future__ import annotations

import math

import pandas as pd

from simulations.experiments.fairness.data import DATASETS

#: The results files of ``fedvalue run fairness --results FOLDER``: file name -> the table it holds.
FEDERATED_RESULTS = {"fairness_tradeoff.csv": "tradeoff", "fairness_comparison.csv": "comparison",
                     "fairness_scoring.csv": "scoring"}
DATASET_NAMES = {"gaussian": "Gaussian", "german": "German credit", "slid": "SLID"}
#: The rules in the docs' order, and their names there.
RULE_NAMES = {"fedavg": "FedAvg", "drop-k": "drop-K first-order", "drop-k-renormalized": "drop-K renormalized",
              "drop-k-curvature": "drop-K curvature", "drop-k-exact": "drop-K exact", "random": "random drop",
              "ijack": "I-JACK"}
#: The first-order scores (tables.SCORED) in the docs' order, and their names there.
SCORE_NAMES = {"first-order": "first-order I^F", "renormalized": "renormalized I^F",
               "curvature-unrenormalized": "curvature I^H", "curvature": "renormalized I^H"}
GAP_COLUMNS = ("accuracy", "dp_gap", "eop_gap", "eo_gap")


def number(value: float, digits: int, signed: bool = False) -> str:
    """``value`` to ``digits`` decimals with the docs' minus sign (−), a + when ``signed``; – for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{'+' if signed else ''}.{digits}f}".replace("-", "−")


def interval_text(row, column: str, digits: int = 3, signed: bool = False) -> str:
    """``mean [low, high]`` of ``column`` (its ``_low`` and ``_high`` beside it)."""
    return (f"{number(row[column], digits, signed)} [{number(row[column + '_low'], digits, signed)}, "
            f"{number(row[column + '_high'], digits, signed)}]")


def _ordered(frame: pd.DataFrame, key: str, order) -> pd.DataFrame:
    """``frame`` by data set (DATASETS' order), then ``key`` in ``order``, keeping the file's order within."""
    rank = {name: i for i, name in enumerate(order)}
    return frame.assign(_d=frame["dataset"].map({d: i for i, d in enumerate(DATASETS)}),
                        _k=frame[key].map(rank)).sort_values(["_d", "_k"], kind="mergesort")


def _rule(policy: str, parameter: float, shown_k: bool) -> str:
    """A rule's name in the tables: drop-K first-order and random drops with their K, I-JACK with its λ, the other
    drop rules with their K when the run has more than one (``shown_k``)."""
    name = RULE_NAMES[policy]
    if policy == "ijack":
        return f"{name} (λ = {parameter:g})"
    if policy in ("drop-k", "random") or (policy != "fedavg" and shown_k):
        return f"{name} (K = {parameter:g})"
    return name


def tradeoff_table(tradeoff: pd.DataFrame) -> list[str]:
    """Report half, mean [interval] over seeds: accuracy and the three gaps of every rule of every data set."""
    drops = tradeoff[tradeoff["policy"].isin(("drop-k", "drop-k-renormalized", "drop-k-curvature", "drop-k-exact"))]
    shown_k = drops["parameter"].nunique() > 1
    rows = ["| data set | rule | accuracy | DP gap | EOP gap | EO gap |", "|---|---|---|---|---|---|"]
    for _, row in _ordered(tradeoff, "policy", RULE_NAMES).iterrows():
        rows.append(f"| {DATASET_NAMES[row['dataset']]} | {_rule(row['policy'], row['parameter'], shown_k)} | "
                    + " | ".join(interval_text(row, column) for column in GAP_COLUMNS) + " |")
    return rows


def _verdict(row) -> str:
    """Whether the rule beats random drops on the DP gap at equal accuracy cost; "no (accuracy)" when its gap is
    lower by an interval excluding 0 but its accuracy is lower too."""
    if bool(row["beats_random_dp"]):
        return "yes"
    return "no (accuracy)" if row["dp_gap_diff_high"] < 0 else "no"


def comparison_table(comparison: pd.DataFrame, k: int, random_k: int, dataset: str | None = None) -> list[str]:
    """Each rule at K = ``k`` (I-JACK at every λ) minus random drops of ``random_k`` clients, paired by seed, with
    the verdict on the DP gap; every data set (a column), or ``dataset``'s rows alone (no such column)."""
    chosen = comparison[(comparison["random_k"] == random_k)
                        & ((comparison["policy"] == "ijack") | (comparison["parameter"] == k))]
    if dataset is not None:
        chosen = chosen[chosen["dataset"] == dataset]
        rows = [f"| rule (K = {k}) − random drops (K = {random_k}) | accuracy | DP gap | EOP gap | EO gap "
                "| beats random (DP) |", "|---|---|---|---|---|---|"]
    else:
        rows = ["| data set | rule | accuracy | DP gap | EOP gap | EO gap | beats random (DP) |",
                "|---|---|---|---|---|---|---|"]
    for _, row in _ordered(chosen, "policy", RULE_NAMES).iterrows():
        name = f"I-JACK λ = {row['parameter']:g}" if row["policy"] == "ijack" else RULE_NAMES[row["policy"]]
        cells = [name, *(interval_text(row, f"{column}_diff", signed=True) for column in GAP_COLUMNS), _verdict(row)]
        if dataset is None:
            cells.insert(0, DATASET_NAMES[row["dataset"]])
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def scoring_table(scoring: pd.DataFrame) -> list[str]:
    """Each first-order score against the exact drop effect: correlation, top = best exact drop, top drop raises
    the gap; mean [interval] over seeds, two decimals."""
    rows = ["| data set | score | correlation | top = best exact drop | top drop raises the gap |",
            "|---|---|---|---|---|"]
    for _, row in _ordered(scoring, "score", SCORE_NAMES).iterrows():
        rows.append(f"| {DATASET_NAMES[row['dataset']]} | {SCORE_NAMES[row['score']]} | "
                    + " | ".join(interval_text(row, column, 2) for column in ("correlation", "top_is_best", "top_raises_gap"))
                    + " |")
    return rows


# -------------------------------------------------------------------------- fedvalue run fairness-adult

#: The results file of ``fedvalue run fairness-adult --results FOLDER``: its summary (adult_ij.adult_summary).
ADULT_RESULTS = "fairness_adult_summary.csv"
#: The edits of the Adult table in the docs' order, their names there, and the first row's longer name.
ADULT_EDITS = {"gradient": "gradient edit", "fair-ij": "Fair-IJ", "ijack": "I-JACK", "simjack": "SIM-JACK",
               "drop-upweight": "drop/upweight"}
ADULT_FIRST = {"lowest-gap": "lowest gap (App. B)", "gradient": "gradient edit (no curvature)"}


def _selection(selection: str, gap: str) -> str:
    """``lowest-gap`` -> lowest gap; ``matched 0.1`` -> DP ≤ 0.10."""
    if selection == "lowest-gap":
        return "lowest gap"
    return f"{gap.upper()} ≤ {float(selection.split()[1]):.2f}"


def adult_table(summary: pd.DataFrame, gap: str = "dp") -> list[str]:
    """[FAIRIJ] on Adult: per selection (lowest validation gap, then each matched target) the plain-gradient edit
    and every Fisher rule that reached it in every seed, test accuracy [interval] and gap, SIM-JACK − Fair-IJ and
    rule − gradient edit in accuracy, paired by seed."""
    rows = [f"| selection | rule | test accuracy | test {gap.upper()} | SIM-JACK − Fair-IJ, accuracy "
            "| rule − gradient edit, accuracy |", "|---|---|---|---|---|---|"]
    shown = summary[summary["edit"].isin(ADULT_EDITS) & (summary["seeds"] == summary["of_seeds"])]
    for selection in dict.fromkeys(shown["selection"]):
        here = shown[shown["selection"] == selection].set_index("edit")
        for edit in [e for e in ADULT_EDITS if e in here.index]:
            row = here.loc[edit]
            first = len(rows) == 2
            versus = [interval_text(row, f"test_accuracy_vs_{name}", signed=True)
                      if f"test_accuracy_vs_{name}" in row and not pd.isna(row[f"test_accuracy_vs_{name}"]) else "—"
                      for name in ("fair_ij", "gradient")]
            rows.append(f"| {ADULT_FIRST[selection] if first else _selection(selection, gap)} | "
                        f"{ADULT_FIRST[edit] if first and edit in ADULT_FIRST else ADULT_EDITS[edit]} | "
                        f"{interval_text(row, 'test_accuracy')} | {number(row[f'test_{gap}_gap'], 3)} | "
                        + " | ".join(versus) + " |")
    return rows
