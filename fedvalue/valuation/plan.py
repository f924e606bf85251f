"""The plan of an ADS call: which estimator runs, and how many distinct coalitions it may cost.

:func:`plan_ads` turns the settings (:class:`~fedvalue.valuation.settings.AdsSettings`) and the groups
into an :class:`AdsPlan` before any coalition is evaluated, so that a call over its
``max_evaluations`` or ``budget`` fails at once with the reason. Costs are distinct coalitions
from an empty cache ([ADS] Alg. 1: m* permutations of n players, each n marginals; exact: 1 +
Σ_t (2^{|D_t|} − 1) coalitions, Eq. 9); a cached coalition is free, so no sampler is planned
above exact's count.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from fedvalue.valuation.adaptive import minimum_coalitions, worst_coalitions
from fedvalue.valuation.settings import ADAPTIVE, EXPANSION_METHODS, AdsSettings

#: Groups larger than this are never enumerated: 2^25 coalitions already need GBs.
MAX_EXACT_GROUP_SIZE = 25
#: Coalitions an expansion method evaluates (:mod:`fedvalue.valuation.taylor`): the anchors v(∅) and v(I_t).
EXPANSION_COST = 2


def mc_num_permutations(num_players: int, epsilon: float, delta: float, r: float = 1.0) -> int:
    """m* = ⌈r²/(2ε²) · log(2n/δ)⌉ ([ADS], §5.1 and Alg. 1, line 2)."""
    return math.ceil(r * r / (2.0 * epsilon * epsilon) * math.log(2.0 * num_players / delta))


def exact_num_coalitions(groups: Sequence[Sequence[Hashable]]) -> int:
    """Distinct coalitions exact ADS evaluates: v(∅) plus 2^{|D_t|} − 1 per group."""
    return 1 + sum((1 << len(group)) - 1 for group in groups)


#: Samplers ``auto`` considers under a budget, in order: the first whose minimum fits is
#: taken (stratified only when its minimum is at most half the budget, so that it gets more
#: than its two samples). Measured on real FL rounds (``bench/large_rounds.py``).
BUDGET_SAMPLERS = ("stratified", "kernelshap", "mc")


def minimum_budget(method: str, size: int) -> int:
    """Distinct coalitions ``method`` needs for a group of ``size`` players, from an empty
    cache, to value every player with a standard error (two samples; KernelSHAP: 4·size
    pairs, below which its residuals, hence its errors, vanish)."""
    if method in ("mc", "tmc"):
        return 2 * size + 1
    if method == "antithetic":
        return 4 * size + 1
    if method == "stratified":
        return 2 * size * size + 2 * size + 2 + (4 * size * size if size > 4 else 0)
    if method == "kernelshap":
        return 8 * size + 2 if size > 1 else 2
    if method == ADAPTIVE:  # the exact end strata and every player's pilot (fedvalue.valuation.adaptive)
        return minimum_coalitions(size)
    raise ValueError(f"method: expected a sampling method; got {method!r}.")


def budget_method(method: str, sizes: Sequence[int], budget: int, exact_cost: int | None,
                  max_evaluations: int | None = None) -> str:
    """The method a ``budget`` of distinct evaluations runs: ``"auto"`` takes exact when its
    ``exact_cost`` fits, else the first of :data:`BUDGET_SAMPLERS` that fits; an explicit
    method is checked to fit. ValueError naming ``budget`` when nothing fits."""
    if max_evaluations is not None and budget > max_evaluations:
        raise ValueError(f"budget: {budget} evaluations asked for, more than max_evaluations={max_evaluations}.")
    if method in EXPANSION_METHODS:
        if budget < EXPANSION_COST:
            raise ValueError(f"budget: {method} evaluates the round's anchors v(∅) and v(I_t), {EXPANSION_COST} "
                             f"evaluations; the budget is {budget}. Raise it.")
        return method
    if method == "auto":
        if exact_cost is not None and exact_cost <= budget:
            return "exact"
        for candidate in BUDGET_SAMPLERS:
            need = sum(minimum_budget(candidate, size) for size in sizes)
            if need <= (budget // 2 if candidate == "stratified" else budget):
                return candidate
        method = BUDGET_SAMPLERS[-1]
    if method == "exact":
        if exact_cost is None or exact_cost > budget:
            raise ValueError(f"budget: exact ADS over groups of sizes {list(sizes)} needs "
                             f"{exact_cost or f'more than 2^{MAX_EXACT_GROUP_SIZE}'} evaluations; the budget is {budget}. Raise it or use "
                             "a sampling method (or 'auto').")
        return method
    need = sum(minimum_budget(method, size) for size in sizes)
    if need > budget:
        why = "its exact end strata and a pilot" if method == ADAPTIVE else "two samples, for a standard error"
        raise ValueError(f"budget: {method} needs at least {need} evaluations for groups of sizes {list(sizes)} "
                         f"({why}); the budget is {budget}. Raise it.")
    return method


@dataclass(frozen=True)
class AdsPlan:
    """What an ADS call runs.

    Attributes
    ----------
    method
        The estimator: ``"exact"`` or a sampler's name (``"auto"`` resolved).
    piloted
        A one-block pilot picks the sampler (``"auto"`` past exact, with a ``stderr_target``).
    planned
        Distinct coalitions announced to the game before the run (its worst case).
    m_star
        Alg. 1's permutation count for the settings' (ε, δ, r).
    caps
        Sample caps of the samplers that stop at m* (mc, antithetic, stratified).
    """

    method: str
    piloted: bool
    planned: int
    m_star: int
    caps: dict


def plan_expansion(settings: AdsSettings) -> int:
    """The coalitions an expansion method (:data:`~fedvalue.valuation.settings.EXPANSION_METHODS`) evaluates,
    :data:`EXPANSION_COST`: the anchors; ValueError naming ``budget`` or ``max_evaluations`` when they do not
    fit (with LOO, :func:`fedvalue.valuation.round_game.value_round` gives ADS the budget less LOO's n + 1)."""
    if settings.budget is not None:
        budget_method(settings.method, [], settings.budget, None, settings.max_evaluations)
    if settings.max_evaluations is not None and settings.max_evaluations < EXPANSION_COST:
        raise ValueError(f"max_evaluations: {settings.method} evaluates the round's anchors v(∅) and v(I_t), "
                         f"{EXPANSION_COST} evaluations; max_evaluations={settings.max_evaluations}. Raise it.")
    return EXPANSION_COST


def plan_ads(groups: Sequence[Sequence[Hashable]], settings: AdsSettings) -> AdsPlan:
    """The :class:`AdsPlan` of ADS over ``groups`` (validated) under ``settings``; ValueError
    naming ``method``, ``max_evaluations`` or ``budget`` when the call cannot fit (an expansion
    method is not planned here: :func:`plan_expansion`)."""
    if settings.method in EXPANSION_METHODS:
        raise ValueError(f"method: {settings.method!r} values a round of FedAvg's family from its structure (the "
                         "round game's expansion at A_{t−1}), which a game of coalition values does not hold; call "
                         "fedvalue.valuation.round_game.value_round on the game fedavg_round_game builds, or take an "
                         "estimator of coalitions ('auto', 'exact', 'mc', ...).")
    n = sum(len(g) for g in groups)
    largest = max(len(g) for g in groups)
    exact_cost = exact_num_coalitions(groups) if largest <= MAX_EXACT_GROUP_SIZE else None
    m_star = mc_num_permutations(n, settings.epsilon, settings.delta, settings.r)
    caps = {"mc": m_star, "antithetic": -(-m_star // 2), "stratified": max(2, m_star // (2 * largest))}
    if settings.budget is not None:
        method = budget_method(settings.method, [len(g) for g in groups], settings.budget, exact_cost,
                               settings.max_evaluations)
        return AdsPlan(method, False, exact_cost if method == "exact" else settings.budget, m_star, caps)
    if settings.method == ADAPTIVE:
        return AdsPlan(ADAPTIVE, False, _adaptive_worst(groups, settings, m_star), m_star, caps)
    # With the cache, MC never needs more distinct coalitions than exact would.
    mc_cost = m_star * n + 1 if exact_cost is None else min(m_star * n + 1, exact_cost)
    sampler_costs = _sampler_costs(groups, caps, m_star, exact_cost)
    method, piloted = _unbudgeted_method(settings, exact_cost, m_star * n)
    if method == "exact":
        _check_exact(groups, exact_cost, settings.max_evaluations)
        return AdsPlan(method, piloted, exact_cost, m_star, caps)
    if method in sampler_costs or piloted:
        # Piloted: every candidate's pilot plus the chosen one's rest, bounded by the sum.
        worst = min(exact_cost or math.inf, mc_cost + sum(sampler_costs.values())) if piloted \
            else sampler_costs[method]
        if settings.max_evaluations is not None and worst > settings.max_evaluations:
            raise ValueError(
                f"max_evaluations: ADS by {'a piloted sampler' if piloted else method} with epsilon="
                f"{settings.epsilon}, delta={settings.delta}, r={settings.r} may need {worst} utility evaluations, "
                f"more than max_evaluations={settings.max_evaluations}. Raise max_evaluations or epsilon."
            )
        return AdsPlan(method, piloted, worst, m_star, caps)
    if settings.max_evaluations is not None and mc_cost > settings.max_evaluations:  # mc; tmc never costs more
        raise ValueError(
            f"max_evaluations: MC-ADS with epsilon={settings.epsilon}, delta={settings.delta}, r={settings.r} "
            f"samples m*={m_star} permutations of {n} players and may need {mc_cost} utility evaluations, more "
            f"than max_evaluations={settings.max_evaluations}. Raise max_evaluations or epsilon."
        )
    return AdsPlan(method, piloted, mc_cost, m_star, caps)


def _sampler_costs(groups, caps: dict, m_star: int, exact_cost: int | None) -> dict[str, int]:
    """Each capped sampler's worst case from an empty cache, never above exact's."""
    costs = {
        "antithetic": sum(2 * caps["antithetic"] * max(len(g) - 1, 0) + 2 for g in groups),
        "stratified": sum(2 * len(g) ** 2 + 2 * len(g) + 2 + 2 * caps["stratified"] * len(g) ** 2 for g in groups),
        "kernelshap": sum(2 * -(-m_star * len(g) // 2) + 2 for g in groups),
    }
    return costs if exact_cost is None else {k: min(v, exact_cost) for k, v in costs.items()}


def _unbudgeted_method(settings: AdsSettings, exact_cost: int | None, mc_evaluations: int) -> tuple[str, bool]:
    """``"auto"`` without a budget: exact when it costs at most MC's m*·n evaluations (and fits
    ``max_evaluations``), else MC, piloted among the samplers with a ``stderr_target``."""
    if settings.method != "auto":
        return settings.method, False
    method = "exact" if exact_cost is not None and exact_cost <= mc_evaluations else "mc"
    if method == "exact" and settings.max_evaluations is not None and exact_cost > settings.max_evaluations:
        method = "mc"
    return method, method == "mc" and settings.stderr_target is not None


def _adaptive_worst(groups, settings: AdsSettings, m_star: int) -> int:
    """Adaptive MC-ADS's worst case, every player drawn to its cap (:mod:`fedvalue.valuation.adaptive`);
    ValueError naming ``max_evaluations`` when it does not fit."""
    worst = sum(worst_coalitions(len(g), m_star) for g in groups)
    if settings.max_evaluations is not None and worst > settings.max_evaluations:
        raise ValueError(
            f"max_evaluations: adaptive ADS with epsilon={settings.epsilon}, delta={settings.delta}, r={settings.r} "
            f"draws a player whose decision stays unsure up to the marginals Alg. 1's m*={m_star} permutations give "
            f"it, and may need {worst} utility evaluations, more than max_evaluations={settings.max_evaluations}. "
            "Raise max_evaluations or epsilon, or give a budget (adaptive ADS then stops when it is spent)."
        )
    return worst


def _check_exact(groups, exact_cost: int | None, max_evaluations: int | None) -> None:
    if exact_cost is None:
        raise ValueError(
            f"method: 'exact' enumerates 2^|D_t| coalitions per group, at most {MAX_EXACT_GROUP_SIZE} players "
            f"per group; a group has {max(len(g) for g in groups)}. Use method='mc' or 'auto'."
        )
    if max_evaluations is not None and exact_cost > max_evaluations:
        raise ValueError(
            f"max_evaluations: exact ADS over groups of sizes {[len(g) for g in groups]} needs {exact_cost} "
            f"utility evaluations, more than max_evaluations={max_evaluations}. Raise max_evaluations or use "
            "method='mc'."
        )
