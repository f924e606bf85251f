"""Top-k marks as a round book: a ``selected`` row per sampled client (1 aggregated, 0 not;
empty for clients not valued), booked when the round's acceptance policy selects
(``record.settings.selection``)."""

from __future__ import annotations

from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.schema import ClientEntry, LedgerRow, Method, Status


class SelectionBook(RoundBook):
    def __init__(self, context: RoundContext) -> None:
        self.context = context
        self.accepted = set(context.record.accepted)

    def entry_rows(self, entry: ClientEntry) -> list[LedgerRow]:
        ok = entry.status == Status.OK
        return [self.context.entry_row(entry, Method.SELECTED, float(entry.client_id in self.accepted) if ok else None,
                                       0.0 if ok else None, self.context.weight_count(entry))]


def selection_book(context: RoundContext) -> SelectionBook | None:
    return SelectionBook(context) if context.settings.selection else None
