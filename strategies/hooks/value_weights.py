"""The strategy's side of value-weighted aggregation, the hook of
:mod:`fedvalue.rounds.kinds.value_weights`: an acceptance policy that names a weighting rule
(:class:`strategies.policies.ValueWeighting`) has each accepted reply's FedAvg weight n_u multiplied
by a factor the rule derives from the round's within-round values, after the policy chose; the books
keep n_u, the round settings the rule, and the audit re-derives the factors from the values it
recomputes."""

from __future__ import annotations

from collections.abc import Mapping

from fedvalue.rounds.kinds.value_weights import value_weight_outcome
from strategies.round_hook import HookContext, RoundHook, RoundView


class ValueWeightHook(RoundHook):
    """Multiplies the accepted replies' weights by the factors of ``rule`` (module docstring)."""

    def __init__(self, rule: Mapping) -> None:
        self.rule = dict(rule)

    def settings(self) -> dict:
        return {"weighting": dict(self.rule)}

    def factors(self, round: RoundView, accepted: set, inputs) -> tuple[None, dict]:
        """w_u of each valid reply under the rule, from the round's values (n_u w_u in the message the
        inner strategy aggregates)."""
        values = round.valuation.results[self.rule["score"]].values
        _, factors = value_weight_outcome(self.rule, {r.client_id: float(values[r.client_id]) for r in round.ok})
        return None, factors


def value_weight_hook(context: HookContext) -> ValueWeightHook | None:
    """The hook of a policy that names a weighting rule (None: none); ValueError where the books could
    not follow it: factors multiply FedAvg's weights, so the inner strategy must aggregate by the
    weighted mean, and a run keeps one reweighing rule (not beside the fairness books')."""
    acceptance = context.acceptance
    if acceptance.weighting is None:
        return None
    if not context.weighted_mean:
        raise ValueError(f"acceptance: {acceptance!r} multiplies FedAvg's weights by value factors; the inner "
                         f"strategy must aggregate by the weighted mean (FedAvg, FedProx); got {context.strategy_name}.")
    if context.books.fairness is not None:
        raise ValueError("acceptance: value weighting and fairness books cannot share a run (one reweighing "
                         "rule a round); drop fairness or use another acceptance policy.")
    return ValueWeightHook(acceptance.weighting)
