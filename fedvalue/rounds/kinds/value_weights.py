"""Value-weighted aggregation as a round book: FedAvg's weights times a function of the round's
own within-round values.

The server computes each valid reply's within-round value φ_t(i) ([ADS] Remark 4.1, Eq. 10, or
LOO) before it aggregates; a value-weighting rule turns the values into factors w_i and the
live aggregation takes the mean weighted by n_i w_i:

    A_t = Σ_i n_i w_i Δ_i / Σ_i n_i w_i + A_{t−1}.

This is the counterpart of NVIDIA FLARE's FedCE aggregation ([FEDCE]: weights from contribution
scores) with values the server computes on its own held-out data instead of scores the clients
report. Rules (``{"rule": "value-weight", "score": S, "kind": K, ...}``, saved in the round
record so the audit derives the same factors from the recomputed values):

``kind="positive"``
    w_i = max(φ_i, 0) / mean_{j : φ_j > 0} φ_j: only clients that helped the round are
    aggregated, in proportion to their value (a reply with φ_i ≤ 0 gets 0 and is not
    aggregated; a round in which no reply has a positive value aggregates none and keeps
    A_{t−1}).
``kind="softmax"``
    with r_i = φ_i / max_j |φ_j| (scale-free: within-round values shrink as the model
    converges), w_i = exp((r_i − max_j r_j) / τ) normalized to mean 1; every reply is
    aggregated; τ → ∞ is FedAvg.

Books a ``value_weight`` row (w_i; empty for clients not valued) per sampled client, after its
valuation rows, when the round record's settings name a rule (``settings.weighting``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping

import numpy as np

from fedvalue._checks import check_choice, check_positive
from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.schema import ClientEntry, LedgerRow, Method, Status

RULE_NAME = "value-weight"
KINDS = ("positive", "softmax")


def weighting_rule(score: str, kind: str = "positive", temperature: float | None = None) -> dict:
    """The rule as a round record saves it (checked: ``kind`` one of :data:`KINDS`, a positive
    ``temperature`` for ``softmax`` and none otherwise)."""
    check_choice("kind", kind, KINDS)
    if kind == "softmax":
        return {"rule": RULE_NAME, "score": str(score), "kind": kind,
                "temperature": check_positive("temperature", temperature)}
    if temperature is not None:
        raise ValueError(f"temperature: only kind='softmax' reads it; got {temperature!r} with kind={kind!r}.")
    return {"rule": RULE_NAME, "score": str(score), "kind": kind}


def value_weight_outcome(rule: Mapping, values: Mapping[Hashable, float]) -> tuple[set, dict]:
    """The accepted clients and their factors w_i under ``rule`` (module docstring), from the
    round's values of its valid replies; the live strategy and the audit both call it."""
    if rule.get("rule") != RULE_NAME or rule.get("kind") not in KINDS:
        raise ValueError(f"weighting: expected a rule {{'rule': {RULE_NAME!r}, 'kind': one of {list(KINDS)}, ...}}; "
                         f"got {dict(rule)!r}.")
    clients = list(values)
    scores = np.array([float(values[c]) for c in clients], dtype=float)
    if len(clients) == 0:
        return set(), {}
    if not np.isfinite(scores).all():
        raise ValueError(f"values: expected finite within-round values to weigh by; got {scores.tolist()}.")
    if rule["kind"] == "positive":
        positive = np.maximum(scores, 0.0)
        helped = positive > 0
        scale = float(positive[helped].mean()) if helped.any() else 1.0
        factors = positive / scale
    else:
        largest = float(np.abs(scores).max())
        relative = scores / largest if largest > 0 else np.zeros_like(scores)
        weights = np.exp((relative - relative.max()) / float(rule["temperature"]))
        factors = weights / weights.mean()
    by_client = {c: float(f) for c, f in zip(clients, factors)}
    return {c for c, f in by_client.items() if f > 0 and math.isfinite(f)}, by_client


class ValueWeightBook(RoundBook):
    def __init__(self, context: RoundContext, factors: Mapping[Hashable, float]) -> None:
        self.context, self.factors = context, factors

    def entry_rows(self, entry: ClientEntry) -> list[LedgerRow]:
        ok = entry.status == Status.OK and entry.client_id in self.factors
        factor = float(self.factors[entry.client_id]) if ok else None
        return [self.context.entry_row(entry, Method.VALUE_WEIGHT, factor, 0.0 if ok else None, entry.num_examples)]


def round_factors(context: RoundContext) -> dict:
    """The round's factors: its rule applied to the valuation of its valid replies."""
    rule = context.settings.weighting
    if context.valuation is None:
        return {}
    values = context.valuation.results[rule["score"]].values
    ok = [e.client_id for e in context.record.entries if e.status == Status.OK]
    return value_weight_outcome(rule, {c: float(values[c]) for c in ok})[1]


def value_weight_book(context: RoundContext) -> ValueWeightBook | None:
    if not context.settings.weighting:
        return None
    return ValueWeightBook(context, round_factors(context))
