"""The interface every kind of round book implements, and what a round gives each of them.

A round's ledger rows are the valuation rows of :func:`fedvalue.rounds.booking.book_round` plus
those of every kind of book the round keeps (top-k marks, TracIn flows, fairness, claim
flags). Each kind is a plug-in: a function ``kind(context) -> RoundBook | None`` (None when
the round keeps no such book) registered in :mod:`fedvalue.rounds.kinds.registry`. A book adds rows
after each sampled client's valuation rows (:meth:`RoundBook.entry_rows`) and after all of
them (:meth:`RoundBook.closing_rows`), in the registry's order. Adding a kind is one
module and one line in the registry; neither :func:`~fedvalue.rounds.booking.book_round` nor the
strategy names it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fedvalue.run.archive import RoundRecord
from fedvalue.run.settings import RoundSettings
from fedvalue.valuation.round_game import Arrays, ArraysUtility, RoundValuation
from fedvalue.schema import PROBLEM_STATUSES, ClientEntry, LedgerRow, Status


class CountingAggregator(Protocol):
    """Agg_t by the inner strategy's own code, counting the coalitions it could not
    aggregate (:class:`strategies.aggregation.counterfactual.CounterfactualAggregator`)."""

    unaggregatable: set

    def __call__(self, coalition: Sequence[Hashable]) -> Arrays: ...


@dataclass(frozen=True)
class RoundContext:
    """What one round gives its books: its record (entries, replies, accepted clients,
    gradients, claims, settings), the round game's valuation, the utility and aggregation
    for harms and what the caller computed for a kind of book (``inputs``, by the kind's
    name: the fairness valuation, for instance)."""

    record: RoundRecord
    valuation: RoundValuation | None
    utility: ArraysUtility | None
    aggregate: CountingAggregator | None = None
    inputs: Mapping[str, object] = field(default_factory=dict)

    @property
    def settings(self) -> RoundSettings:
        return self.record.settings

    @property
    def methods(self) -> list[str]:
        return list(self.record.settings.methods)

    def row(self, client_id: Hashable, method: str, value: float | None, stderr: float | None,
            num_examples: int | None, status: Status | str, reason: str | None = None) -> LedgerRow:
        """One ledger row of this round (every book's rows are built here), its ``noisy`` cell
        None: the run's ground truth is joined where rows are written
        (:func:`fedvalue.schema.with_ground_truth`)."""
        return LedgerRow(self.record.round, client_id, method, value, stderr, num_examples, status, reason=reason)

    def entry_row(self, entry: ClientEntry, method: str, value: float | None, stderr: float | None,
                  num_examples: int | None) -> LedgerRow:
        """A row of a sampled client: its status, and its reason when it was not valued."""
        return self.row(entry.client_id, method, value, stderr, num_examples, entry.status, self.reason_of(entry))

    @staticmethod
    def reason_of(entry: ClientEntry) -> str | None:
        """Why a sampled client was not valued (None for a valued one)."""
        return entry.reason if entry.status in PROBLEM_STATUSES else None

    @staticmethod
    def weight_count(entry: ClientEntry) -> int | None:
        """An ok client's aggregation weight as a count (what selection and flow rows book)."""
        return int(entry.weight) if entry.status == Status.OK else None


class RoundBook:
    """One kind of book of one round; a kind subclasses it and overrides what it books.
    ``num_evaluations`` counts the coalitions a book scores of its own (a defended game of clipped
    updates), added to the round's in rounds.csv."""

    num_evaluations: int = 0

    def entry_rows(self, entry: ClientEntry) -> list[LedgerRow]:
        """Rows of a sampled client, after its valuation rows (none by default)."""
        return []

    def closing_rows(self) -> list[LedgerRow]:
        """Rows after every sampled client's (clients that did not train, claim flags; none by default)."""
        return []
