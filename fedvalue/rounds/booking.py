"""One round's books, from its round record: its rounds.csv row and its ledger.csv rows.

The round record (:class:`fedvalue.run.archive.RoundRecord`) is the single input: the valuing
strategy builds it once from the round's replies and calls :func:`book_round` on it live,
then saves it; the audit reads the saved record and calls :func:`book_round` on it again;
procurement builds one per stage. So what a client gets in a round is decided in one
place, from one description of the round. Which clients a simulation made noisy is no part
of it: every row's ``noisy`` cell is None, and the run's ground truth is joined where the
rows are written (:class:`fedvalue.run.ledger_tables.LedgerWriter`).

Per sampled client, in reply order, and per valuation method:

* ``ok``: its value in the round game v_t ([ADS] Remark 4.1, Eq. 10), and its standard
  error (0 for exact methods);
* ``rejected`` (NaN/inf arrays, kept out of the aggregate): the harm it would have done,
  U(Agg(accepted ∪ {i})) − U(Agg(accepted)), None when that is not a number;
* ``failed``: no value, with the reason.

Agg is the weighted mean of the FedAvg family, or the strategy's own rule passed as
``aggregate`` (:mod:`fedvalue.rounds.harms`).

Every other kind of book the round keeps is a plug-in (:mod:`fedvalue.rounds.book_kind`,
registered in :mod:`fedvalue.rounds.kinds.registry`): its rows follow each client's valuation rows
and then all of them, in the registry's order: top-k marks (``selected``), TracIn flows
(``tracin_*``, then the idle clients'), fairness (``ads_fairness``, ``loo_fairness``,
``fairness_influence``, ``fair_weight``) and claim flags (``claim_*``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fedvalue.run.archive import RoundRecord
from fedvalue.rounds.kinds.claims import claim_rows
from fedvalue.rounds.harms import rejected_harms
from fedvalue.rounds.book_kind import CountingAggregator, RoundBook, RoundContext
from fedvalue.rounds.kinds.registry import ROUND_BOOKS
from fedvalue.valuation.round_game import ArraysUtility, RoundValuation
from fedvalue.schema import ClientEntry, LedgerRow, Method, RoundRow, Status

__all__ = ["ClientEntry", "CountingAggregator", "LedgerRow", "BookedRound", "book_round", "claim_rows", "rejected_harms"]


@dataclass
class BookedRound:
    """A round's rows, and the books of each kind it kept (by the registry's names)."""

    round_row: RoundRow
    ledger_rows: list[LedgerRow]
    parts: dict[str, RoundBook] = field(default_factory=dict)


def book_round(
    record: RoundRecord,
    valuation: RoundValuation | None,
    utility: ArraysUtility | None,
    *,
    realized: Mapping[str, np.ndarray] | None,
    aggregate: CountingAggregator | None = None,
    inputs: Mapping[str, object] | None = None,
    unaggregatable: int | None = None,
    utility_before: float | None = None,
    utility_realized: float | None = None,
) -> BookedRound:
    """The round's rounds.csv row and ledger rows (see the module docstring), from its record.

    What the round booked comes from ``record``: its entries (every sampled client, in reply
    order), replies, accepted clients, inference gradients and claim flags, and from its
    settings (``record.settings``) the methods and which kinds of book it keeps.

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
    inputs
        What the caller computed for a kind of book, by its name (``{"fairness":
        RoundFairness}`` books the round's fairness).
    unaggregatable
        The coalitions the inner strategy returned no arrays for (rounds.csv's
        ``num_unaggregatable``). None with ``aggregate``: the aggregate's own count once the
        harms are scored (:class:`strategies.aggregation.counterfactual.CounterfactualAggregator`'s
        ``unaggregatable``); None without: the column is left empty.
    utility_before, utility_realized
        U(A_{t−1}) and U(A_t) when the caller already has them (a game's cached values);
        computed here otherwise.
    """
    entries, start_arrays = record.entries, record.start_arrays
    context = RoundContext(record, valuation, utility, aggregate, dict(inputs or {}))
    if utility_before is None:
        utility_before = valuation.utility_before if valuation is not None else float(utility(start_arrays))
    if utility_realized is None:
        utility_realized = float(utility(realized)) if realized is not None else utility_before
    harms = rejected_harms(entries, set(record.accepted), start_arrays=start_arrays, replies=record.replies,
                           utility=utility, aggregate=aggregate)
    parts = {name: book for name, kind in ROUND_BOOKS.items() if (book := kind(context)) is not None}
    round_row = _round_row(record, valuation, utility_before, utility_realized, aggregate, unaggregatable, parts)

    rows = []
    for entry in entries:
        ok = entry.status == Status.OK
        for method in context.methods:
            result = None if valuation is None else valuation.results[method]
            value = float(result.values[entry.client_id]) if ok else harms.get(entry.client_id)
            stderr = float(result.stderr[entry.client_id]) if ok else (0.0 if value is not None else None)
            rows.append(context.entry_row(entry, method, value, stderr, entry.num_examples))
        for book in parts.values():
            rows += book.entry_rows(entry)
    for book in parts.values():
        rows += book.closing_rows()
    return BookedRound(round_row, rows, parts)


def _round_row(record: RoundRecord, valuation: RoundValuation | None, utility_before: float, utility_realized: float,
               aggregate: CountingAggregator | None, unaggregatable: int | None,
               parts: Mapping[str, RoundBook]) -> RoundRow:
    """The round's rounds.csv row (without its hash, which the writer chains)."""
    entries = record.entries
    ads_result = None if valuation is None else valuation.results.get(Method.ADS)
    if unaggregatable is None and aggregate is not None:
        unaggregatable = len(aggregate.unaggregatable)
    return RoundRow(
        round=record.round,
        clients=" ".join(str(e.client_id) for e in entries),
        num_clients=len(entries),
        num_failed=sum(e.status != Status.OK for e in entries),
        utility_before=utility_before,
        utility_after=None if valuation is None else valuation.utility_after,
        utility_realized=utility_realized,
        # A book that scores coalitions of its own (a defended game of clipped updates) adds its count.
        num_evaluations=(0 if valuation is None else valuation.num_evaluations)
                        + sum(book.num_evaluations for book in parts.values()),
        valuation_seconds=0.0 if valuation is None else valuation.seconds,
        ads_method=None if ads_result is None else ads_result.method,
        efficiency_gap=None if ads_result is None else ads_result.max_efficiency_gap,
        num_unaggregatable=unaggregatable,
    )
