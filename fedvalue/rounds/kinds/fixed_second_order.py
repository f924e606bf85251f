"""The fixed-weight round game's second-order expansion as a round book: after each sampled client's rows,
``ads_fixed_second_order``, the Shapley value of the expanded game ([ADS] Remark 4.1, Eq. 9 with one group,
on the expansion of :mod:`fedvalue.valuation.taylor`) over the round's valid replies, whatever the run's own
coalition rule and ADS estimator:

    φ_k = u_k·(g + ½ H U),   u_k = p_k Δ_k,   p_k = n_k / Σ_{j∈I_t} n_j,   U = Σ_{j∈I_t} u_j,

g = ∇U(A_{t−1}), H = ∇²U(A_{t−1}), with its standard error 0.0 (no sampling). A client that failed or was
rejected gets the row empty.

φ is linear in each reply's claim-weighted update u_k and depends on the others through U alone, so one
participant's identities whose claims add up to its claim and whose claim-weighted updates add up to its own
are paid, together, what that one client would be, and every other client as before: a split gains nothing.
Replicas and overlapping shards are not such a split (each u_k carries its own claim): they are paid as one
claim inflated to their summed claims.

Booked when the round record's settings hold ``fixed_second_order``; the round game is built from the record
alone (:func:`fedvalue.rounds.record_game.valid_clients`, their reply order and weights, the coalition rule
``fixed-weight``) with the run's utility, so the audit books these rows again from the record. Its two anchor
evaluations, v(∅) and v(I_t) for the efficiency gap of the expansion, are added to the round's in rounds.csv.
"""

from __future__ import annotations

from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.rounds.record_game import record_game, valid_clients
from fedvalue.schema import ClientEntry, LedgerRow, Method, Status
from fedvalue.valuation.result import ValuationResult
from fedvalue.valuation.round_game import round_rng, value_round
from fedvalue.valuation.settings import FIXED_WEIGHT, AdsSettings

#: The expansion the book values the fixed-weight round game by (:mod:`fedvalue.valuation.taylor`).
SECOND_ORDER = AdsSettings(method="second-order")


class FixedSecondOrderBook(RoundBook):
    """One round's ``ads_fixed_second_order`` rows from the expansion's valuation (None: no valid reply)."""

    def __init__(self, context: RoundContext, result: ValuationResult | None, num_evaluations: int) -> None:
        self.context, self.result = context, result
        self.num_evaluations = num_evaluations

    def entry_rows(self, entry: ClientEntry) -> list[LedgerRow]:
        valued = self.result is not None and entry.status == Status.OK and entry.client_id in self.result.values.index
        value = float(self.result.values[entry.client_id]) if valued else None
        stderr = float(self.result.stderr[entry.client_id]) if valued else None
        return [self.context.entry_row(entry, Method.ADS_FIXED_SECOND_ORDER, value, stderr, entry.num_examples)]


def fixed_second_order_book(context: RoundContext) -> FixedSecondOrderBook | None:
    if not context.settings.fixed_second_order:
        return None
    record = context.record
    ok = valid_clients(record)
    if not ok:
        return FixedSecondOrderBook(context, None, 0)
    if context.utility is None:
        raise ValueError("fixed_second_order: expected the run's utility to expand the round game with; got None.")
    game = record_game(record, context.utility, rule=FIXED_WEIGHT)
    valuation = value_round(game, (Method.ADS,), SECOND_ORDER, seed=round_rng(context.settings.seed, record.round))
    return FixedSecondOrderBook(context, valuation.results[Method.ADS], valuation.num_evaluations)
