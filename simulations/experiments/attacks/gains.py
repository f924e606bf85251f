"""Manipulation gain and what it costs: the study's tables from each run's totals.

For attack a, book b (a ledger method summed over the rounds) and seed s, with I the attacker's
identities and J the honest seats they stand for (:mod:`.plan`):

    A_s = Σ_{i∈I} Φ_b(i) in the attack's run,   H_s = Σ_{j∈J} Φ_b(j) in the ``none`` run (same seed,
    data and strategy),   gain = mean_s A_s / mean_s H_s,

1.0 = what the participant earns honestly. The interval is a 95% percentile bootstrap over
seeds (2000 resamples of the seeds, the same for every book; seeded). A gain is only
meaningful when the honest earnings are clearly positive: ``honest_positive`` says whether the
bootstrap interval of mean_s H_s lies above 0 (LOO of interchangeable IID updates is about 0,
and a ratio to it says nothing). A defended book b' is
compared with the defended honest run (what the participant earns honestly with the defences
on). Payment: the share of a budget of 1 paid to I under ``share-of-positive`` with floor 0
(:mod:`fedvalue.analysis.payout`), against J's share in the ``none`` run. Accuracy change: the
final held-out accuracy of the run minus the ``none`` run's, mean over seeds with its bootstrap
interval. The cost of the defences to honest clients is read off the ``none`` runs: each honest
client's paid share with the defences against without.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedvalue import paid_share

#: Plain book -> its defended counterpart.
BOOKS = {"ads": "ads_defended", "loo": "loo_defended", "tracin_outflow": "tracin_outflow_defended"}
RESAMPLES = 2000
KEYS = ["partition", "strategy"]


def _members(text) -> list[int]:
    """Client ids from runs.csv's space-separated list (a CSV reader may have made one id a float,
    and an empty list NaN)."""
    if isinstance(text, float) and text != text:
        return []
    return [int(float(part)) for part in str(text).split()]


def ratio_interval(attacked: np.ndarray, honest: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """(mean attacked / mean honest, 2.5% and 97.5% bootstrap percentiles over the paired seeds)."""
    attacked, honest = np.asarray(attacked, float), np.asarray(honest, float)
    point = float(attacked.mean() / honest.mean()) if honest.mean() != 0 else float("nan")
    if len(attacked) < 2:
        return point, float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, len(attacked), size=(RESAMPLES, len(attacked)))
    with np.errstate(all="ignore"):
        ratios = attacked[picks].mean(axis=1) / honest[picks].mean(axis=1)
    low, high = np.nanpercentile(ratios, [2.5, 97.5])
    return point, float(low), float(high)


def mean_interval(values: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    values = np.asarray(values, float)
    if len(values) < 2:
        return float(values.mean()), float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, len(values), size=(RESAMPLES, len(values)))
    low, high = np.percentile(values[picks].mean(axis=1), [2.5, 97.5])
    return float(values.mean()), float(low), float(high)


def _per_seed(totals: pd.DataFrame, runs: pd.DataFrame, attack: str, book: str) -> pd.DataFrame:
    """Per seed of one (partition, strategy): the identities' sum, the seats' honest sum, paid shares."""
    rows = []
    for _, run in runs[runs["attack"] == attack].iterrows():
        mine = totals[(totals["seed"] == run["seed"]) & (totals["attack"] == attack)].set_index("client_id")[book]
        honest = totals[(totals["seed"] == run["seed"]) & (totals["attack"] == "none")].set_index("client_id")[book]
        identities, seats = _members(run["identities"]), _members(run["seats"])
        rows.append({"seed": run["seed"], "attacked": float(mine.reindex(identities).sum()),
                     "honest": float(honest.reindex(seats).sum()),
                     "paid": paid_share(mine, identities), "paid_honest": paid_share(honest, seats)})
    return pd.DataFrame(rows)


def gains_table(totals: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """A row per (partition, strategy, attack, book): gain without and with the defences (and
    intervals), paid shares, and the accuracy change (module docstring)."""
    rows = []
    for (scheme, strategy), group in runs.groupby(KEYS, sort=False):
        part = totals[(totals["partition"] == scheme) & (totals["strategy"] == strategy)]
        baseline = group[group["attack"] == "none"].set_index("seed")["accuracy"]
        for attack in [a for a in dict.fromkeys(group["attack"]) if a != "none"]:
            mine = group[group["attack"] == attack].set_index("seed")["accuracy"]
            change = mean_interval((mine - baseline.reindex(mine.index)).dropna().to_numpy())
            for plain, defended in BOOKS.items():
                row = {"partition": scheme, "strategy": strategy, "attack": attack, "book": plain,
                       "seeds": len(mine)}
                for label, book in (("", plain), ("defended_", defended)):
                    seeds = _per_seed(part, group, attack, book)
                    gain, low, high = ratio_interval(seeds["attacked"].to_numpy(), seeds["honest"].to_numpy())
                    honest_low = mean_interval(seeds["honest"].to_numpy())[1]
                    row |= {f"{label}gain": gain, f"{label}gain_low": low, f"{label}gain_high": high,
                            f"{label}honest_positive": bool(seeds["honest"].mean() > 0 and not honest_low <= 0),
                            f"{label}paid": seeds["paid"].mean(), f"{label}paid_honest": seeds["paid_honest"].mean()}
                row |= {"accuracy_change": change[0], "accuracy_change_low": change[1],
                        "accuracy_change_high": change[2]}
                rows.append(row)
    return pd.DataFrame(rows)


def honest_cost(totals: pd.DataFrame) -> pd.DataFrame:
    """Per (partition, strategy, book), in the attack-free runs: the mean and largest change of an
    honest client's paid share (budget 1) when the defences are on, and the free-rider flags raised."""
    rows = []
    clean = totals[totals["attack"] == "none"]
    for (scheme, strategy), group in clean.groupby(KEYS, sort=False):
        for plain, defended in BOOKS.items():
            changes = []
            for _, run in group.groupby("seed"):
                shares = {book: {c: paid_share(run.set_index("client_id")[book], [c]) for c in run["client_id"]}
                          for book in (plain, defended)}
                changes += [shares[defended][c] - shares[plain][c] for c in run["client_id"]]
            changes = np.abs(np.asarray(changes))
            rows.append({"partition": scheme, "strategy": strategy, "book": plain,
                         "mean_share_change": float(changes.mean()), "max_share_change": float(changes.max()),
                         "free_rider_flags": int(group["defence_free_rider"].sum())})
    return pd.DataFrame(rows)
