"""One round's books, from its round record: its rounds.csv row and its ledger.csv rows.

The round record (:class:`fedvalue.archive.RoundRecord`) is the single input: the valuing
strategy builds it once from the round's replies and calls :func:`book_round` on it live,
then saves it; the audit reads the saved record and calls :func:`book_round` on it again;
procurement builds one per stage. So what a client gets in a round is decided in one
place, from one description of the round.

Per sampled client, in reply order, and per valuation method:

* ``ok``: its value in the round game v_t ([ADS] Remark 4.1, Eq. 10), and its standard
  error (0 for exact methods);
* ``rejected`` (NaN/inf arrays, kept out of the aggregate): the harm it would have done,
  U(Agg(accepted ∪ {i})) − U(Agg(accepted)), None when that is not a number;
* ``failed``: no value, with the reason.

With top-k selection a ``selected`` row (1 aggregated, 0 not) follows; with TracIn flows
([RECIP] §4) the ``tracin_inflow / outflow / self`` rows of each client, then those of the
clients that did not train this round (``idle``: they still receive inflow). Agg is the
weighted mean of the FedAvg family, or the strategy's own rule passed as ``aggregate``.

With fairness books (:mod:`fedvalue.fair_books`), each sampled client's rows go on with
``ads_fairness`` / ``loo_fairness`` (its value in the round game with U = −gap; for a rejected
reply the harm on that game), ``fairness_influence`` and, when the round was reweighted,
``fair_weight``.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedvalue.archive import RoundRecord
from fedvalue.fair_books import FairnessBooks
from fedvalue.flows import RoundFlows, fedavg_round_flows
from fedvalue.rounds import Aggregator, Arrays, ArraysUtility, RoundValuation, weighted_mean
from fedvalue.schema import (
    FAIR_WEIGHT,
    FAIRNESS_INFLUENCE,
    FAIRNESS_VALUATION_METHODS,
    FLOW_METHODS,
    PROBLEM_STATUSES,
    SELECTED,
    STATUS_IDLE,
    STATUS_OK,
    STATUS_REJECTED,
    ClaimEntry,
    ClientEntry,
)

__all__ = ["ClientEntry", "CountingAggregator", "RoundBooks", "book_round", "claim_rows", "rejected_harms"]


class CountingAggregator(Protocol):
    """Agg_t by the inner strategy's own code, counting the coalitions it could not
    aggregate (:class:`strategies.counterfactual.CounterfactualAggregator`)."""

    unaggregatable: set

    def __call__(self, coalition: Sequence[Hashable]) -> Arrays: ...


@dataclass
class RoundBooks:
    """A round's rows, and its flows (for the first-order check) when they were booked."""

    round_row: dict
    ledger_rows: list[dict]
    flows: RoundFlows | None = None


def rejected_harms(entries: Sequence[ClientEntry], accepted: Collection[Hashable], *,
                   start_arrays: Mapping[str, np.ndarray], replies: Mapping[Hashable, Arrays],
                   utility: ArraysUtility, aggregate: Aggregator | None = None) -> dict:
    """U(Agg(accepted ∪ {i})) − U(Agg(accepted)) for every rejected client i (None when not
    finite); the accepted clients in reply order, i last."""
    rejected = [e for e in entries if e.status == STATUS_REJECTED]
    if not rejected:
        return {}
    weights = {e.client_id: e.weight for e in entries}
    kept = [e.client_id for e in entries if e.status == STATUS_OK and e.client_id in accepted]

    def utility_of(members: list) -> float:
        if not members:
            return float(utility(start_arrays))
        with np.errstate(all="ignore"):
            arrays = (weighted_mean([replies[c] for c in members], [weights[c] for c in members])
                      if aggregate is None else aggregate(members))
            return float(utility(arrays))

    base = utility_of(kept)
    harms = {}
    for entry in rejected:
        with np.errstate(all="ignore"):
            value = utility_of(kept + [entry.client_id]) - base
        harms[entry.client_id] = value if np.isfinite(value) else None
    return harms


def book_round(
    record: RoundRecord,
    valuation: RoundValuation | None,
    utility: ArraysUtility | None,
    *,
    realized: Mapping[str, np.ndarray] | None,
    aggregate: CountingAggregator | None = None,
    fairness: FairnessBooks | None = None,
    noisy_clients: Collection[Hashable] | None = None,
    unaggregatable: int | None = None,
    utility_before: float | None = None,
    utility_realized: float | None = None,
) -> RoundBooks:
    """The round's rounds.csv row and ledger rows (see the module docstring), from its record.

    What the round booked comes from ``record``: its entries (every sampled client, in reply
    order), replies, accepted clients, inference gradients and claim flags, and from its
    settings (``record.meta``) the methods, whether it books TracIn flows (``flows``) and
    top-k marks (``selection``).

    Parameters
    ----------
    valuation
        The round game's valuation over the ``ok`` clients (None when none replied usably).
    utility
        U, for the utilities the caller does not pass and the harms of rejected replies
        (None when there is nothing of either to score).
    realized
        A_t when the round moved the state, None when nothing was aggregated.
    aggregate
        The strategy's own Agg for harms (None: the weighted mean).
    fairness
        The round's fairness valuation, influences and I-JACK factors; None books none.
    unaggregatable
        The coalitions the inner strategy returned no arrays for (rounds.csv's
        ``num_unaggregatable``). None with ``aggregate``: the aggregate's own count once the
        harms are scored (:class:`strategies.counterfactual.CounterfactualAggregator`'s
        ``unaggregatable``); None without: the column is left empty.
    utility_before, utility_realized
        U(A_{t−1}) and U(A_t) when the caller already has them (a game's cached values);
        computed here otherwise.
    """
    server_round, entries, settings = record.round, record.entries, record.meta
    methods, accepted, replies = list(settings.get("methods", [])), set(record.accepted), record.replies
    start_arrays = record.start_arrays
    if utility_before is None:
        utility_before = valuation.utility_before if valuation is not None else float(utility(start_arrays))
    if utility_realized is None:
        utility_realized = float(utility(realized)) if realized is not None else utility_before
    harms = rejected_harms(entries, accepted, start_arrays=start_arrays, replies=replies, utility=utility,
                           aggregate=aggregate)
    fair_harms = {} if fairness is None else rejected_harms(
        entries, accepted, start_arrays=start_arrays, replies=replies, utility=fairness.utility, aggregate=aggregate)
    weights = {e.client_id: e.weight for e in entries if e.status == STATUS_OK}
    aggregated = [e.client_id for e in entries if e.status == STATUS_OK and e.client_id in accepted]
    gradients = record.gradients if settings.get("flows") else None
    flows = missing = None
    if gradients is not None and (gradients or aggregated):
        flows, missing = fedavg_round_flows(start_arrays, {c: replies[c] for c in aggregated},
                                            {c: weights[c] for c in aggregated}, gradients)
    ads_result = None if valuation is None else valuation.results.get("ads")
    round_row = {
        "round": server_round,
        "clients": " ".join(str(e.client_id) for e in entries),
        "num_clients": len(entries),
        "num_failed": sum(e.status != STATUS_OK for e in entries),
        "utility_before": utility_before,
        "utility_after": None if valuation is None else valuation.utility_after,
        "utility_realized": utility_realized,
        "num_evaluations": 0 if valuation is None else valuation.num_evaluations,
        "valuation_seconds": 0.0 if valuation is None else valuation.seconds,
        "ads_method": "" if ads_result is None else ads_result.method,
        "efficiency_gap": None if ads_result is None else ads_result.max_efficiency_gap,
    }
    if unaggregatable is None and aggregate is not None:
        unaggregatable = len(aggregate.unaggregatable)
    if unaggregatable is not None:
        round_row["num_unaggregatable"] = int(unaggregatable)
    frame = None if flows is None else flows.to_frame()

    def noisy_of(client_id) -> bool | None:
        return None if noisy_clients is None else client_id in noisy_clients

    rows = []
    for entry in entries:
        ok = entry.status == STATUS_OK
        reason = entry.reason if entry.status in PROBLEM_STATUSES else ""
        for method in methods:
            result = None if valuation is None else valuation.results[method]
            value = float(result.values[entry.client_id]) if ok else harms.get(entry.client_id)
            rows.append({
                "round": server_round, "client_id": entry.client_id, "method": method, "value": value,
                "stderr": float(result.stderr[entry.client_id]) if ok else (0.0 if value is not None else None),
                "num_examples": entry.num_examples, "status": entry.status, "noisy": noisy_of(entry.client_id),
                "reason": reason,
            })
        if settings.get("selection"):
            rows.append({
                "round": server_round, "client_id": entry.client_id, "method": SELECTED,
                "value": float(entry.client_id in accepted) if ok else None, "stderr": 0.0 if ok else None,
                "num_examples": int(entry.weight) if ok else None, "status": entry.status,
                "noisy": noisy_of(entry.client_id), "reason": reason,
            })
        if frame is not None:
            rows += _flow_rows(server_round, entry.client_id, frame, missing, entry.status,
                               int(entry.weight) if ok else None, reason, noisy_of(entry.client_id))
        if fairness is not None:
            rows += _fairness_rows(server_round, entry, fairness, methods, fair_harms.get(entry.client_id),
                                   reason, noisy_of(entry.client_id))
    if frame is not None:
        booked = {e.client_id for e in entries}
        for client_id in frame.index:
            if client_id not in booked:
                rows += _flow_rows(server_round, client_id, frame, missing, STATUS_IDLE, None, "",
                                   noisy_of(client_id))
    rows += claim_rows(server_round, record.claims, noisy_clients)
    return RoundBooks(round_row, rows, flows)


def claim_rows(server_round: int, claims: Sequence[ClaimEntry], noisy_clients: Collection | None = None) -> list[dict]:
    """Ledger rows of a round's claim flags (the ledger's columns; no new column or status):
    the claimed count as the value, the weight used as the example count."""
    return [{"round": server_round, "client_id": claim.client_id, "method": claim.method, "value": claim.claimed,
             "stderr": 0.0, "num_examples": int(claim.used), "status": claim.status,
             "noisy": None if noisy_clients is None else claim.client_id in noisy_clients, "reason": ""}
            for claim in claims]


def _flow_rows(server_round, client_id, frame, missing, status, num_examples, reason, noisy) -> list[dict]:
    """tracin_inflow/outflow/self rows of one client; empty values where unknown (failed
    clients; a client whose inference gradient is missing has no known inflow)."""
    known = status in (STATUS_OK, STATUS_IDLE) and client_id in frame.index
    rows = []
    for method, column in FLOW_METHODS.items():
        value = float(frame.at[client_id, column]) if known else None
        if column == "inflow" and client_id in missing:
            value = None
        rows.append({"round": server_round, "client_id": client_id, "method": method, "value": value,
                     "stderr": None if value is None else 0.0, "num_examples": num_examples,
                     "status": status, "noisy": noisy, "reason": reason})
    return rows


def _fairness_rows(server_round, entry: ClientEntry, fairness: FairnessBooks, methods, harm, reason,
                   noisy) -> list[dict]:
    """ads_fairness/loo_fairness, fairness_influence (and fair_weight) rows of one sampled client."""
    ok = entry.status == STATUS_OK and fairness.valuation is not None
    client = entry.client_id
    booked: list[tuple[str, float | None, float | None]] = []
    for method in methods:
        result = fairness.valuation.results[method] if ok else None
        value = float(result.values[client]) if ok else harm
        stderr = float(result.stderr[client]) if ok else (0.0 if value is not None else None)
        booked.append((FAIRNESS_VALUATION_METHODS[method], value, stderr))
    influence = float(fairness.influences[client]) if ok else None
    booked.append((FAIRNESS_INFLUENCE, influence, 0.0 if ok else None))
    if fairness.factors is not None:
        factor = float(fairness.factors[client]) if ok else None
        booked.append((FAIR_WEIGHT, factor, 0.0 if ok else None))
    return [{"round": server_round, "client_id": client, "method": method, "value": value, "stderr": stderr,
             "num_examples": entry.num_examples, "status": entry.status, "noisy": noisy, "reason": reason}
            for method, value, stderr in booked]
