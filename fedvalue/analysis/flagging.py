"""Online flagging of suspicious clients from the valuation ledger, as rounds arrive.

Scores come from a ledger frame (:mod:`fedvalue.run.ledger_tables`); lower is more suspicious.

Online flagging (:class:`FlaggingRule`)
    ``kind="robust_z"``: per round, over the round's valued clients,
    z_i = (φ_t(i) − med) / (1.4826·MAD) with med the median and MAD the median absolute
    deviation of the round's scores; when MAD = 0 the mean absolute deviation is used,
    z_i = (φ_t(i) − med) / (1.2533·MeanAD); when both are 0 every z_i = 0. The scale is
    taken within the round because within-round scores shrink as the model converges.
    A client is flagged once z_i < −threshold in ``patience`` consecutive rounds in which
    it was valued. ``kind="threshold"``: flagged once its accumulated Φ_i so far is below
    ``threshold`` after ``patience`` consecutive rounds in which it was valued.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from fedvalue._checks import check_choice, check_integer, check_number, check_open_unit
from fedvalue.analysis._ledger_frames import (
    RANDOM,
    RUN_COLUMN,
    _check_ledger,
    _check_ledger_like,
    _check_methods,
    _interval,
    _noisy_of,
    _runs,
    _valued,
)
from fedvalue.schema import Method, Status, client_sort_key

FLAGGING_KINDS = ("robust_z", "threshold")
#: 1 / Φ^{-1}(3/4): makes the MAD a consistent estimator of a normal standard deviation.
MAD_SCALE = 1.482602218505602
#: sqrt(π / 2): the same for the mean absolute deviation.
MEAN_AD_SCALE = 1.2533141373155001


# ----------------------------------------------------------------------------- online flagging


def robust_z(values: Sequence[float]) -> np.ndarray:
    """Robust z-scores (v − median) / (1.4826·MAD); MeanAD·1.2533 when MAD = 0; zeros when both are 0."""
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or not np.isfinite(values).all():
        raise ValueError(f"values: expected a 1-d array of finite numbers; got {values.tolist()}.")
    if len(values) == 0:
        return values
    deviation = values - np.median(values)
    mad = float(np.median(np.abs(deviation)))
    if mad > 0:
        return deviation / (MAD_SCALE * mad)
    mean_ad = float(np.mean(np.abs(deviation)))
    if mean_ad > 0:
        return deviation / (MEAN_AD_SCALE * mean_ad)
    return np.zeros_like(values)


class FlaggingRule:
    """Online flagging of suspicious clients as rounds arrive (deterministic).

    Parameters
    ----------
    method
        Ledger method whose within-round values are judged (``"ads"``, ``"loo"``, ...).
    kind
        ``"robust_z"``: round-wise robust z-score z_t(i) (module docstring) below
        −``threshold``; ``"threshold"``: accumulated value Φ_i so far below ``threshold``.
    threshold
        For ``robust_z`` a positive number (default 1.0); for ``threshold`` any finite
        value in the units of the method (e.g. 0.0: a client whose books are negative).
    patience
        Consecutive rounds in which the client was valued (status ok) and met the
        condition before it is flagged (≥ 1). A valued round that does not meet it resets
        the count; rounds in which it was not sampled, failed, or (robust_z) that had
        fewer than ``min_clients`` valued clients leave the count unchanged.
    min_clients
        Least number of valued clients for a round's robust z-scores to count (≥ 2).

    Notes
    -----
    Flags are permanent. ``update`` takes one round's ledger rows (DataFrame or iterable
    of row mappings, as the valuing strategy books them); rounds must arrive in increasing
    order. The defaults are not calibrated: measure a setting with :func:`evaluate_flagging`.
    """

    def __init__(self, method: str = Method.ADS, *, kind: str = "robust_z", threshold: float = 1.0,
                 patience: int = 2, min_clients: int = 3) -> None:
        if not isinstance(method, str) or not method or method == RANDOM:
            raise ValueError(f"method: expected the name of a ledger method such as 'ads'; got {method!r}.")
        self.kind = check_choice("kind", kind, FLAGGING_KINDS)
        check_number("threshold", threshold)
        if self.kind == "robust_z" and threshold <= 0:
            raise ValueError(f"threshold: expected a number > 0 for kind='robust_z' (clients with z < −threshold "
                             f"are suspicious); got {threshold!r}.")
        self.method = method
        self.threshold = float(threshold)
        self.patience = check_integer("patience", patience, 1)
        self.min_clients = check_integer("min_clients", min_clients, 2)
        self.reset()

    def __repr__(self) -> str:
        return (f"FlaggingRule(method={self.method!r}, kind={self.kind!r}, threshold={self.threshold!r}, "
                f"patience={self.patience!r}, min_clients={self.min_clients!r})")

    def reset(self) -> None:
        """Forget every round seen."""
        self._flagged_at: dict[Hashable, object] = {}
        self.streaks: dict[Hashable, int] = {}
        self.totals: dict[Hashable, float] = {}
        self.last_round: object = None
        self.last_scores: dict[Hashable, float] = {}

    def clone(self) -> FlaggingRule:
        """A fresh rule with the same parameters."""
        return FlaggingRule(self.method, kind=self.kind, threshold=self.threshold, patience=self.patience,
                            min_clients=self.min_clients)

    @property
    def flagged(self) -> frozenset:
        """Every client flagged so far."""
        return frozenset(self._flagged_at)

    @property
    def flagged_at(self) -> dict:
        """Client id -> the round in which it was flagged."""
        return dict(self._flagged_at)

    def update(self, round_frame: pd.DataFrame | Iterable[Mapping[str, object]]) -> set:
        """Take one round's rows; return the set of clients newly flagged by it."""
        frame = round_frame if isinstance(round_frame, pd.DataFrame) else pd.DataFrame(list(round_frame))
        _check_ledger_like(frame, ("round", "client_id", "method", "value", "status"), "round_frame")
        rounds = pd.unique(frame["round"])
        if len(rounds) != 1:
            raise ValueError(f"round_frame: expected the rows of one round; got rounds {sorted(rounds.tolist())}.")
        server_round = rounds[0]
        if RUN_COLUMN in frame.columns and frame[RUN_COLUMN].nunique(dropna=False) > 1:
            raise ValueError(f"round_frame: expected the rows of one run; got several '{RUN_COLUMN}' values.")
        if self.last_round is not None and not server_round > self.last_round:
            raise ValueError(f"round_frame['round']: expected a round after {self.last_round!r}; got {server_round!r}.")
        rows = frame[frame["method"] == self.method]
        if rows.empty:
            raise ValueError(f"method: expected {self.method!r} among round_frame's methods "
                             f"{sorted(set(frame['method']))}; got no rows for it.")
        ok = rows[rows["status"] == Status.OK]
        if ok["client_id"].duplicated().any():
            raise ValueError(f"round_frame: expected one {self.method!r} row per client; got duplicates "
                             f"{sorted(set(ok.loc[ok['client_id'].duplicated(), 'client_id']), key=client_sort_key)}.")
        values = pd.to_numeric(ok["value"], errors="coerce").to_numpy(float)
        if not np.isfinite(values).all():
            raise ValueError(f"round_frame['value']: expected finite values on rows with status 'ok'; got "
                             f"{values.tolist()}.")
        ids = ok["client_id"].tolist()
        self.last_round = server_round
        if self.kind == "robust_z":
            if len(ids) < self.min_clients:
                self.last_scores = {}
                return set()
            scores = robust_z(values)
            suspicious = scores < -self.threshold
        else:
            for client_id, value in zip(ids, values):
                self.totals[client_id] = self.totals.get(client_id, 0.0) + float(value)
            scores = np.array([self.totals[c] for c in ids])
            suspicious = scores < self.threshold
        self.last_scores = dict(zip(ids, scores.tolist()))
        new = set()
        for client_id, hit in zip(ids, suspicious):
            self.streaks[client_id] = self.streaks.get(client_id, 0) + 1 if hit else 0
            if self.streaks[client_id] >= self.patience and client_id not in self._flagged_at:
                self._flagged_at[client_id] = server_round
                new.add(client_id)
        return new

    def apply(self, ledger: pd.DataFrame) -> dict:
        """Feed a one-run ledger round by round; return {round: newly flagged set}."""
        _check_ledger_like(ledger, ("round", "client_id", "method", "value", "status"), "ledger")
        if RUN_COLUMN in ledger.columns and ledger[RUN_COLUMN].nunique(dropna=False) > 1:
            raise ValueError(f"ledger: expected one run; got several '{RUN_COLUMN}' values "
                             "(use evaluate_flagging for several runs).")
        return {server_round: self.update(rows) for server_round, rows in ledger.groupby("round", sort=True)}


def evaluate_flagging(rule: FlaggingRule, ledger: pd.DataFrame) -> pd.DataFrame:
    """Run a fresh copy of ``rule`` on every run of ``ledger``; count whom it flags.

    The clients of a run are those valued (status ok) under ``rule.method`` at least once.

    Returns
    -------
    pandas.DataFrame
        One row per run: ``[seed,] n_clients, n_noisy, n_flagged, false_positives,
        detections, false_positive_rate`` (flagged clean / clean), ``detection_rate``
        (flagged noisy / noisy; NaN without noisy clients), ``clean_run`` (no noisy
        client), ``mean_flag_round`` (mean round at which noisy clients were flagged).
    """
    if not isinstance(rule, FlaggingRule):
        raise TypeError(f"rule: expected a FlaggingRule; got {type(rule).__name__}.")
    ledger = _check_ledger(ledger)
    _check_methods(ledger, [rule.method], name="rule.method")
    rows = []
    for key, run in _runs(ledger):
        valued = _valued(run, rule.method)
        if valued.empty:
            continue
        flags = _noisy_of(valued, "evaluate_flagging" + ("" if key is None else f", seed {key}"))
        fresh = rule.clone()
        fresh.apply(run)
        flagged_at = fresh.flagged_at
        noisy = {c for c, f in flags.items() if f}
        clean = set(flags) - noisy
        false_positives = len(clean & set(flagged_at))
        detections = len(noisy & set(flagged_at))
        rounds_noisy = [flagged_at[c] for c in noisy if c in flagged_at]
        row = {"n_clients": len(flags), "n_noisy": len(noisy), "n_flagged": len(flagged_at),
               "false_positives": false_positives, "detections": detections,
               "false_positive_rate": false_positives / len(clean) if clean else math.nan,
               "detection_rate": detections / len(noisy) if noisy else math.nan,
               "clean_run": not noisy,
               "mean_flag_round": float(np.mean(rounds_noisy)) if rounds_noisy else math.nan}
        rows.append(row if key is None else {RUN_COLUMN: key, **row})
    if not rows:
        raise ValueError(f"ledger: expected rows with status 'ok' for method {rule.method!r}; got none.")
    return pd.DataFrame(rows)


def flagging_rates(rules: FlaggingRule | Sequence[FlaggingRule], ledgers: pd.DataFrame | Sequence[pd.DataFrame], *,
                   confidence: float = 0.95) -> pd.DataFrame:
    """Each rule's false-positive and detection rates over runs, with intervals over runs.

    Parameters
    ----------
    rules
        Flagging rules to measure (each is applied afresh to every run).
    ledgers
        One ledger or several (for example the noisy runs and the clean runs of a study,
        each possibly holding several runs told apart by ``seed``). A run whose valued
        clients are all clean is a *clean run*.
    confidence
        Level of the normal-approximation intervals over runs, in (0, 1).

    Returns
    -------
    pandas.DataFrame
        One row per rule: ``method, kind, threshold, patience, n_clean_runs,
        n_noisy_runs``; ``false_positive_rate`` — the mean over clean runs of the share of
        clients flagged (every flag there is false), with ``_ci_low``/``_ci_high``;
        ``false_positive_rate_noisy_runs`` — the mean share of clean clients flagged in
        runs with noisy clients; ``detection_rate`` — the mean share of noisy clients
        flagged in runs with noisy clients, with its interval; ``mean_flag_round`` — the
        mean round at which noisy clients were flagged. NaN where no run of the kind exists.
    """
    rules = [rules] if isinstance(rules, FlaggingRule) else list(rules)
    if not rules or not all(isinstance(rule, FlaggingRule) for rule in rules):
        raise TypeError(f"rules: expected a FlaggingRule or a non-empty list of them; got {rules!r}.")
    ledgers = [ledgers] if isinstance(ledgers, pd.DataFrame) else list(ledgers)
    if not ledgers:
        raise ValueError("ledgers: expected at least one ledger; got none.")
    confidence = check_open_unit("confidence", confidence)
    rows = []
    for rule in rules:
        per_run = pd.concat([evaluate_flagging(rule, ledger) for ledger in ledgers], ignore_index=True)
        clean = per_run[per_run["clean_run"].astype(bool)]
        dirty = per_run[~per_run["clean_run"].astype(bool)]
        row: dict[str, object] = {"method": rule.method, "kind": rule.kind, "threshold": rule.threshold,
                                  "patience": rule.patience, "n_clean_runs": len(clean), "n_noisy_runs": len(dirty)}
        for name, samples in (("false_positive_rate", clean["false_positive_rate"]),
                              ("detection_rate", dirty["detection_rate"])):
            samples = samples.dropna().to_numpy(float)
            mean, low, high = _interval(samples, confidence) if len(samples) else (math.nan,) * 3
            row.update({name: mean, f"{name}_ci_low": low, f"{name}_ci_high": high})
        noisy_fpr = dirty["false_positive_rate"].dropna()
        row["false_positive_rate_noisy_runs"] = float(noisy_fpr.mean()) if len(noisy_fpr) else math.nan
        flag_rounds = dirty["mean_flag_round"].dropna()
        row["mean_flag_round"] = float(flag_rounds.mean()) if len(flag_rounds) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def summarize_flagging(per_run: pd.DataFrame) -> dict[str, float]:
    """Rates over runs from :func:`evaluate_flagging`.

    Returns
    -------
    dict
        ``false_positive_rate`` (mean over clean runs), ``false_positive_rate_noisy_runs``
        (mean share of clean clients flagged in runs with noisy clients),
        ``detection_rate`` (mean over runs with noisy clients), ``n_clean_runs``,
        ``n_noisy_runs``; NaN where no run of the kind exists.
    """
    _check_ledger_like(per_run, ("clean_run", "false_positive_rate", "detection_rate"), "per_run")
    clean = per_run[per_run["clean_run"].astype(bool)]
    dirty = per_run[~per_run["clean_run"].astype(bool)]
    return {
        "false_positive_rate": float(clean["false_positive_rate"].mean()) if len(clean) else math.nan,
        "false_positive_rate_noisy_runs": float(dirty["false_positive_rate"].mean()) if len(dirty) else math.nan,
        "detection_rate": float(dirty["detection_rate"].mean()) if len(dirty) else math.nan,
        "n_clean_runs": len(clean),
        "n_noisy_runs": len(dirty),
    }
