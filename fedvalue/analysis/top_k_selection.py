"""Top-k client selection from within-round scores ([ADS] §6.2, App. C.2).

Within round t the clients are ranked by their score φ_t (ADS, LOO, TracIn outflow, or
a seeded random order); the top k are the k highest, ties broken by the round's reply
order so the choice is deterministic. The paper's protocol scores a run, then retrains
from the same initial model aggregating only each round's top k of the scored run.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np
import pandas as pd

from fedvalue._checks import check_integer
from fedvalue.schema import Status


def top_k(scores: Mapping[Hashable, float], k: int, order: Sequence[Hashable] | None = None) -> list[Hashable]:
    """The k clients with the highest score; ties go to the earlier client in ``order``.

    Parameters
    ----------
    scores
        Score per client id (finite floats).
    k
        How many to keep (at least 1); all clients when k ≥ their number.
    order
        Tie-break order (the round's reply order); defaults to the order of ``scores``.
    """
    check_integer("k", k)
    order = list(scores) if order is None else list(order)
    missing = [c for c in order if c not in scores]
    if missing or len(order) != len(scores):
        raise ValueError(f"order: expected every scored client once; got {order!r} for {list(scores)!r}.")
    values = np.array([float(scores[c]) for c in order])
    if not np.isfinite(values).all():
        raise ValueError(f"scores: expected finite numbers; got {dict(scores)!r}.")
    ranked = np.lexsort((np.arange(len(order)), -values))  # highest first, earlier first among ties
    return [order[i] for i in ranked[: min(int(k), len(order))]]


def retrain_plan(ledger: pd.DataFrame, method: str, k: int) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """From a scored run's ledger: per round the clients that trained and the top k by ``method``.

    Returns ``(sampled, accepted)``, both ``{round: [client ids in ledger order]}``;
    failed clients are sampled but never accepted.
    """
    for column in ("round", "client_id", "method", "value", "status"):
        if column not in ledger:
            raise ValueError(f"ledger: expected a column {column!r}; got columns {list(ledger.columns)}.")
    scored = ledger[ledger["method"] == method]
    if scored.empty:
        raise ValueError(f"method: expected one of the ledger's methods {sorted(ledger['method'].unique())}; "
                         f"got {method!r}.")
    sampled: dict[int, list[str]] = {}
    accepted: dict[int, list[str]] = {}
    for server_round, rows in scored.groupby("round", sort=True):
        rows = rows[rows["status"] != Status.IDLE]
        sampled[int(server_round)] = list(rows["client_id"])
        ok = rows[rows["status"] == Status.OK]
        scores = dict(zip(ok["client_id"], ok["value"]))
        accepted[int(server_round)] = top_k(scores, k, list(ok["client_id"])) if scores else []
    return sampled, accepted
