"""The strategy's hooks by the name of the book kind each feeds (:data:`ROUND_HOOKS`, beside
:data:`fedvalue.rounds.kinds.registry.ROUND_BOOKS`), in the order a round calls them. A new kind of
round book is one module in :mod:`fedvalue.rounds.kinds` and one here, and one registration in each
(:func:`fedvalue.rounds.kinds.registry.register_round_book`, :func:`register_round_hook`); neither
the round nor the strategy names it."""

from __future__ import annotations

from collections.abc import Callable

from flwr.serverapp.strategy import Strategy

from fedvalue._registry import Registry
from fedvalue.schema import Method
from fedvalue.valuation.settings import EXPANSION_METHODS, RENORMALIZED, ValuationSettings
from fedvalue.valuation.taylor import check_expandable, expansion_shortfall
from strategies.acceptance_policy import FAIRNESS, OUTFLOWS, REPLIES, Acceptance
from strategies.aggregation.counterfactual import aggregates_by_weighted_mean
from strategies.book_settings import BookSettings
from strategies.hooks.defences import defence_hook
from strategies.hooks.fairness import fairness_hook
from strategies.hooks.flows import flow_hook
from strategies.round_hook import HookContext, RoundHook
from strategies.hooks.value_weights import value_weight_hook

#: A hook's factory: the run's hook of that kind, or None when the run keeps no such book.
HookFactory = Callable[[HookContext], RoundHook | None]

#: name (the book kind's) -> factory, in the order a round calls the hooks.
ROUND_HOOKS: Registry = Registry("round hook", "HookContext -> RoundHook | None", {
    "flows": flow_hook,
    "fairness": fairness_hook,
    "defences": defence_hook,
    "value_weights": value_weight_hook,
})

#: How a run comes to offer what an acceptance policy may read (:class:`strategies.policies.acceptance.AcceptInputs`).
OFFER_ADVICE = {
    OUTFLOWS: "book TracIn flows: books=BookSettings(flows=True)",
    FAIRNESS: "pass books=BookSettings(fairness=GroupFairness(...)) (held-out data with a sensitive attribute)",
    REPLIES: "book the defences too: books=BookSettings(defences=DefenceSettings())",
}


def register_round_hook(name: str, factory: HookFactory, *, replace: bool = False) -> None:
    """Register the hook ``factory`` of the book kind ``name`` (after the hooks registered before it);
    ValueError for a name already taken unless ``replace``."""
    ROUND_HOOKS.register(name, factory, replace=replace)


def unregister_round_hook(name: str) -> None:
    """Remove the hook ``name``; ValueError naming the registered ones when there is none."""
    ROUND_HOOKS.unregister(name)


def hook_context(books: BookSettings, acceptance: Acceptance, strategy: Strategy, *,
                 query_data_key: bool = False, coalition_rule: str = RENORMALIZED, seed: int = 0) -> HookContext:
    """What the hooks of a run of ``strategy`` that keeps ``books`` and accepts by ``acceptance`` are
    made from (``query_data_key``: its queries carry the train config's data-key; ``coalition_rule``:
    how its round game aggregates a coalition; ``seed``: the run's). ValueError for a coalition rule other than the
    renormalized one where the inner strategy aggregates by its own code (the rule is the weighted
    mean's)."""
    weighted_mean = aggregates_by_weighted_mean(strategy)
    if coalition_rule != RENORMALIZED and not weighted_mean:
        raise ValueError(f"coalition_rule: {coalition_rule!r} weighs each coalition by FedAvg's round weights; "
                         f"{type(strategy).__name__} aggregates by its own code, whose coalitions are what it "
                         "makes of them: use 'renormalized' with it.")
    return HookContext(books, acceptance, type(strategy).__name__, weighted_mean, query_data_key, coalition_rule, seed)


def check_expansion(valuation: ValuationSettings, books: BookSettings, strategy: Strategy, utility: object) -> None:
    """ValueError naming ``method`` when the run books ADS by an expansion method (:mod:`fedvalue.valuation.taylor`)
    that cannot value the rounds of a run of ``strategy`` keeping ``books`` with ``utility``, before the run
    starts: it needs FedAvg's weighted mean, a differentiable U, and no book that values another game by the
    same method (fairness, defences)."""
    method = valuation.ads.method
    if method not in EXPANSION_METHODS or Method.ADS not in valuation.methods:
        return
    if not aggregates_by_weighted_mean(strategy):
        raise ValueError(f"method: {method!r} expands the round game of FedAvg's weighted mean; "
                         f"{type(strategy).__name__} aggregates by its own code, whose coalitions have no such "
                         "structure: use an estimator of coalitions ('auto', 'exact', 'mc', ...) with it.")
    for name, kept in (("fairness", books.fairness is not None), ("defences", books.defences is not None)):
        if kept:
            raise ValueError(f"method: {method!r} values the accuracy game from its expansion; the {name} books value "
                             "another game by the same method, which has no gradient and Hessian of its own: use an "
                             f"estimator of coalitions with {name}, or book no {name}.")
    check_expandable(utility, method)


def check_fixed_second_order(books: BookSettings, strategy: Strategy, utility: object) -> None:
    """ValueError naming ``fixed_second_order`` when the run books the fixed-weight game's second-order expansion
    (:mod:`fedvalue.rounds.kinds.fixed_second_order`) and cannot, before the run starts: the fixed-weight rule is
    defined for FedAvg's weighted mean only, and the expansion differentiates U twice."""
    if not books.fixed_second_order:
        return
    if not aggregates_by_weighted_mean(strategy):
        raise ValueError(f"fixed_second_order: expected an inner strategy that aggregates by FedAvg's weighted mean "
                         f"(FedAvg, FedProx: the fixed-weight coalition rule is defined for their family only); got "
                         f"{type(strategy).__name__}, which aggregates by its own code. Use such a strategy, or "
                         "leave fixed_second_order False.")
    got = expansion_shortfall(utility, "second-order")
    if got is not None:
        raise ValueError("fixed_second_order: expected a differentiable utility, with differentiable=True and "
                         "gradient() and hessian_vector_product() of U itself (TorchModelUtility with "
                         f"metric='neg_loss' or 'neg_mse'), to expand the fixed-weight round game; got {got}. Use "
                         "such a utility, or leave fixed_second_order False.")


def run_hooks(context: HookContext) -> dict[str, RoundHook]:
    """The run's hooks by name (each factory's, where the run keeps its kind); ValueError when the
    acceptance policy needs what no hook offers."""
    hooks = {name: hook for name, factory in ROUND_HOOKS.items() if (hook := factory(context)) is not None}
    offered = {offer for hook in hooks.values() for offer in hook.offers}
    for need in sorted(set(context.acceptance.needs) - offered):
        advice = OFFER_ADVICE.get(need, "register a round hook that offers it")
        raise ValueError(f"acceptance: the policy {context.acceptance!r} reads {need!r}, which no book of this run "
                         f"offers; {advice}.")
    return hooks
