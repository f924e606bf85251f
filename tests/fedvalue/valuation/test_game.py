"""The coalition game: what a utility may return, the cache after a failure, players."""

from __future__ import annotations

import math

import pytest

import fedvalue
from fedvalue import CoalitionGame


square = lambda s: float(len(s) ** 2)  # noqa: E731


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

