"""Claim flags as a round book: a ``claim_capped`` or ``claim_jumped`` row per flag of the
claim review the round record holds, after every other row (the claimed count as the
value, the weight used as the example count; the ledger's columns, no new status)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.schema import ClaimEntry, LedgerRow, noisy_flag


def claim_rows(server_round: int, claims: Sequence[ClaimEntry],
               noisy_clients: Collection | None = None) -> list[LedgerRow]:
    """Ledger rows of a round's claim flags."""
    return [LedgerRow(server_round, c.client_id, c.method, c.claimed, 0.0, int(c.used), c.status,
                      noisy_flag(c.client_id, noisy_clients)) for c in claims]


class ClaimsBook(RoundBook):
    def __init__(self, context: RoundContext) -> None:
        self.context = context

    def closing_rows(self) -> list[LedgerRow]:
        return claim_rows(self.context.record.round, self.context.record.claims, self.context.noisy_clients)


def claims_book(context: RoundContext) -> ClaimsBook | None:
    return ClaimsBook(context) if context.record.claims else None
