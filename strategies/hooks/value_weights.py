"""The strategy's side of value-weighted aggregation (:mod:`fedvalue.rounds.kinds.value_weights`):
an acceptance policy that names a weighting rule (:class:`strategies.policies.ValueWeighting`)
has each accepted reply's FedAvg weight n_u multiplied by a factor the rule derives from the
round's within-round values, after the policy chose; the books keep n_u, the record the rule,
and the audit re-derives the factors from the values it recomputes."""

from __future__ import annotations

from flwr.serverapp.strategy import Strategy

from fedvalue.rounds.kinds.value_weights import value_weight_outcome
from fedvalue.valuation.round_game import RoundValuation
from strategies.counterfactual import aggregates_by_weighted_mean
from strategies.policies.acceptance import Acceptance
from strategies.replies import ClientReply, reweigh


def weighting_rule(acceptance: Acceptance, strategy: Strategy, *, fairness: bool) -> dict | None:
    """The acceptance policy's value-weighting rule, or None; ValueError where the books could not
    follow it: factors multiply FedAvg's weights, so the inner strategy must aggregate by the
    weighted mean, and a run keeps one reweighing rule (not beside the fairness books')."""
    rule = getattr(acceptance, "weighting", None)
    if rule is None:
        return None
    if not aggregates_by_weighted_mean(strategy):
        raise ValueError(f"acceptance: {acceptance!r} multiplies FedAvg's weights by value factors; the inner "
                         f"strategy must aggregate by the weighted mean (FedAvg, FedProx); got "
                         f"{type(strategy).__name__}.")
    if fairness:
        raise ValueError("acceptance: value weighting and fairness books cannot share a run (one reweighing "
                         "rule a round); drop fairness or use another acceptance policy.")
    return dict(rule)


def reweigh_by_values(rule: dict, ok: list[ClientReply], accepted: set, valuation: RoundValuation,
                      weighted_by_key: str) -> None:
    """Multiply each accepted reply's weight by its factor under ``rule`` from the round's values
    (n_u w_u in the message the inner strategy aggregates)."""
    values = valuation.results[rule["score"]].values
    _, factors = value_weight_outcome(rule, {r.client_id: float(values[r.client_id]) for r in ok})
    reweigh(ok, accepted, factors, weighted_by_key)
