"""Claim flags as a round book: a ``claim_capped`` or ``claim_jumped`` row per flag of the
claim review the round record holds, after every other row (the claimed count as the
value, the weight used as the example count; the ledger's columns, no new status)."""

from __future__ import annotations

from collections.abc import Sequence

from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.schema import ClaimEntry, LedgerRow


def claim_rows(server_round: int, claims: Sequence[ClaimEntry]) -> list[LedgerRow]:
    """Ledger rows of a round's claim flags (``noisy`` None, as every book's rows)."""
    return [LedgerRow(server_round, c.client_id, c.method, c.claimed, 0.0, int(c.used), c.status) for c in claims]


class ClaimsBook(RoundBook):
    def __init__(self, context: RoundContext) -> None:
        self.context = context

    def closing_rows(self) -> list[LedgerRow]:
        return claim_rows(self.context.record.round, self.context.record.claims)


def claims_book(context: RoundContext) -> ClaimsBook | None:
    return ClaimsBook(context) if context.record.claims else None
