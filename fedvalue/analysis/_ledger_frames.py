"""Scores read out of a ledger frame: the checks and groupings detection and flagging share.

A ledger frame is the long format of :mod:`fedvalue.run.ledger_tables` (one row per round, client and
method, with ``value``, ``status`` and the ``noisy`` flag); several runs may be concatenated
with a ``seed`` column. Lower scores are more suspicious throughout.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from statistics import NormalDist

import numpy as np
import pandas as pd

from fedvalue.schema import CLIENT_STATUSES, Status, client_sort_key

#: Name of the seeded random-ranking baseline (not a ledger method).
RANDOM = "random"
#: Columns every detection function needs.
REQUIRED_COLUMNS = ("round", "client_id", "method", "value", "status", "noisy")
#: Column that tells concatenated runs apart.
RUN_COLUMN = "seed"
CURVE_METRICS = ("recall", "precision")
TIE_RULES = ("average", "client_id")


def _scores_and_flags(scores, flags, score_names: tuple[str, str], flag_names: tuple[str, str]):
    """Finite float scores and one boolean flag per score, or a ValueError naming the parameter."""
    scores = np.asarray(scores, dtype=float)
    flags = np.asarray(flags, dtype=bool)
    if scores.ndim != 1 or flags.shape != scores.shape:
        raise ValueError(f"{flag_names[0]}: expected one {flag_names[1]} per {score_names[1]} ({scores.shape}); "
                         f"got shape {flags.shape}.")
    if not np.isfinite(scores).all():
        raise ValueError(f"{score_names[0]}: expected finite numbers; got {scores.tolist()}.")
    return scores, flags


def _check_ledger(ledger: object, columns: Sequence[str] = REQUIRED_COLUMNS, name: str = "ledger") -> pd.DataFrame:
    if not isinstance(ledger, pd.DataFrame):
        raise TypeError(f"{name}: expected a pandas DataFrame in the ledger's long format; "
                        f"got {type(ledger).__name__}. Read one with fedvalue.run.ledger_reader.read_ledger_csv.")
    missing = [c for c in columns if c not in ledger.columns]
    if missing:
        raise ValueError(f"{name}: expected columns {list(columns)}; missing {missing} in "
                         f"{list(ledger.columns)}.")
    if ledger.empty:
        raise ValueError(f"{name}: expected at least one row; got an empty frame.")
    bad = sorted(set(ledger["status"].astype(str)) - set(CLIENT_STATUSES))
    if bad:
        raise ValueError(f"{name}['status']: expected values in {list(CLIENT_STATUSES)}; got {bad}.")
    if RUN_COLUMN in ledger.columns and ledger[RUN_COLUMN].isna().any():
        raise ValueError(f"{name}['{RUN_COLUMN}']: expected a run key on every row; got missing values.")
    ok = ledger["status"] == Status.OK
    values = pd.to_numeric(ledger.loc[ok, "value"], errors="coerce")
    if not np.isfinite(values.to_numpy(dtype=float)).all():
        rows = ledger.loc[ok][~np.isfinite(values.to_numpy(dtype=float))].head(3)
        raise ValueError(f"{name}['value']: expected a finite value on every row with status 'ok'; got "
                         f"{rows[['round', 'client_id', 'method', 'value']].to_dict('records')}.")
    return ledger


def _check_methods(ledger: pd.DataFrame, methods: object, name: str = "methods") -> list[str]:
    if isinstance(methods, str):
        methods = [methods]
    if not isinstance(methods, Iterable):
        raise TypeError(f"{name}: expected a method name or a list of them; got {type(methods).__name__}.")
    methods = list(methods)
    if not methods:
        raise ValueError(f"{name}: expected at least one method; got none.")
    available = sorted(set(ledger["method"].astype(str)))
    for method in methods:
        if method != RANDOM and method not in available:
            raise ValueError(f"{name}: expected ledger methods from {available} or {RANDOM!r}; got {method!r}.")
    if len(set(methods)) != len(methods):
        raise ValueError(f"{name}: expected each method once; got {methods}.")
    return methods


def _runs(ledger: pd.DataFrame) -> list[tuple[object, pd.DataFrame]]:
    """(run key, rows) per run, in sorted key order; a single run has key None."""
    if RUN_COLUMN not in ledger.columns:
        return [(None, ledger)]
    return [(key, rows) for key, rows in ledger.groupby(RUN_COLUMN, sort=True)]


def _noisy_of(rows: pd.DataFrame, what: str) -> dict[Hashable, bool]:
    """Noisy flag per client id; raises when a flag is missing or inconsistent."""
    flags: dict[Hashable, bool] = {}
    for client_id, noisy in zip(rows["client_id"], rows["noisy"]):
        if noisy is None or pd.isna(noisy):
            raise ValueError(
                f"ledger['noisy']: expected True/False for every valued client; got a missing flag for "
                f"client {client_id!r} ({what}). Record runs with their noisy set (an empty set for a "
                f"clean run), or fill a run known to be clean with ledger['noisy'].fillna(False).")
        if not isinstance(noisy, (bool, np.bool_)):
            raise ValueError(f"ledger['noisy']: expected booleans (True/False/NA); got {noisy!r} for client "
                             f"{client_id!r} ({what}). Read ledgers with fedvalue.run.ledger_reader.read_ledger_csv.")
        noisy = bool(noisy)
        if flags.setdefault(client_id, noisy) != noisy:
            raise ValueError(f"ledger['noisy']: expected one flag per client; client {client_id!r} has both "
                             f"True and False ({what}).")
    return flags


def _valued(rows: pd.DataFrame, method: str) -> pd.DataFrame:
    """Rows of clients valued (status ok) under ``method``; for RANDOM, one row per ok client."""
    ok = rows[rows["status"] == Status.OK]
    if method == RANDOM:
        return ok.drop_duplicates(["round", "client_id"])
    ok = ok[ok["method"] == method]
    duplicated = ok.duplicated(["round", "client_id"])
    if duplicated.any():
        first = ok[duplicated].iloc[0]
        raise ValueError(f"ledger: expected one {method!r} row per (round, client); got several for client "
                         f"{first['client_id']!r} in round {first['round']!r}.")
    return ok


def _sorted_by_id(client_ids: Iterable[Hashable]) -> list[Hashable]:
    return sorted(client_ids, key=client_sort_key)


def _interval(samples: np.ndarray, confidence: float) -> tuple[float, float, float]:
    mean = float(np.mean(samples))
    if len(samples) < 2:
        return mean, math.nan, math.nan
    half = NormalDist().inv_cdf(0.5 + confidence / 2) * float(np.std(samples, ddof=1)) / math.sqrt(len(samples))
    return mean, mean - half, mean + half


def _check_ledger_like(frame: object, columns: Sequence[str], name: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"{name}: expected a pandas DataFrame; got {type(frame).__name__}.")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name}: expected columns {list(columns)}; missing {missing}.")
