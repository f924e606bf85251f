"""The docs' procurement table ([ADS] Figs. 5, 6), its results files and its rendering from them alone.

``fedvalue run procurement --results FOLDER`` keeps, headed by the command and the commit, the files of
:data:`PROCUREMENT_RESULTS`: the AvgErr band per rule and stage, the paired ADS − LOO and ADS − random differences,
each seed's mean AvgErr over stages 1..T per rule, every purchase, and every offer's ADS and LOO value at every state
the runs met (read back from their ledgers: each run books both values for every offer of a stage, so the two rules
can be compared on the same states). :func:`procurement_table` renders the docs' table from one run's files a column
(the default minibatches, then full batch), beside the paper's words.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedvalue.ledger import read_ledger_csv

#: The results files of one run, in the order :func:`procurement_table` takes them.
PROCUREMENT_RESULTS = ("procurement_summary.csv", "procurement_paired.csv", "procurement_per_seed.csv",
                       "procurement_purchases.csv", "procurement_offers.csv")
#: The rules by their names in the table.
RULE_NAMES = {"ads": "ADS", "loo": "LOO", "random": "random"}
#: The paper's column ([ADS] §6.3, Figs. 5 and 6: figures only, no numbers), row by row.
PAPER = ("ADS lowest", "ADS \"consistently\" lower", "lower", "ADS converges faster",
         "ADS buys low-noise more often than LOO", "—")


def offer_values(out: str | Path, seeds, rules) -> pd.DataFrame:
    """Every offer's ADS and LOO value at every stage of every run under ``out`` (``seed-S/RULE/ledger.csv``)."""
    frames = []
    for seed in seeds:
        for rule in rules:
            ledger = read_ledger_csv(Path(out).expanduser() / f"seed-{seed}" / rule / "ledger.csv")
            wide = ledger[ledger["method"].isin(("ads", "loo"))].pivot_table(
                index=["round", "client_id"], columns="method", values="value").reset_index()
            frames.append(wide.rename(columns={"round": "stage", "client_id": "contributor"})
                          .assign(seed=seed, rule=rule)[["seed", "rule", "stage", "contributor", "ads", "loo"]])
    return pd.concat(frames, ignore_index=True)


def results_frames(tables: dict, offers: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The results files of a run, by name, from its tables (procurement.write_outputs) and :func:`offer_values`."""
    errors = tables["avgerr"]
    per_seed = errors[errors["stage"] > 0].groupby(["seed", "rule"], sort=False)["avgerr"].mean().reset_index()
    return dict(zip(PROCUREMENT_RESULTS, (tables["summary"], tables["paired"], per_seed, tables["purchases"], offers)))


def _number(value: float, digits: int) -> str:
    return f"{value:.{digits}f}".replace("-", "−")


def _band(row, digits: int) -> str:
    return f"{_number(row['mean'], digits)} [{_number(row['ci_low'], digits)}, {_number(row['ci_high'], digits)}]"


def _percent(share: float) -> str:
    return "0%" if share == 0 else f"{100 * share:.1f}%"


def _paired(paired: pd.DataFrame, per_seed: pd.DataFrame, second: str, digits: int, counts: bool) -> str:
    """ADS − ``second``: the band of the per-seed difference and the seeds where each was lower (and equal)."""
    row = paired[(paired["first"] == "ads") & (paired["second"] == second)].iloc[0]
    means = per_seed.pivot(index="seed", columns="rule", values="avgerr")
    lower, higher = int((means["ads"] < means[second]).sum()), int((means["ads"] > means[second]).sum())
    seeds, equal = len(means), len(means) - lower - higher
    if not counts:
        return f"{_band(row, digits)}, {lower} of {seeds}"
    text = f"{_band(row, digits)}, ADS lower in {lower} of {seeds} seeds"
    return text + (f", {RULE_NAMES[second]} in {higher}" if higher else "") + (f", {equal} equal" if equal else "")


def _same_states(offers: pd.DataFrame, cleanest: str) -> str:
    """Over every stage of every run: how often each value's top offer is the cleanest, how often the two agree,
    and the median gap between each value's top offer and its runner-up."""
    stages = offers.groupby(["seed", "rule", "stage"], sort=False)
    top = {m: stages.apply(lambda g, m=m: g.loc[g[m].idxmax(), "contributor"]) for m in ("ads", "loo")}
    # each stage's two largest by a numpy sort: Series.nlargest on each of thousands of stages took 20 s a file
    gap = {m: stages[m].apply(lambda v: float(np.diff(np.sort(v.dropna().to_numpy())[-2:])[0])).median()
           for m in ("ads", "loo")}
    return (f"{_percent((top['ads'] == cleanest).mean())} / {_percent((top['loo'] == cleanest).mean())}, "
            f"{_percent((top['ads'] == top['loo']).mean())}, {gap['ads']:.2f} / {gap['loo']:.2f}")


def _column(summary, paired, per_seed, purchases, offers) -> list[str]:
    """One run's cells, row by row."""
    last = summary[summary["stage"] == summary["stage"].max()].set_index("rule")
    early = summary.set_index(["rule", "stage"])["mean"]
    shares = purchases.groupby("rule", sort=False)["noise_share"].value_counts(normalize=True)
    low, high = purchases["noise_share"].min(), purchases["noise_share"].max()
    return [
        ", ".join(f"{RULE_NAMES[r]} {_band(last.loc[r], 2)}" for r in RULE_NAMES if r in last.index),
        _paired(paired, per_seed, "loo", 3, counts=True),
        _paired(paired, per_seed, "random", 2, counts=False),
        "; ".join(f"{RULE_NAMES[r]} " + ", ".join(f"{early[r, s]:.2f}" for s in (1, 2, 3)) for r in ("ads", "loo")),
        ", ".join(f"{RULE_NAMES[r]} {_percent(shares.get((r, low), 0.0))} / {_percent(shares.get((r, high), 0.0))}"
                  for r in RULE_NAMES),
        _same_states(offers, f"c{round(100 * low):02d}"),
    ]


def procurement_table(*frames: pd.DataFrame, columns: tuple[str, ...] = ("minibatches of 10 (default)", "full batch"),
                      confidence: float = 0.9) -> list[str]:
    """The docs' table: the paper's words, then one column a run (``frames``: each run's :data:`PROCUREMENT_RESULTS`
    in order, runs in the order of ``columns``)."""
    runs = [frames[k:k + len(PROCUREMENT_RESULTS)] for k in range(0, len(frames), len(PROCUREMENT_RESULTS))]
    if len(runs) != len(columns):
        raise ValueError(f"columns: expected one name a run ({len(runs)}); got {list(columns)}")
    cells = [_column(*run) for run in runs]
    summary, purchases = runs[0][0], runs[0][3]
    stages, start = int(summary["stage"].max()), summary[summary["stage"] == 0]["mean"].iloc[0]
    low, high = purchases["noise_share"].min(), purchases["noise_share"].max()
    per_rule = int(len(purchases) / purchases["rule"].nunique())
    labels = (f"AvgErr after stage {stages} ({confidence:.0%} bands)",
              f"ADS − LOO, per seed, mean AvgErr over stages 1–{stages} (`paired.csv`)", "ADS − random, same",
              f"AvgErr at stages 1, 2, 3 (start {start:.2f})",
              f"purchases of the {low:.0%} / {high:.0%}-noise offer (Fig. 6; {per_rule} per rule)",
              f"same states: top offer is `c{round(100 * low):02d}` (ADS / LOO), the two agree, median gap top − "
              "runner-up (ADS / LOO)")
    rows = ["| | paper ([ADS] Figs. 5, 6, four LLMs) | " + " | ".join(columns) + " |", "|---" * (2 + len(columns)) + "|"]
    for k, label in enumerate(labels):
        rows.append(f"| {label} | {PAPER[k]} | " + " | ".join(column[k] for column in cells) + " |")
    return rows
