"""The docs' ties table of ``fedvalue run augmentation`` ([ADS] Figure 2's runs), rendered from results files alone.

``fedvalue run augmentation --results FOLDER`` keeps ``ties.csv`` (per seed and method: the share of synthetic
values tied with another, the share exactly 0, the number of distinct values) as :data:`TIES_RESULTS`, headed by the
command and the commit; :func:`ties_table` renders the docs' table from the run under the accuracy utility and,
beside it, the retrained methods of the run under the K-NN likelihood (the exact methods and random do not depend on
the utility).
"""

from __future__ import annotations

import pandas as pd

TIES_RESULTS = "augmentation_ties.csv"
#: Methods in the docs' order and their names there.
METHOD_NAMES = {"knn-ads": "KNN-ADS (exact)", "mc-ads": "MC-ADS", "knn-ds": "KNN-DS (exact)", "tmc-ds": "TMC-DS",
                "loo": "LOO", "random": "random"}
#: Methods valued on the K-NN surrogate whatever ``--utility`` says, and the one that values nothing.
EXACT, UNVALUED = ("knn-ads", "knn-ds"), ("random",)
#: The retrained methods' utility in the docs, and how its first row says where it comes from.
UTILITY_NAMES = {"accuracy": ("accuracy", "accuracy (the paper's)"),
                 "likelihood": ("K-NN likelihood", "K-NN likelihood (`--utility likelihood`)")}


def percent(share: float) -> str:
    """A share as the docs write it: one decimal, 0 as ``0 %``."""
    return "0 %" if share == 0 else f"{100 * share:.1f} %"


def count(value: float) -> str:
    """A mean count, one decimal unless whole."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _rows(ties: pd.DataFrame, utility: str, methods) -> list[str]:
    mean = ties.groupby("method", sort=False)[["tied", "zero", "distinct"]].mean()
    rows, named = [], False
    for method in [m for m in METHOD_NAMES if m in methods and m in mean.index]:
        if method in EXACT:
            used = "K-NN likelihood"
        elif method in UNVALUED:
            used = "—"
        else:
            used, named = UTILITY_NAMES[utility][0 if named else 1], True
        row = mean.loc[method]
        rows.append(f"| {METHOD_NAMES[method]} | {used} | {percent(row['tied'])} | {percent(row['zero'])} | "
                    f"{count(row['distinct'])} |")
    return rows


def ties_table(accuracy: pd.DataFrame, likelihood: pd.DataFrame | None = None) -> list[str]:
    """The docs' ties table: mean over seeds of every method's tie shares under the accuracy utility, then the
    retrained methods' under the K-NN likelihood."""
    rows = ["| method | utility | tied | exactly 0 | distinct values |", "|---|---|---|---|---|"]
    rows += _rows(accuracy, "accuracy", METHOD_NAMES)
    if likelihood is not None:
        rows += _rows(likelihood, "likelihood", [m for m in METHOD_NAMES if m not in (*EXACT, *UNVALUED)])
    return rows
