"""Defences as a round book (:mod:`fedvalue.rounds.defences`): after each sampled client's rows,
its defended values (``ads_defended``, ``loo_defended`` for the round's methods and, with flows,
``tracin_outflow_defended``), the size of its near-duplicate cluster (``defence_cluster``: 1 alone,
k for k identities valued as one player), whether the free-rider test flagged it
(``defence_free_rider``: 1 or 0) and, with a norm cap, the factor its update was clipped by
(``defence_norm_cap``: 1 when not clipped). A client that failed or was rejected gets the rows
empty. Booked when the round record's settings hold ``defences``; the record keeps the
previous global model the free-rider test needs (``references["previous-global"]``), so the
audit books these rows again from the record alone."""

from __future__ import annotations

from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.rounds.defences.quotient import DefendedRound, defend_round
from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.valuation.round_game import round_rng
from fedvalue.schema import ClientEntry, LedgerRow, Method, Status

#: The record's reference name of A_{t−2}, the global model before the round's start.
PREVIOUS_GLOBAL = "previous-global"
DEFENDED_SUFFIX = "_defended"
CLUSTER, FREE_RIDER, NORM_CAP = "defence_cluster", "defence_free_rider", "defence_norm_cap"


class DefencesBook(RoundBook):
    def __init__(self, context: RoundContext, settings: DefenceSettings, defended: DefendedRound | None) -> None:
        self.context, self.settings, self.defended = context, settings, defended
        self.num_evaluations = 0 if defended is None else defended.num_evaluations

    def _methods(self) -> list[str]:
        methods = [m for m in self.context.methods if m in (Method.ADS, Method.LOO)]
        return methods + ([Method.TRACIN_OUTFLOW] if self.context.settings.flows else [])

    def entry_rows(self, entry: ClientEntry) -> list[LedgerRow]:
        defended, client = self.defended, entry.client_id
        ok = entry.status == Status.OK and defended is not None
        booked = []
        for method in self._methods():
            values = defended.values.get(method, {}) if ok else {}
            value = values.get(client) if ok else None
            booked.append((f"{method}{DEFENDED_SUFFIX}", value, defended.stderr[method].get(client) if value is not None
                           else None))
        cluster = defended.cluster_of(client) if ok else None
        booked.append((CLUSTER, float(len(cluster)) if cluster else (0.0 if ok else None), 0.0 if ok else None))
        booked.append((FREE_RIDER, float(client in defended.flags) if ok else None, 0.0 if ok else None))
        if self.settings.norm_cap is not None:
            booked.append((NORM_CAP, defended.clip_factors.get(client, 1.0) if ok else None, 0.0 if ok else None))
        return [self.context.entry_row(entry, method, value, stderr, entry.num_examples)
                for method, value, stderr in booked]


def defences_book(context: RoundContext) -> DefencesBook | None:
    if context.settings.defences is None:
        return None
    settings = DefenceSettings.from_meta(context.settings.defences)
    record, valuation = context.record, context.valuation
    ok = [e.client_id for e in record.entries if e.status == Status.OK and e.client_id in record.replies]
    if valuation is None or not ok:
        return DefencesBook(context, settings, None)
    weights = record.weights
    flows = context.settings.flows
    defended = defend_round(
        valuation.game, record.start_arrays, {c: record.replies[c] for c in ok}, {c: weights[c] for c in ok},
        methods=context.methods, ads_settings=context.settings.valuation,
        rng=round_rng(context.settings.seed, record.round), settings=settings,
        previous=record.references.get(PREVIOUS_GLOBAL), utility=context.utility,
        weighted_mean=context.aggregate is None, gradients=record.gradients if flows else None,
        aggregated=[c for c in ok if c in set(record.accepted)])
    return DefencesBook(context, settings, defended)
