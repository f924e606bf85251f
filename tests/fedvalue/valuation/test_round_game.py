"""The round game v_t: FedAvg's rule exactly, ∅ and I_t anchored at A_{t−1} and the
aggregate, any aggregator in round order, and value_round against brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fedvalue.valuation.settings import AdsSettings
from fedvalue.valuation.round_game import fedavg_aggregator, round_game, round_rng, value_round, weighted_mean

from tests.fedvalue.reference_games import shapley_subset_formula


def client_arrays(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [{"w": rng.standard_normal(3).astype(np.float32), "b": rng.standard_normal(2)} for _ in range(n)]


def utility(arrays) -> float:
    """A smooth utility of the state with no special structure."""
    return float(np.tanh(arrays["w"].astype(np.float64)).sum() - 0.5 * np.square(arrays["b"]).sum())


def test_weighted_mean_is_fedavgs_rule_in_the_arrays_dtype():
    arrays, weights = client_arrays(3), [10.0, 30.0, 60.0]
    mean = weighted_mean(arrays, weights)
    assert mean["w"].dtype == np.float32 and mean["b"].dtype == np.float64
    expected = sum(a["b"] * (n / 100.0) for a, n in zip(arrays, weights))
    np.testing.assert_allclose(mean["b"], expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("weights, message", [([0.0, 0.0], "positive total weight"), ([], "at least one")])
def test_weighted_mean_refuses_what_it_cannot_average(weights, message):
    with pytest.raises(ValueError, match=message):
        weighted_mean(client_arrays(len(weights)), weights)


def test_the_game_is_anchored_at_the_start_state_and_the_full_aggregate():
    ids, arrays, weights = ["a", "b", "c"], client_arrays(3), [1.0, 2.0, 3.0]
    start = {"w": np.zeros(3, np.float32), "b": np.zeros(2)}
    game = round_game(ids, start, fedavg_aggregator(ids, arrays, weights), utility)
    before, after = game.values([0, game.full_mask])
    assert before == utility(start)
    assert after == utility(weighted_mean(arrays, weights))


def test_any_aggregator_sees_coalitions_in_round_order():
    seen = []

    def aggregate(coalition):
        seen.append(list(coalition))
        return {"w": np.full(3, float(len(coalition)), np.float32), "b": np.zeros(2)}

    ids = [7, 3, 5]
    game = round_game(ids, client_arrays(1)[0], aggregate, utility)
    game.values(range(1, 2 ** 3))
    assert sorted(map(tuple, seen)) == sorted(tuple(c for c in ids if c in s)
                                              for r in range(1, 4) for s in itertools.combinations(ids, r))
    assert all(s == sorted(s, key=ids.index) for s in seen)


def test_value_round_is_the_shapley_formula_and_loo_of_the_round_game():
    ids, arrays, weights = list(range(4)), client_arrays(4, seed=3), [5.0, 1.0, 2.0, 8.0]
    start = client_arrays(1, seed=9)[0]
    game = round_game(ids, start, fedavg_aggregator(ids, arrays, weights), utility)

    def v(coalition) -> float:
        members = [c for c in ids if c in coalition]
        return utility(weighted_mean([arrays[c] for c in members], [weights[c] for c in members]) if members
                       else start)

    valuation = value_round(game, settings=AdsSettings(method="exact"))
    reference = shapley_subset_formula(v, ids)
    ads = valuation.results["ads"].values
    for c in ids:
        assert ads[c] == pytest.approx(reference[c], abs=1e-12)
        assert valuation.results["loo"].values[c] == pytest.approx(v(set(ids)) - v(set(ids) - {c}), abs=1e-12)
    assert math.isclose(sum(ads), valuation.utility_after - valuation.utility_before, abs_tol=1e-12)
    assert valuation.num_evaluations == 2 ** 4


def test_round_generators_are_fixed_by_seed_and_round():
    draw = lambda seed, t: round_rng(seed, t).integers(0, 2**32, size=4).tolist()  # noqa: E731
    assert draw(0, 3) == draw(0, 3)
    assert len({tuple(draw(s, t)) for s in range(3) for t in range(1, 4)}) == 9


def test_value_round_refuses_unknown_methods_and_settings():
    game = round_game([0], client_arrays(1)[0], lambda c: client_arrays(1)[0], utility)
    with pytest.raises(ValueError, match=r"methods: expected a subset of .*; got unknown \['shap'\]"):
        value_round(game, ["shap"])
    with pytest.raises(TypeError, match="settings: expected a fedvalue.valuation.settings.AdsSettings or None; got dict"):
        value_round(game, settings={"method": "exact"})
