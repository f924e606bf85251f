"""Claim flags as a round book: a ``claim_capped`` or ``claim_jumped`` row per flag of the
claim review the round record holds, after every other row (the claimed count as the
value, the weight used as the example count; the ledger's columns, no new status)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from fedvalue.round_book import RoundBook, RoundContext
from fedvalue.schema import ClaimEntry


def claim_rows(server_round: int, claims: Sequence[ClaimEntry], noisy_clients: Collection | None = None) -> list[dict]:
    """Ledger rows of a round's claim flags."""
    return [{"round": server_round, "client_id": claim.client_id, "method": claim.method, "value": claim.claimed,
             "stderr": 0.0, "num_examples": int(claim.used), "status": claim.status,
             "noisy": None if noisy_clients is None else claim.client_id in noisy_clients, "reason": ""}
            for claim in claims]


class ClaimsBook(RoundBook):
    def __init__(self, context: RoundContext) -> None:
        self.context = context


    def closing_rows(self) -> list[dict]:
        return claim_rows(self.context.record.round, self.context.record.claims, self.context.noisy_clients)


def claims_book(context: RoundContext) -> ClaimsBook | None:
    return ClaimsBook(context) if context.record.claims else None
