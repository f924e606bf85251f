"""Fairness as a round book ([FAIRINFL], [FAIRIJ]; :mod:`fedvalue.rounds.fairness_round`): after each
sampled client's valuation rows, ``ads_fairness`` / ``loo_fairness`` (its value in the round
game with U = −gap; for a rejected reply the harm on that game), ``fairness_influence`` and,
when the round was reweighted, ``fair_weight``. Booked when the caller passes the round's
fairness books as ``inputs["fairness"]``: the :class:`~fedvalue.rounds.fairness_round.RoundFairness`
that the run's :class:`~fedvalue.rounds.fairness_round.FairnessPlugin` computed (``value``, its factors
by ``decide``), live in the strategy and again in the audit from the round record."""

from __future__ import annotations

from fedvalue.rounds.fairness_round import RoundFairness
from fedvalue.rounds.harms import rejected_harms
from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.schema import FAIRNESS_VALUATION_METHODS, ClientEntry, LedgerRow, Method, Status


class FairnessBook(RoundBook):
    def __init__(self, context: RoundContext, fairness: RoundFairness) -> None:
        record = context.record
        self.context, self.fairness = context, fairness
        self.harms = rejected_harms(record.entries, set(record.accepted), start_arrays=record.start_arrays,
                                    replies=record.replies, utility=fairness.utility, aggregate=context.aggregate)

    def entry_rows(self, entry: ClientEntry) -> list[LedgerRow]:
        fairness, client = self.fairness, entry.client_id
        ok = entry.status == Status.OK and fairness.valuation is not None
        booked: list[tuple[str, float | None, float | None]] = []
        for method in self.context.methods:
            result = fairness.valuation.results[method] if ok else None
            value = float(result.values[client]) if ok else self.harms.get(client)
            stderr = float(result.stderr[client]) if ok else (0.0 if value is not None else None)
            booked.append((FAIRNESS_VALUATION_METHODS[method], value, stderr))
        influence = float(fairness.influences[client]) if ok else None
        booked.append((Method.FAIRNESS_INFLUENCE, influence, 0.0 if ok else None))
        if fairness.factors is not None:
            factor = float(fairness.factors[client]) if ok else None
            booked.append((Method.FAIR_WEIGHT, factor, 0.0 if ok else None))
        return [self.context.entry_row(entry, method, value, stderr, entry.num_examples)
                for method, value, stderr in booked]


def fairness_book(context: RoundContext) -> FairnessBook | None:
    fairness = context.inputs.get("fairness")
    return None if fairness is None else FairnessBook(context, fairness)
