"""Within-round LOO on games with known answers, and its cache shared with ADS."""

from __future__ import annotations

import numpy as np

import fedvalue
from fedvalue import CoalitionGame

from tests.fedvalue.reference_games import CountingUtility, random_table_game


def test_loo_additive_game_gives_weights():
    weights = {"a": 1.0, "b": -2.0, "c": 0.25}
    result = fedvalue.loo(lambda s: sum(weights[p] for p in s), list(weights))
    np.testing.assert_allclose(result.values.loc[list(weights)], list(weights.values()))
    assert result.num_evaluations == 4
    assert result.method == "loo"


def test_loo_of_substitutes_is_zero_and_of_complements_is_full():
    # Two perfect substitutes: dropping either loses nothing.
    substitutes = fedvalue.loo(lambda s: float(bool(s & {"a", "b"})), ["a", "b"])
    assert substitutes.values.tolist() == [0.0, 0.0]
    # Perfect complements: dropping either loses everything.
    complements = fedvalue.loo(lambda s: float({"a", "b"} <= s), ["a", "b"])
    assert complements.values.tolist() == [1.0, 1.0]


def test_ads_and_loo_share_evaluations_on_one_game():
    players = [f"p{k}" for k in range(5)]
    counting = CountingUtility(random_table_game(players, seed=2))
    game = CoalitionGame(counting, players)
    loo_result = fedvalue.loo(game, players)
    assert loo_result.num_evaluations == len(players) + 1
    ads_result = fedvalue.ads(game, [players], method="exact")
    assert ads_result.num_evaluations == 2 ** 5 - (len(players) + 1)
    assert fedvalue.loo(game, players).num_evaluations == 0
    assert len(counting.calls) == len(set(counting.calls)) == 2 ** 5 == game.num_cached


def test_loo_on_a_sub_coalition_of_a_larger_game():
    game = CoalitionGame(lambda s: float(len(s) ** 2), list("abcd"))
    result = fedvalue.loo(game, ["a", "b"])
    assert result.values.tolist() == [3.0, 3.0]  # 4 − 1
