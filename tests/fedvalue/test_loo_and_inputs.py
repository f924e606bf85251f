"""LOO on games with known answers, cache sharing with ADS, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fedvalue
from fedvalue import CoalitionGame

from .reference_games import CountingUtility, random_table_game


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


# --- bad input ----------------------------------------------------------------------------

square = lambda s: float(len(s) ** 2)  # noqa: E731


@pytest.mark.parametrize(
    "groups, error, fragment",
    [
        ([], ValueError, "at least one group"),
        ([["a"], []], ValueError, "group 1 is empty"),
        ([["a", "b"], ["b"]], ValueError, "'b' is in group 1 and also in group 0"),
        ([["a", "a"]], ValueError, "twice"),
        (["abc"], TypeError, "group 0 is 'abc'"),
        ("abc", TypeError, "groups: expected a sequence of groups"),
        ([[["unhashable"]]], TypeError, "hashable"),
    ],
)
def test_bad_groups(groups, error, fragment):
    with pytest.raises(error, match="groups") as info:
        fedvalue.ads(square, groups)
    assert fragment in str(info.value)


@pytest.mark.parametrize("epsilon", [0, -0.1, float("nan"), "0.1"])
def test_bad_epsilon(epsilon):
    with pytest.raises(ValueError, match="epsilon: expected a finite number > 0"):
        fedvalue.ads(square, [["a"]], epsilon=epsilon)


@pytest.mark.parametrize("delta", [0, 1, 1.5, -0.2])
def test_bad_delta(delta):
    with pytest.raises(ValueError, match=r"delta: expected a number in the open interval \(0, 1\)"):
        fedvalue.ads(square, [["a"]], delta=delta)


def test_unknown_method():
    with pytest.raises(ValueError, match="method: expected 'auto', 'exact', 'mc' or 'tmc'; got 'shapley'"):
        fedvalue.ads(square, [["a"]], method="shapley")


@pytest.mark.parametrize("bad_value", [math.nan, math.inf, None, "0.5", True])
def test_utility_returning_a_non_number_or_nan(bad_value):
    with pytest.raises((TypeError, ValueError), match="utility must return") as info:
        fedvalue.ads(lambda s: bad_value if len(s) == 2 else 0.0, [["a", "b"]], method="exact")
    assert "'a', 'b'" in str(info.value)


def test_failed_batch_leaves_cache_clean():
    calls = {"n": 0}

    def flaky(s):
        calls["n"] += 1
        return math.nan if calls["n"] == 3 else 1.0

    game = CoalitionGame(flaky, ["a", "b"])
    with pytest.raises(ValueError):
        fedvalue.ads(game, [["a", "b"]], method="exact")
    assert game.num_cached == 0 and game.num_evaluations == 0


def test_exact_over_max_evaluations_is_refused():
    with pytest.raises(ValueError, match=r"max_evaluations: exact ADS .* needs 1024 utility evaluations"):
        fedvalue.ads(square, [[f"p{k}" for k in range(10)]], method="exact", max_evaluations=100)


def test_exact_on_a_group_too_large_to_enumerate_is_refused():
    players = [f"p{k}" for k in range(fedvalue.MAX_EXACT_GROUP_SIZE + 1)]
    with pytest.raises(ValueError, match="method: 'exact' enumerates"):
        fedvalue.ads(square, [players], method="exact")


def test_mc_over_max_evaluations_is_refused():
    with pytest.raises(ValueError, match="max_evaluations: MC-ADS"):
        fedvalue.ads(square, [[f"p{k}" for k in range(30)]], method="mc", epsilon=0.01, max_evaluations=50)


@pytest.mark.parametrize("max_evaluations", [0, -3, 2.5, True])
def test_bad_max_evaluations(max_evaluations):
    with pytest.raises(ValueError, match="max_evaluations: expected a positive integer"):
        fedvalue.ads(square, [["a"]], max_evaluations=max_evaluations)


@pytest.mark.parametrize("seed", [-1, 1.5, "x"])
def test_bad_seed(seed):
    with pytest.raises(ValueError, match="seed: expected"):
        fedvalue.ads(square, [["a"]], method="mc", seed=seed)


def test_non_callable_utility():
    with pytest.raises(TypeError, match="utility: expected a callable"):
        fedvalue.ads(3.0, [["a"]])
    with pytest.raises(TypeError, match="utility: expected a callable"):
        fedvalue.loo("not a function", ["a"])


def test_game_missing_a_player():
    game = CoalitionGame(square, ["a", "b"])
    with pytest.raises(ValueError, match="player 'c' is not a player of this game"):
        fedvalue.ads(game, [["a", "c"]])


def test_batch_utility_with_wrong_length():
    game = CoalitionGame(None, ["a", "b"], batch_utility=lambda cs: [0.0])
    with pytest.raises(ValueError, match="batch_utility must return one value per coalition"):
        fedvalue.ads(game, [["a", "b"]], method="exact")


def test_result_frame_and_gap():
    result = fedvalue.ads(square, [["a", "b"], ["c"]], method="exact")
    frame = result.to_frame()
    assert list(frame.columns) == ["value", "stderr", "group", "method"]
    assert frame.loc["c", "group"] == 1
    assert frame.loc["c", "value"] == pytest.approx(9 - 4)
    assert result.prefix_utilities == (0.0, 4.0, 9.0)
    assert math.isnan(fedvalue.loo(square, ["a", "b"]).max_efficiency_gap)


def test_ads_settings_are_checked_once_when_made_and_cannot_change():
    import dataclasses

    from fedvalue import AdsSettings

    with pytest.raises(ValueError, match="method: expected 'auto', 'exact', 'mc' or 'tmc'; got 'bogus'"):
        AdsSettings(method="bogus")
    with pytest.raises(ValueError, match="stderr_target: expected a finite number > 0 or None"):
        AdsSettings(stderr_target=0.0)
    with pytest.raises(ValueError, match="max_evaluations: expected a positive integer or None"):
        AdsSettings(max_evaluations=0)
    settings = AdsSettings(method="mc", epsilon=0.2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.epsilon = 0.5
    assert AdsSettings(**settings.as_keywords()) == settings  # the round record's round trip
