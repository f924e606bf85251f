"""Fairness influence with curvature as a round book (:mod:`fedvalue.scoring.fairness.curvature`): after
each sampled client's rows, ``fairness_influence_curvature`` (I^H_t(u) = −∇Fᵀ(D + δI)⁻¹G_u,
[FAIRIJ] Eq. 6 at client level with App. A's damped diagonal Fisher) and
``fairness_weight_derivative`` (its FedAvg-renormalized derivative I^H_t(u) − p_u Σ_v I^H_t(v),
what the ``curvature`` drop rule acts on); none for a valid reply that sent no usable
curvature (a client that failed or was rejected gets both rows empty). Booked when the round's fairness books
(``inputs["fairness"]``) hold curvature influences, i.e. when the clients answered the
curvature query; the record keeps their loss gradients and Fisher diagonals, so the audit
books these rows again from it."""

from __future__ import annotations

from fedvalue.rounds.fairness_round import RoundFairness
from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.schema import ClientEntry, LedgerRow, Method, Status


class FairnessCurvatureBook(RoundBook):
    def __init__(self, context: RoundContext, fairness: RoundFairness) -> None:
        self.context, self.fairness = context, fairness
        derivatives = fairness.scores("curvature") if fairness.influences else {}
        self.derivatives = {c: v for c, v in derivatives.items() if c in fairness.curvature}

    def entry_rows(self, entry: ClientEntry) -> list[LedgerRow]:
        if entry.status == Status.OK and entry.client_id not in self.derivatives:
            # A valid reply that sent no usable curvature gets no such rows (an ok row must hold a
            # value; the rule counts it as I^H = 0, which it did not report).
            return []
        ok = entry.status == Status.OK
        booked = [(Method.FAIRNESS_INFLUENCE_CURVATURE, self.fairness.curvature), (Method.FAIRNESS_WEIGHT_DERIVATIVE, self.derivatives)]
        return [self.context.entry_row(entry, method, float(values[entry.client_id]) if ok else None,
                                       0.0 if ok else None, entry.num_examples)
                for method, values in booked]


def fairness_curvature_book(context: RoundContext) -> FairnessCurvatureBook | None:
    fairness = context.inputs.get("fairness")
    if fairness is None or fairness.curvature is None:
        return None
    return FairnessCurvatureBook(context, fairness)
