"""The docs' two tables of the [ADS] noisy-clients study, their results files and their rendering from them alone.

``fedvalue run noisy-clients-study --results FOLDER`` keeps, headed by the command and the commit, the files of
:data:`STUDY_RESULTS`, made from the study's own outputs in ``--out`` (:func:`results_frames`):

``noisy_clients_study_summary.csv``  one row a figure (:func:`summary_frame`): ``figure`` is ``detection`` (the
    cumulative detection curve at ``j`` = 1..n, per ranking), ``auc`` and ``precision_at_k`` (of the accumulated
    ranking, per ranking), or ``final_accuracy`` (the last round's held-out accuracy: the top-``k`` retrains per
    ranking, the scored run ``all`` and the clean run ``clean``, whose ``k`` is the round's size); ``mean``,
    ``ci_low``, ``ci_high`` (95% over seeds: the study's intervals for detection, AUC and precision, the figure's
    1.96 standard errors for accuracy), ``runs`` (the seeds a figure averages) and ``seeds`` (the study's);
``noisy_clients_study_flagging.csv``  the study's ``flagging.csv``: per online flagging rule, its false-positive rate
    on the clean runs and its detection rate on the noisy runs, with intervals.

:func:`study_table` renders the docs' table of one study; :func:`study_pair_table` two studies side by side. In
each row of a study the highest mean of ADS, LOO and random, as the table writes it, is bold (every one tied for it);
the random ranking's detection is the seeded random baseline measured like the others (expected j/n over a round's n
clients, which the one-study table says beside it).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

#: The results files of one study, in the order :func:`results_frames` makes them.
STUDY_RESULTS = ("noisy_clients_study_summary.csv", "noisy_clients_study_flagging.csv")
#: The rankings in the tables' order and their names there.
RANKING_NAMES = {"ads": "ADS", "loo": "LOO", "random": "random"}
#: The summary's columns.
SUMMARY_COLUMNS = ("figure", "method", "k", "j", "mean", "ci_low", "ci_high", "runs", "seeds")


def mean_half_width(values: pd.Series) -> tuple[float, float]:
    """Mean and half-width of the 95% normal interval over ``values`` (1.96 standard errors; 0 for one value):
    the bands of the study's Figure 4."""
    values = values.dropna()
    if len(values) < 2:
        return float(values.mean()), 0.0
    return float(values.mean()), float(1.96 * values.std(ddof=1) / np.sqrt(len(values)))


def summary_frame(accuracy: pd.DataFrame, detection: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    """The summary results file (module docstring) from the study's ``accuracy.csv``, ``detection.csv`` and
    ``metrics.csv`` frames."""
    seeds = int(accuracy["seed"].nunique())
    rows = [{"figure": "detection", "method": row["method"], "j": int(row["j"]), "mean": row["mean"],
             "ci_low": row["ci_low"], "ci_high": row["ci_high"], "runs": int(row["n_runs"])}
            for _, row in detection.iterrows()]
    rows += [{"figure": figure, "method": row["method"], "mean": row[f"{figure}_mean"],
              "ci_low": row[f"{figure}_ci_low"], "ci_high": row[f"{figure}_ci_high"], "runs": int(row["n_runs"])}
             for figure in ("auc", "precision_at_k") for _, row in metrics.iterrows()]
    last = accuracy[accuracy["round"] == accuracy["round"].max()]
    order = [*RANKING_NAMES, *(m for m in dict.fromkeys(last["method"]) if m not in RANKING_NAMES)]
    for method in [m for m in order if m in set(last["method"])]:
        for k, rows_k in last[last["method"] == method].groupby("k", sort=True):
            mean, half = mean_half_width(rows_k["accuracy"])
            half = half if rows_k["accuracy"].notna().sum() > 1 else math.nan
            rows.append({"figure": "final_accuracy", "method": method, "k": int(k), "mean": mean,
                         "ci_low": mean - half, "ci_high": mean + half, "runs": int(rows_k["seed"].nunique())})
    frame = pd.DataFrame(rows, columns=SUMMARY_COLUMNS).assign(seeds=seeds)
    return frame.astype({"k": "Int64", "j": "Int64", "runs": "Int64"})


def results_frames(out: str | Path) -> dict[str, pd.DataFrame]:
    """The results files of the study in ``out`` (its ``accuracy.csv``, ``detection.csv``, ``metrics.csv`` and
    ``flagging.csv``), by name."""
    out = Path(out).expanduser()
    read = {name: pd.read_csv(out / f"{name}.csv") for name in ("accuracy", "detection", "metrics", "flagging")}
    return dict(zip(STUDY_RESULTS, (summary_frame(read["accuracy"], read["detection"], read["metrics"]),
                                    read["flagging"])))


def _figure(summary: pd.DataFrame, figure: str, method: str, **where) -> pd.Series:
    rows = summary[(summary["figure"] == figure) & (summary["method"] == method)]
    for column, value in where.items():
        rows = rows[rows[column] == value]
    if len(rows) != 1:
        raise ValueError(f"summary: expected one row of figure {figure!r}, method {method!r} {where}; "
                         f"got {len(rows)}. Is it a noisy_clients_study_summary.csv?")
    return rows.iloc[0]


def _number(value: float) -> str:
    return f"{value:.3f}"


def _interval(row: pd.Series) -> str:
    return "" if pd.isna(row["ci_low"]) else f" [{_number(row['ci_low'])}, {_number(row['ci_high'])}]"


def _plus_minus(row: pd.Series) -> str:
    half = (row["ci_high"] - row["ci_low"]) / 2
    return _number(row["mean"]) + ("" if pd.isna(half) else f" ± {_number(half)}")


def _bold(texts: dict[str, str], means: dict[str, float], whole: bool) -> dict[str, str]:
    """``texts`` with the highest of ``means`` (as written) bold: the whole cell, or its leading mean."""
    best = max(_number(m) for m in means.values())
    bold = {}
    for method, text in texts.items():
        if _number(means[method]) != best:
            bold[method] = text
        elif whole:
            bold[method] = f"**{text}**"
        else:
            head = _number(means[method])
            bold[method] = f"**{head}**{text[len(head):]}"
    return bold


def _cells(summary: pd.DataFrame, figure: str, *, interval: tuple[str, ...] = (), accuracy: bool = False,
           **where) -> list[str]:
    """One row's cells of a study, ADS, LOO, random: the mean, with its interval for the methods in ``interval``
    (``accuracy``: mean ± half-width for every method), the best bold."""
    rows = {m: _figure(summary, figure, m, **where) for m in RANKING_NAMES}
    if accuracy:
        texts = {m: _plus_minus(row) for m, row in rows.items()}
    else:
        texts = {m: _number(row["mean"]) + (_interval(row) if m in interval else "") for m, row in rows.items()}
    return list(_bold(texts, {m: row["mean"] for m, row in rows.items()}, whole=accuracy).values())


def _ks(summary: pd.DataFrame) -> list[int]:
    rows = summary[(summary["figure"] == "final_accuracy") & summary["method"].isin(RANKING_NAMES)]
    return sorted(int(k) for k in rows["k"].unique())


def _row(label: str, cells: list[str]) -> str:
    return f"| {label} |" + "".join(f" {cell} |" if cell else " |" for cell in cells)


def study_table(summary: pd.DataFrame) -> list[str]:
    """The docs' table of one study (its summary results file): detection at j = 1 with its interval (random beside
    the j/n it is expected to be), the final top-k accuracies ± their half-widths, AUC and precision@K."""
    clients = int(summary.loc[summary["figure"] == "detection", "j"].max())
    detection = _cells(summary, "detection", interval=("ads", "loo"), j=1)
    detection[-1] += f" (1/{clients} expected)"
    rows = ["| | " + " | ".join(RANKING_NAMES.values()) + " |", "|---" * (1 + len(RANKING_NAMES)) + "|",
            _row("detection at j = 1", detection)]
    rows += [_row(f"final top-{k} accuracy", _cells(summary, "final_accuracy", accuracy=True, k=k))
             for k in _ks(summary)]
    rows += [_row("ROC AUC (accumulated ranking)", _cells(summary, "auc")),
             _row("precision@K", _cells(summary, "precision_at_k"))]
    return rows


def _clients(summary: pd.DataFrame) -> int:
    return int(_figure(summary, "final_accuracy", "all")["k"])


def study_pair_table(*summaries: pd.DataFrame,
                     columns: tuple[str, ...] = ("Fashion-MNIST, paper's protocol", "digits stand-in")) -> list[str]:
    """The docs' table of studies side by side (``summaries``: each study's summary results file, in the order of
    ``columns``): detection at j = 1 and 2 and AUC with intervals for ADS and LOO, precision@K, the final top-k
    accuracies ± their half-widths, and the scored run's and the clean run's final accuracy."""
    if len(summaries) != len(columns):
        raise ValueError(f"columns: expected one name a study ({len(summaries)}); got {list(columns)}")
    clients = {_clients(summary) for summary in summaries}
    if len(clients) != 1:
        raise ValueError(f"summaries: expected studies of one round size, for the row 'all N clients'; got "
                         f"{sorted(clients)}")
    rows = ["| | " + " | ".join(f"{name}: {RANKING_NAMES['ads']} | " + " | ".join(list(RANKING_NAMES.values())[1:])
                                for name in columns) + " |",
            "|---" * (1 + len(RANKING_NAMES) * len(summaries)) + "|"]

    def row(label: str, cells) -> None:
        rows.append(_row(label, [cell for summary in summaries for cell in cells(summary)]))

    for j in (1, 2):
        row(f"detection at j = {j}", lambda s, j=j: _cells(s, "detection", interval=("ads", "loo"), j=j))
    row("ROC AUC (accumulated ranking)", lambda s: _cells(s, "auc", interval=("ads", "loo")))
    row("precision@K", lambda s: _cells(s, "precision_at_k"))
    for k in _ks(summaries[0]):
        row(f"final top-{k} accuracy", lambda s, k=k: _cells(s, "final_accuracy", accuracy=True, k=k))
    row(f"all {clients.pop()} clients / clean federation", lambda s: [
        f"{_number(_figure(s, 'final_accuracy', 'all')['mean'])} / {_number(_figure(s, 'final_accuracy', 'clean')['mean'])}",
        "", ""])
    return rows
