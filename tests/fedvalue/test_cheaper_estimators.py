"""Truncated MC and the standard-error stop, checked against exact ADS (brute force)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fedvalue
from fedvalue.ads import mc_num_permutations
from fedvalue.game import CoalitionGame

from .reference_games import random_table_game


def saturating(cap: float):
    """v(S) = min(1, Σ_{i∈S} w_i / cap): full utility once a few players are in."""
    weights = {p: 0.2 + 0.1 * k for k, p in enumerate("abcdefgh")}
    return lambda S: min(1.0, sum(weights[p] for p in S) / cap)


def test_tmc_without_truncation_is_blockwise_mc_exactly():
    players = list("abcdef")
    game_a = random_table_game(players, seed=1)
    game_b = random_table_game(players, seed=1)
    truncated = fedvalue.ads(game_a, [players], method="tmc", truncation_tolerance=0.0, seed=7, epsilon=0.2)
    blockwise = fedvalue.ads(game_b, [players], method="mc", stderr_target=1e-12, seed=7, epsilon=0.2)
    np.testing.assert_array_equal(truncated.values, blockwise.values)
    assert truncated.num_permutations == blockwise.num_permutations == mc_num_permutations(6, 0.2, 0.05)


@pytest.mark.parametrize("groups", [[list("abcdefgh")], [list("abc"), list("defgh")]])
def test_tmc_on_a_saturating_game_is_close_to_exact_and_much_cheaper(groups):
    players = [p for g in groups for p in g]
    exact = fedvalue.ads(saturating(1.0), groups, method="exact")
    tolerance = 1e-3
    plain = fedvalue.ads(CoalitionGame(saturating(1.0), players), groups, method="mc", seed=3)
    truncated = fedvalue.ads(CoalitionGame(saturating(1.0), players), groups, method="tmc", seed=3,
                             truncation_tolerance=tolerance)
    # Within MC's own accuracy (ε = 0.1 at δ = 0.05) plus the truncation bias.
    assert float((truncated.values - exact.values).abs().max()) <= 0.1 + tolerance
    assert truncated.num_evaluations < plain.num_evaluations
    # Each permutation stops within the tolerance of v(U_t): the gap is below it.
    assert truncated.max_efficiency_gap < tolerance
    assert truncated.method == "ads-tmc"


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), tolerance=st.sampled_from([1e-4, 1e-2, 0.05]))
def test_tmc_efficiency_gap_is_bounded_by_the_tolerance(seed, tolerance):
    players = list("abcde")
    result = fedvalue.ads(random_table_game(players, seed=seed), [players], method="tmc", seed=seed,
                          truncation_tolerance=tolerance, epsilon=0.3)
    assert result.max_efficiency_gap < tolerance + 1e-12


def test_the_stderr_stop_ends_early_on_a_low_variance_game():
    players = list("abcdefgh")
    base = {p: 0.1 * (k + 1) for k, p in enumerate(players)}
    game = CoalitionGame(lambda S: sum(base[p] for p in S) + 0.01 * (len(S) >= 4), players)
    result = fedvalue.ads(game, [players], method="mc", stderr_target=0.002, seed=0)
    m_star = mc_num_permutations(8, 0.1, 0.05)
    assert result.num_permutations < m_star
    assert float(result.stderr.max()) <= 0.002
    exact = fedvalue.ads(CoalitionGame(game._utility, players), [players], method="exact")
    assert float((result.values - exact.values).abs().max()) < 5 * 0.002


def test_an_additive_game_stops_after_one_block_with_exact_values():
    players = list("abcdef")
    weights = dict(zip(players, [0.3, -0.1, 0.2, 0.05, 0.0, 0.4]))
    result = fedvalue.ads(lambda S: sum(weights[p] for p in S), [players], method="mc", stderr_target=1e-9, seed=0)
    assert result.num_permutations == 10  # one block of max(10, n)
    np.testing.assert_allclose(result.values.to_numpy(), [weights[p] for p in players], atol=1e-12)
    assert float(result.stderr.max()) < 1e-15  # zero up to the rounding of the sums


def test_cheaper_estimators_are_deterministic_and_never_chosen_by_auto():
    players = list("abcdef")
    first = fedvalue.ads(random_table_game(players, seed=4), [players], method="tmc", seed=11)
    second = fedvalue.ads(random_table_game(players, seed=4), [players], method="tmc", seed=11)
    np.testing.assert_array_equal(first.values, second.values)
    assert fedvalue.ads(random_table_game(players, seed=4), [players], stderr_target=0.1).method == "ads-exact"


@pytest.mark.parametrize("kwargs, fragment", [
    ({"truncation_tolerance": -1e-3}, "truncation_tolerance: expected a finite number ≥ 0"),
    ({"truncation_tolerance": float("nan")}, "truncation_tolerance"),
    ({"stderr_target": 0.0}, "stderr_target: expected a finite number > 0 or None"),
    ({"stderr_target": True}, "stderr_target"),
    ({"method": "gtg"}, "method: expected 'auto', 'exact', 'mc' or 'tmc'"),
])
def test_bad_options_name_the_parameter(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        fedvalue.ads(lambda S: 0.0, [["a", "b"]], **{"method": "tmc", **kwargs})


# --- the cache: one evaluation per distinct coalition, never more than 2^n -----------------

class RecordingGame(CoalitionGame):
    """A game that records every coalition mask any estimator asks it for."""

    def __init__(self, utility, players):
        super().__init__(utility, players)
        self.requested: list[int] = []

    def values(self, masks):
        masks = [int(m) for m in masks]
        self.requested += masks
        return super().values(masks)


@pytest.mark.parametrize("options", [
    {"method": "mc", "epsilon": 0.3},
    {"method": "mc", "epsilon": 0.05},
    {"method": "mc", "epsilon": 0.2, "stderr_target": 1e-9},
    {"method": "tmc", "epsilon": 0.2, "truncation_tolerance": 0.05},
    {"method": "tmc", "epsilon": 0.05, "truncation_tolerance": 0.0},
])
@pytest.mark.parametrize("groups", [[list("abcdef")], [list("ab"), list("cdef")]])
def test_sampling_estimators_evaluate_each_distinct_coalition_once(options, groups):
    from .reference_games import CountingUtility

    players = [p for g in groups for p in g]
    counting = CountingUtility(random_table_game(players, seed=9))
    game = RecordingGame(counting, players)
    result = fedvalue.ads(game, groups, seed=5, **options)
    distinct = set(game.requested)
    # Evaluations = distinct coalitions asked for = utility calls, each coalition once.
    assert result.num_evaluations == game.num_evaluations == game.num_cached == len(distinct)
    assert len(counting.calls) == len(set(counting.calls)) == len(distinct)
    # Never more than exact's coalitions (2^n for one group), however many permutations ran.
    assert len(distinct) <= fedvalue.exact_num_coalitions(groups) <= 2 ** len(players)
    assert len(game.requested) > len(distinct)  # the cache absorbed repeated prefixes


def test_every_estimator_on_one_game_shares_one_cache_of_2_to_the_n():
    from .reference_games import CountingUtility

    players = list("abcdef")
    counting = CountingUtility(random_table_game(players, seed=10))
    game = CoalitionGame(counting, players)
    fedvalue.ads(game, [players], method="mc", epsilon=0.05, seed=1)  # m* = 1,096 permutations
    assert game.num_evaluations == game.num_cached == 2 ** 6  # every subset is some prefix
    for run in (lambda: fedvalue.ads(game, [players], method="exact"),
                lambda: fedvalue.ads(game, [players], method="tmc", seed=2),
                lambda: fedvalue.ads(game, [players], method="mc", stderr_target=0.01, seed=3),
                lambda: fedvalue.loo(game, players)):
        assert run().num_evaluations == 0
    assert len(counting.calls) == len(set(counting.calls)) == 2 ** 6
