"""The docs' noisy-federation policy tables, their results files and their rendering from them alone.

``fedvalue run noisy-federation --results FOLDER`` keeps, headed by the command and the commit, the files of
:data:`NOISY_FEDERATION_RESULTS`, made by :func:`results_frames` from what the benchmark wrote to its ``--out``:

``noisy_federation_summary.csv``
    The run's ``summary.csv`` (:func:`~.measures.summary_table`): per model, federation and policy, each measure's
    mean over seeds, its 95% half-width and the number of seeds that have it (``<measure>``, ``_ci``, ``_n``), and
    the seeds run.
``noisy_federation_paired.csv``
    Each policy minus each of :data:`BASELINES`, paired by seed over the run's ``per_cell.csv``
    (:func:`~.measures.paired_differences`: the mean difference, its 95% half-width, n, and the seeds where it is above
    and below 0), the figures the docs' prose quotes beside the tables.

:func:`policy_tables` renders the docs' tables from the summary: one a model and federation, in the file's order, each
under its caption.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from simulations.experiments.noisy_federation.measures import paired_differences

#: The results files of one run, in the order :func:`results_frames` gives them.
NOISY_FEDERATION_RESULTS = ("noisy_federation_summary.csv", "noisy_federation_paired.csv")
#: The policies the paired file subtracts every other policy from, where the run has them.
BASELINES = ("random", "greedyfed", "oracle")
#: The tables' columns, by their names in the docs.
COLUMNS = ("policy", "final acc", "AUC", "rounds to 90%", "rounds to 95%", "s to 90% (steady / measured)",
           "s to 95% (steady / measured)", "bad share of training", "detection precision / recall",
           "valuation s / round")
HEADER = "| " + " | ".join(COLUMNS) + " |"
#: The two kinds of detection: their label in the cell and their measures' prefix (measures.py).
DETECTIONS = (("out", "ruled_out"), ("left out", "rejected"))


def results_frames(out: str | Path) -> dict[str, pd.DataFrame]:
    """The results files of the benchmark in ``out`` (its summary.csv, per_cell.csv and benchmark.json), by name."""
    out = Path(out).expanduser()
    per_cell = pd.read_csv(out / "per_cell.csv")
    rounds = json.loads((out / "benchmark.json").read_text())["rounds"]
    paired = [paired_differences(per_cell, rounds, baseline) for baseline in BASELINES
              if baseline in set(per_cell["policy"])]
    paired = [frame for frame in paired if not frame.empty]
    return dict(zip(NOISY_FEDERATION_RESULTS, (pd.read_csv(out / "summary.csv"),
                                               pd.concat(paired, ignore_index=True) if paired else pd.DataFrame())))


def _number(value: float, digits: int) -> str:
    return f"{value:.{digits}f}".replace("-", "−")


def estimate(value: float, half: float, n: int, seeds: int, digits: int, plus: str = " ± ", none: str = "–") -> str:
    """``value ± half`` to ``digits`` decimals (no ± over one seed), `` (n/seeds)`` after it when fewer than the
    ``seeds`` run have the measure (a target some did not reach); ``none`` when no seed has it."""
    if n == 0:
        return none
    text = _number(value, digits) + ("" if math.isnan(half) else plus + _number(half, digits))
    return text + (f" ({n}/{seeds})" if n < seeds else "")


def _cell(row, measure: str, digits: int, seeds: int) -> str:
    return estimate(row[measure], row[f"{measure}_ci"], int(row[f"{measure}_n"]), seeds, digits)


def _seconds(row, target: int, seeds: int) -> str:
    """Steady / measured seconds to the target; – when no seed reached it."""
    steady, measured = f"steady_seconds_to_{target}", f"seconds_to_{target}"
    if row[f"{steady}_n"] == 0 and row[f"{measured}_n"] == 0:
        return "–"
    return f"{_cell(row, steady, 1, seeds)} / {_cell(row, measured, 1, seeds)}"


def _detection(row, seeds: int) -> str:
    """Precision / recall of the clients a sampler ruled out (out) and of the replies an acceptance policy left out
    (left out), those the policy has; – for neither."""
    kinds = [f"{label} {_cell(row, f'{kind}_precision', 2, seeds)} / {_cell(row, f'{kind}_recall', 2, seeds)}"
             for label, kind in DETECTIONS if row[f"{kind}_precision_n"] > 0 or row[f"{kind}_recall_n"] > 0]
    return "; ".join(kinds) or "–"


def policy_tables(summary: pd.DataFrame, bold: tuple[str, ...] = ()) -> list[str]:
    """The docs' tables, one a (model, federation) of ``summary`` in its order, each under its caption
    (``**mlp, federation p1** (5 seeds)``: the most seeds a policy of it ran, which every count is out of), a blank
    line between; the ``bold`` policies' names in bold."""
    lines = []
    for (model, federation), rows in summary.groupby(["model", "federation"], sort=False):
        seeds = int(rows["seeds"].max())
        if lines:
            lines.append("")
        lines += [f"**{model}, federation {federation}** ({seeds} seeds)", "", HEADER, "|---" * len(COLUMNS) + "|"]
        for _, row in rows.iterrows():
            measures = [_cell(row, measure, digits, seeds) for measure, digits in (
                ("final_accuracy", 3), ("auc", 3), ("rounds_to_90", 1), ("rounds_to_95", 1))]
            cells = [f"**{row['policy']}**" if row["policy"] in bold else row["policy"], *measures,
                     _seconds(row, 90, seeds), _seconds(row, 95, seeds), _cell(row, "bad_trained_share", 2, seeds),
                     _detection(row, seeds), _cell(row, "valuation_seconds", 3, seeds)]
            lines.append("| " + " | ".join(cells) + " |")
    return lines
