"""The round game's coalition rule: ``fixed-weight`` values coalition S by U(A_{t−1} + Σ_{k∈S} p_k Δ_k) with the
round's FedAvg weights p_k (checked coalition by coalition against that closed form, on the plain and on the
fast linear path), keeps group efficiency against the realized step, and makes a reply equal to A_{t−1} a null
player; ``renormalized`` (the default) does not, which is why the rule is a setting."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fedvalue.scoring.torch_utilities import TorchModelUtility
from fedvalue.valuation.round_game import fedavg_round_game, round_game_for, value_round, weighted_mean
from fedvalue.valuation.settings import FIXED_WEIGHT, AdsSettings, ValuationSettings

EXACT = AdsSettings(method="exact")


def quadratic(target):
    def utility(arrays) -> float:
        return -float(sum(np.sum((arrays[k].astype(np.float64) - target[k]) ** 2) for k in target))
    return utility


def a_round(rng: np.random.Generator, n: int):
    start = {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)}
    replies = [{k: v + rng.normal(scale=0.5, size=v.shape) for k, v in start.items()} for _ in range(n)]
    weights = [float(w) for w in rng.integers(1, 20, size=n)]
    target = {k: v + rng.normal(size=v.shape) for k, v in start.items()}
    return start, replies, weights, target


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 5))
def test_every_coalition_is_the_start_plus_its_members_shares_of_the_round_step(seed, n):
    start, replies, weights, target = a_round(np.random.default_rng(seed), n)
    utility, total = quadratic(target), sum(weights)
    game = fedavg_round_game(list(range(n)), start, replies, weights, utility, FIXED_WEIGHT)
    for size in range(n + 1):
        for members in itertools.combinations(range(n), size):
            state = {k: start[k] + sum(weights[m] / total * (replies[m][k] - start[k]) for m in members)
                     for k in start}
            assert game.value(sum(1 << m for m in members)) == pytest.approx(utility(state), rel=1e-9, abs=1e-9)
    # The grand coalition is FedAvg's own aggregate: v(I_t) = U(A_t), to rounding under this rule.
    full = (1 << n) - 1
    assert game.value(full) == pytest.approx(utility(weighted_mean(replies, weights)), rel=1e-12, abs=1e-12)
    valuation = value_round(game, ("ads", "loo"), EXACT, seed=0)
    values = valuation.results["ads"].values
    assert values.sum() == pytest.approx(valuation.utility_after - valuation.utility_before, abs=1e-9)


def test_a_reply_that_returns_the_start_is_a_null_player_only_under_the_fixed_weight_rule():
    start, replies, weights, target = a_round(np.random.default_rng(3), 4)
    replies[2] = {k: v.copy() for k, v in start.items()}  # a free-rider: sends back what it received
    utility = quadratic(target)
    fixed = value_round(fedavg_round_game(list(range(4)), start, replies, weights, utility, FIXED_WEIGHT),
                        ("ads", "loo"), EXACT, seed=0)
    assert fixed.results["ads"].values[2] == 0.0 and fixed.results["loo"].values[2] == 0.0
    renormalized = value_round(fedavg_round_game(list(range(4)), start, replies, weights, utility),
                               ("ads", "loo"), EXACT, seed=0)
    assert renormalized.results["ads"].values[2] != 0.0  # it dilutes every coalition's step instead


def test_the_fast_linear_path_scores_fixed_weight_coalitions_as_the_plain_path():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(64, 4)).astype(np.float32), rng.integers(0, 3, size=64)
    utility = TorchModelUtility(model, x, y, metric="neg_loss")
    assert utility.supports_linear
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    replies = [{k: v + rng.normal(scale=0.3, size=v.shape).astype(v.dtype) for k, v in start.items()}
               for _ in range(4)]
    weights = [3.0, 1.0, 5.0, 2.0]
    fast = fedavg_round_game(list(range(4)), start, replies, weights, utility, FIXED_WEIGHT)
    plain = fedavg_round_game(list(range(4)), start, replies, weights, lambda arrays: utility(arrays), FIXED_WEIGHT)
    masks = range(16)
    assert [fast.value(m) for m in masks] == pytest.approx([plain.value(m) for m in masks], rel=1e-5)


def test_the_rule_is_checked_and_a_strategys_own_aggregation_takes_only_the_renormalized_one():
    with pytest.raises(ValueError, match=r"coalition_rule: expected one of \['renormalized', 'fixed-weight'\]; "
                                         r"got 'fixed'"):
        ValuationSettings(coalition_rule="fixed")
    start, replies, weights, target = a_round(np.random.default_rng(1), 2)
    with pytest.raises(ValueError, match="coalition_rule: 'fixed-weight' is defined for FedAvg's weighted mean"):
        round_game_for([0, 1], start, replies, weights, quadratic(target), aggregate=lambda c: start,
                       rule=FIXED_WEIGHT)
