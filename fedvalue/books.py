"""One round's books, from what happened in it: its rounds.csv row and its ledger.csv rows.

The valuing strategy calls :func:`book_round` live; the audit calls it again on the saved
round record and compares, so what a client gets in a round is decided in one place.

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

import numpy as np

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
)


@dataclass(frozen=True)
class ClientEntry:
    """One sampled client's outcome in a round.

    ``weight`` is its aggregation weight (ok and rejected replies); ``num_examples`` is what
    its valuation rows book as its example count; ``reason`` why it was not valued.
    """

    client_id: Hashable
    status: str
    weight: float | None = None
    num_examples: int | None = None
    reason: str = ""


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
    server_round: int,
    entries: Sequence[ClientEntry],
    valuation: RoundValuation | None,
    *,
    methods: Sequence[str],
    start_arrays: Mapping[str, np.ndarray],
    replies: Mapping[Hashable, Arrays],
    accepted: Collection[Hashable],
    realized: Mapping[str, np.ndarray] | None,
    utility: ArraysUtility,
    aggregate: Aggregator | None = None,
    gradients: Mapping[Hashable, Arrays] | None = None,
    noisy_clients: Collection[Hashable] | None = None,
    book_selection: bool = False,
    utility_before: float | None = None,
    utility_realized: float | None = None,
    fairness: FairnessBooks | None = None,
) -> RoundBooks:
    """The round's rounds.csv row and ledger rows (see the module docstring).

    Parameters
    ----------
    entries
        Every sampled client, in reply order (duplicates included).
    valuation
        The round game's valuation over the ``ok`` clients (None when none replied usably).
    replies
        Arrays of every ok or rejected reply.
    accepted
        The clients the live aggregation took (top-k selection may take fewer than all ok).
    realized
        A_t when the round moved the state, None when nothing was aggregated.
    aggregate
        The strategy's own Agg for harms (None: the weighted mean).
    gradients
        Inference gradients at A_{t−1} of every client that sent one; None books no flows.
    utility_before, utility_realized
        U(A_{t−1}) and U(A_t) when the caller already has them (a game's cached values);
        computed here otherwise.
    fairness
        The round's fairness valuation, influences and I-JACK factors; None books none.
    """
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
        if book_selection:
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
    return RoundBooks(round_row, rows, flows)


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
