"""The first- and second-order expansions of the round game (:mod:`fedvalue.valuation.taylor`): on a utility
exactly linear, or exactly quadratic, in the arrays the expanded game IS the round game, so exact ADS (the
subset form over every coalition) must equal the expansion's value to float precision, under both coalition
rules; the renormalized first-order game has a closed form with equal weights; the estimates are efficient
for the expanded game, symmetric, and a null player under the fixed-weight rule gets 0.0; and what cannot be
expanded is refused, naming the parameter."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fedvalue.valuation.ads import ads
from fedvalue.valuation.plan import budget_method
from fedvalue.valuation.round_game import fedavg_aggregator, fedavg_round_game, round_game_for, value_round
from fedvalue.valuation.settings import COALITION_RULES, FIXED_WEIGHT, RENORMALIZED, AdsSettings
from fedvalue.valuation.taylor import FedAvgRound, MAX_ENUMERATED_PLAYERS, expansion_values, renormalized_shapley

EXACT = AdsSettings(method="exact")
KEYS = {"w": (3, 2), "b": (2,)}
SIZE = 8


def flat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[k], dtype=np.float64).ravel() for k in KEYS])


def shaped(vector: np.ndarray) -> dict:
    return {"w": vector[:6].reshape(3, 2), "b": vector[6:].copy()}


class PolynomialUtility:
    """U(x) = c·x + xᵀQx + b over the flattened arrays, with its exact gradient c + (Q + Qᵀ)x and Hessian Q + Qᵀ
    (Q = 0: linear)."""

    differentiable = True

    def __init__(self, c: np.ndarray, q: np.ndarray, b: float) -> None:
        self.c, self.q, self.b = c, q, b

    def __call__(self, arrays) -> float:
        x = flat(arrays)
        return float(self.c @ x + x @ self.q @ x + self.b)

    def gradient(self, arrays) -> dict:
        return shaped(self.c + (self.q + self.q.T) @ flat(arrays))

    def hessian_vector_product(self, arrays, vector) -> dict:
        return shaped((self.q + self.q.T) @ flat(vector))


def distance_utility(target: dict) -> PolynomialUtility:
    """U(x) = −‖x − target‖², as c·x + xᵀQx + b."""
    t = flat(target)
    return PolynomialUtility(2 * t, -np.eye(SIZE), -float(t @ t))


def a_round(seed: int, n: int, *, free_rider: bool = True, equal: bool = False):
    rng = np.random.default_rng(seed)
    start = {k: rng.normal(size=s) for k, s in KEYS.items()}
    replies = [{k: v + rng.normal(scale=0.7, size=v.shape) for k, v in start.items()} for _ in range(n)]
    if free_rider:
        replies[n // 2] = {k: v.copy() for k, v in start.items()}
    weights = [1.0] * n if equal else [float(w) for w in rng.integers(1, 30, size=n)]
    return rng, start, replies, weights


def values_by(method, rule, start, replies, weights, utility, methods=("ads",)):
    game = fedavg_round_game(list(range(len(replies))), start, replies, weights, utility, rule)
    return value_round(game, methods, AdsSettings(method=method), seed=0)


@pytest.mark.parametrize("rule", COALITION_RULES)
@pytest.mark.parametrize("seed", range(4))
def test_on_a_linear_utility_both_orders_are_exact_shapley(rule, seed):
    rng, start, replies, weights = a_round(seed, 6)
    utility = PolynomialUtility(rng.normal(size=SIZE), np.zeros((SIZE, SIZE)), 0.4)
    exact = values_by("exact", rule, start, replies, weights, utility).results["ads"].values.to_numpy()
    for method in ("first-order", "second-order"):
        found = values_by(method, rule, start, replies, weights, utility).results["ads"]
        assert found.method == f"ads-{method}"
        np.testing.assert_allclose(found.values.to_numpy(), exact, rtol=0, atol=1e-12)
        assert found.max_efficiency_gap < 1e-12  # the linear game is its own expansion


@pytest.mark.parametrize("rule", COALITION_RULES)
@pytest.mark.parametrize("seed", range(4))
def test_on_a_quadratic_utility_the_second_order_value_is_exact_shapley(rule, seed):
    rng, start, replies, weights = a_round(seed, 6)
    target = {k: v + rng.normal(size=v.shape) for k, v in start.items()}
    general = rng.normal(size=(SIZE, SIZE))
    for utility in (distance_utility(target), PolynomialUtility(rng.normal(size=SIZE), general, -1.0)):
        exact = values_by("exact", rule, start, replies, weights, utility).results["ads"].values.to_numpy()
        second = values_by("second-order", rule, start, replies, weights, utility).results["ads"]
        np.testing.assert_allclose(second.values.to_numpy(), exact, rtol=0, atol=1e-11 * max(1, np.abs(exact).max()))
        assert second.max_efficiency_gap < 1e-10 * max(1, np.abs(exact).sum())
        first = values_by("first-order", rule, start, replies, weights, utility).results["ads"]
        assert np.abs(first.values.to_numpy() - exact).max() > 1e-6  # first order misses the curvature


def test_the_fixed_weight_closed_forms_are_the_formulas():
    """φ_k = p_k g·Δ_k and φ_k = u_k·(g + ½ H U), written out against the expansion's own code."""
    rng, start, replies, weights = a_round(11, 5)
    utility = PolynomialUtility(rng.normal(size=SIZE), rng.normal(size=(SIZE, SIZE)), 0.0)
    p = np.asarray(weights) / sum(weights)
    g, a0 = utility.gradient(start), flat(start)
    u = [p_k * (flat(r) - a0) for p_k, r in zip(p, replies)]
    hessian = utility.q + utility.q.T
    step = sum(u)
    structure = FedAvgRound(tuple(range(5)), start, tuple(replies), tuple(weights), utility, FIXED_WEIGHT)
    first, stderr, _ = expansion_values(structure, "first-order")
    second, _, _ = expansion_values(structure, "second-order")
    np.testing.assert_allclose(first, [flat(g) @ u_k for u_k in u], rtol=1e-13)
    np.testing.assert_allclose(second, [u_k @ (flat(g) + 0.5 * hessian @ step) for u_k in u], rtol=1e-12)
    assert stderr.tolist() == [0.0] * 5


def harmonic(n: int) -> float:
    return sum(1.0 / k for k in range(1, n + 1))


@pytest.mark.parametrize("n", [1, 2, 3, 7, 12])
def test_the_renormalized_first_order_game_with_equal_weights_has_its_closed_form(n):
    """v̂(S) − v(∅) = mean_{k∈S} a_k: φ_k = (1/n)[a_k + (H_n − 1)(a_k − mean_{j≠k} a_j)]."""
    a = np.random.default_rng(n).normal(size=n)
    found, stderr, permutations = renormalized_shapley(a, np.ones(n), None)
    expected = [a[0]] if n == 1 else [(a[k] + (harmonic(n) - 1) * (a[k] - np.delete(a, k).mean())) / n
                                      for k in range(n)]
    np.testing.assert_allclose(found, expected, rtol=0, atol=1e-14)
    assert permutations is None and not stderr.any()


def test_past_enumeration_the_scalar_game_is_sampled_with_the_round_generator():
    n = MAX_ENUMERATED_PLAYERS + 4
    a = np.random.default_rng(3).normal(size=n)
    expected = np.array([(a[k] + (harmonic(n) - 1) * (a[k] - np.delete(a, k).mean())) / n for k in range(n)])
    sampled = AdsSettings(epsilon=0.02)
    one, stderr, permutations = renormalized_shapley(a, np.ones(n), None, sampled, np.random.default_rng([5, 1]))
    again, _, _ = renormalized_shapley(a, np.ones(n), None, sampled, np.random.default_rng([5, 1]))
    assert one.tolist() == again.tolist() and permutations > 1000
    assert np.all(stderr > 0)
    assert np.abs(one - expected).max() < 5 * stderr.max()
    assert abs(one.sum() - a.mean()) < 1e-12  # every permutation's marginals sum to v̂(I) − v(∅)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 7), st.sampled_from(COALITION_RULES),
       st.sampled_from(["first-order", "second-order"]))
def test_the_estimates_are_efficient_for_the_expanded_game(seed, n, rule, method):
    rng, start, replies, weights = a_round(seed, n)
    utility = PolynomialUtility(rng.normal(size=SIZE), rng.normal(size=(SIZE, SIZE)), 0.0)
    structure = FedAvgRound(tuple(range(n)), start, tuple(replies), tuple(weights), utility, rule)
    values, _, _ = expansion_values(structure, method)
    g, a0 = flat(utility.gradient(start)), flat(start)
    shares = np.asarray(weights) / sum(weights)
    x = sum(s * (flat(r) - a0) for s, r in zip(shares, replies))  # x_I: the same step under both rules
    expanded = g @ x + (0.5 * x @ (utility.q + utility.q.T) @ x if method == "second-order" else 0.0)
    assert abs(values.sum() - expanded) <= 1e-10 * max(1.0, np.abs(values).sum())


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(4, 7), st.sampled_from(COALITION_RULES),
       st.sampled_from(["first-order", "second-order"]))
def test_two_equal_replies_of_equal_weight_get_equal_values_and_a_free_rider_is_null_under_fixed_weight(
        seed, n, rule, method):
    rng, start, replies, weights = a_round(seed, n)  # reply n // 2 ≥ 2 is a free-rider's
    replies[1] = {k: v.copy() for k, v in replies[0].items()}
    weights[1] = weights[0]
    utility = PolynomialUtility(rng.normal(size=SIZE), rng.normal(size=(SIZE, SIZE)), 0.0)
    values, _, _ = expansion_values(FedAvgRound(tuple(range(n)), start, tuple(replies), tuple(weights), utility,
                                                rule), method)
    assert abs(values[0] - values[1]) <= 1e-12 * max(1.0, np.abs(values).max())
    if rule == FIXED_WEIGHT:
        assert values[n // 2] == 0.0  # Δ = 0: a null player of the expanded game, exactly


def test_the_anchors_are_all_that_is_evaluated_and_the_gap_is_the_remainder():
    rng, start, replies, weights = a_round(2, 5)
    target = {k: v + rng.normal(size=v.shape) for k, v in start.items()}
    quadratic = distance_utility(target)
    calls = []

    class Counted(PolynomialUtility):
        def __call__(self, arrays):
            calls.append(1)
            return super().__call__(arrays)

    utility = Counted(quadratic.c, quadratic.q, quadratic.b)
    valuation = values_by("first-order", RENORMALIZED, start, replies, weights, utility, ("ads", "loo"))
    result = valuation.results["ads"]
    assert result.num_evaluations == 2 and valuation.num_evaluations == 2 + 5 == len(calls)  # LOO: I∖{i} each
    gain = valuation.utility_after - valuation.utility_before
    assert result.efficiency_gaps.iloc[0] == pytest.approx(result.values.sum() - gain, abs=1e-12)
    shares = np.asarray(weights) / sum(weights)
    step = sum(s * (flat(r) - flat(start)) for s, r in zip(shares, replies))
    assert result.efficiency_gaps.iloc[0] == pytest.approx(step @ step, rel=1e-9)  # −½ xᵀHx, H = −2I: the remainder
    assert result.prefix_utilities == (valuation.utility_before, valuation.utility_after)
    assert result.stderr.tolist() == [0.0] * 5


def test_a_budget_counts_the_anchors_and_loos_coalitions():
    assert budget_method("first-order", [10], 2, None) == "first-order"
    with pytest.raises(ValueError, match="budget: first-order evaluates the round's anchors"):
        budget_method("first-order", [10], 1, None)
    rng, start, replies, weights = a_round(4, 4)
    utility = PolynomialUtility(rng.normal(size=SIZE), np.zeros((SIZE, SIZE)), 0.0)
    game = fedavg_round_game(list(range(4)), start, replies, weights, utility)
    assert value_round(game, ("ads", "loo"), AdsSettings(method="first-order", budget=8)).num_evaluations == 6
    game = fedavg_round_game(list(range(4)), start, replies, weights, utility)
    with pytest.raises(ValueError, match="budget: first-order evaluates the round's anchors"):
        value_round(game, ("ads", "loo"), AdsSettings(method="first-order", budget=6))  # 6 − (n + 1) < 2


def test_what_cannot_be_expanded_is_refused_naming_the_method():
    rng, start, replies, weights = a_round(5, 3)
    utility = PolynomialUtility(rng.normal(size=SIZE), np.zeros((SIZE, SIZE)), 0.0)
    ids = list(range(3))
    own_code = round_game_for(ids, start, replies, weights, utility, aggregate=fedavg_aggregator(ids, replies, weights))
    with pytest.raises(ValueError, match="method: 'first-order' values a round of FedAvg's family from its structure"):
        value_round(own_code, ("ads",), AdsSettings(method="first-order"))
    with pytest.raises(ValueError, match="method: 'second-order' values a round of FedAvg's family"):
        ads(lambda s: float(len(s)), [ids], method="second-order")

    def plain(arrays) -> float:
        return float(flat(arrays).sum())
    with pytest.raises(ValueError, match=r"method: 'second-order' expands the round game .* got function \(no gradient, "
                                         r"hessian_vector_product\)"):
        value_round(fedavg_round_game(ids, start, replies, weights, plain), ("ads",), AdsSettings(method="second-order"))


def test_settings_name_the_expansion_methods():
    assert AdsSettings(method="second-order").as_dict()["method"] == "second-order"
    with pytest.raises(ValueError, match="method: expected 'auto', .* got 'third-order' \\(a round of FedAvg's family "
                                         "also takes 'first-order' or 'second-order'\\)"):
        AdsSettings(method="third-order")
    assert math.isclose(harmonic(3), 11 / 6)
