"""Adaptive MC-ADS against references: closed forms (additive and glove games), weighted majority and
random games valued exactly by the project's exact path, and fixed MC-ADS with the same standard-error
target. The decisions it settles are the exact values' own, it spends its evaluations where the decision
is unsure, it is the same for the same seed, its booked ±2 standard errors hold the exact values over
many seeds, its budget is a hard cap, and bad settings are refused with the field named
(:mod:`fedvalue.valuation.adaptive`)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import fedvalue
from fedvalue.run.settings import RoundSettings
from fedvalue.valuation.adaptive import (Decision, adaptive_ads, look_quantile, look_schedule,
                                         minimum_coalitions)
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.plan import mc_num_permutations
from fedvalue.valuation.settings import ADAPTIVE_FIELDS, AdsSettings

from tests.fedvalue.reference_games import random_table_game, shapley_subset_formula


def threshold(cut: float = 0.0, **keywords) -> AdsSettings:
    return AdsSettings(method="adaptive", decision="threshold", cut=cut, **keywords)


def table_game(table: np.ndarray, n: int) -> CoalitionGame:
    """The game whose coalition of bit mask s is worth ``table[s]`` (player k at bit k)."""
    return CoalitionGame(None, list(range(n)), batch_utility=lambda coalitions: [
        float(table[sum(1 << p for p in c)]) for c in coalitions])


def near_additive_table(n: int, seed: int, near: int = 2) -> np.ndarray:
    """v(S) = Σ_{i∈S} a_i + Σ_{i<j∈S} b_ij + ε_S: most |a_i| in [0.3, 1] (far from a cut at 0), the first
    ``near`` within 0.05 of it; small pairwise terms and a small independent term per coalition."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.3, 1.0, n) * rng.choice([-1.0, 1.0], n)
    a[:near] = rng.uniform(-0.05, 0.05, near)
    b = np.triu(rng.normal(0.0, 0.05, (n, n)), 1)
    bits = ((np.arange(1 << n)[:, None] >> np.arange(n)) & 1).astype(float)
    return bits @ a + np.einsum("si,ij,sj->s", bits, b, bits) + rng.normal(0.0, 0.05, 1 << n)


def exact_values(game: CoalitionGame, n: int) -> np.ndarray:
    return fedvalue.ads(game, [list(range(n))], method="exact").values.to_numpy()


# --- closed forms ----------------------------------------------------------------------------

def test_an_additive_game_is_valued_exactly_settled_at_the_pilot():
    a = np.linspace(-1.0, 1.0, 10)  # every marginal of player i is a_i: no draw varies
    result = fedvalue.ads(lambda s: float(sum(a[list(s)])), [list(range(10))], threshold(), seed=0)
    np.testing.assert_allclose(result.values.to_numpy(), a, atol=1e-12)
    assert (result.stderr <= 1e-12).all() and result.settled.all() and result.method == "ads-adaptive"
    assert result.num_evaluations <= minimum_coalitions(10)


def test_a_glove_game_takes_its_closed_form():
    """One left glove, nine right: v(S) = min(|S ∩ L|, |S ∩ R|); φ_left = 9/10, φ_right = 1/90 each. A right
    glove adds value only right after the left one alone (position 1, exact); every sampled position of the
    others is 0 or 1 for sure, so the values are exact and every player is settled against a cut of 0.05."""
    def glove(coalition: frozenset) -> float:
        return float(min(int(0 in coalition), len(coalition - {0})))

    players = list(range(10))
    result = fedvalue.ads(glove, [players], threshold(0.05), seed=1)
    expected = shapley_subset_formula(glove, players)
    assert expected[0] == pytest.approx(0.9) and expected[1] == pytest.approx(1 / 90)
    np.testing.assert_allclose(result.values.to_numpy(), [expected[p] for p in players], atol=1e-12)
    assert result.settled.all()


# --- decisions -------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_the_threshold_decisions_it_settles_are_the_exact_values_own(seed):
    n = 12
    game = table_game(near_additive_table(n, seed), n)
    exact = exact_values(game, n)
    result = fedvalue.ads(table_game(near_additive_table(n, seed), n), [list(range(n))], threshold(), seed=seed)
    values, settled = result.values.to_numpy(), result.settled.to_numpy()
    assert (np.sign(values[settled]) == np.sign(exact[settled])).all()
    clear = np.abs(exact) >= 0.2  # a clear margin from the cut: every such player is settled
    assert settled[clear].all() and clear.sum() >= n // 2
    assert abs(result.max_efficiency_gap) < 1e-12  # projected onto Σφ = v(I_t) − v(∅)


def weighted_majority(weights: list[int], quota: int):
    """v(S) = 1 when the weights of S reach ``quota``, else 0: every marginal is 0 or 1."""
    weights = np.asarray(weights)
    return lambda coalition: float(weights[list(coalition)].sum() >= quota)


def test_the_top_k_decisions_it_settles_are_the_exact_top_k_of_a_weighted_majority_game():
    players = list(range(12))
    vote = weighted_majority([9, 8, 7, 2, 2, 1, 1, 1, 1, 1, 1, 1], 18)
    exact = fedvalue.ads(vote, [players], method="exact").values.to_numpy()
    top = np.zeros(len(players), dtype=bool)
    top[np.argsort(-exact, kind="stable")[:3]] = True
    result = fedvalue.ads(vote, [players], AdsSettings(method="adaptive", decision="top-k", top_k=3), seed=2)
    settled = result.settled.to_numpy()
    assert Decision("top-k", None, 3, 2.0).top_mask(result.values.to_numpy())[settled].tolist() == \
        top[settled].tolist()
    assert settled[top].all()  # the three heaviest voters are clear of the rest


def test_it_spends_draws_only_where_the_decision_is_unsure():
    n = 14
    game = table_game(near_additive_table(n, 5, near=2), n)
    exact = exact_values(game, n)
    game = table_game(near_additive_table(n, 5, near=2), n)
    players = np.arange(n)
    found = adaptive_ads(game, [0, game.full_mask], [players], Decision("threshold", 0.0, None, 2.0),
                         mc_num_permutations(n, 0.1, 0.05), np.random.default_rng(0))
    pilot = look_schedule(n, mc_num_permutations(n, 0.1, 0.05))[0]
    far = np.abs(exact) >= 0.2
    assert (found.draws[far] == pilot).all()  # settled at the pilot: nothing more spent on them
    assert (found.draws[~far] > pilot).any() and found.looks > 1


@pytest.mark.parametrize("n, target", [(16, 0.01)])
def test_it_spends_fewer_evaluations_than_fixed_mc_with_the_same_target_when_most_players_are_far(n, target):
    table = near_additive_table(n, 0)
    exact = exact_values(table_game(table, n), n)
    for seed in range(2):
        mc = fedvalue.ads(table_game(table, n), [list(range(n))], method="mc", stderr_target=target, seed=seed)
        adaptive = fedvalue.ads(table_game(table, n), [list(range(n))], threshold(stderr_target=target), seed=seed)
        assert adaptive.num_evaluations <= 0.6 * mc.num_evaluations, (adaptive.num_evaluations, mc.num_evaluations)
        values, settled = adaptive.values.to_numpy(), adaptive.settled.to_numpy()
        assert settled.sum() >= n - 1 and (np.sign(values[settled]) == np.sign(exact[settled])).all()
        unsettled = ~settled  # a player left unsure stopped at the target
        assert (adaptive.stderr.to_numpy()[unsettled] <= target).all()


# --- determinism, coverage, budget -------------------------------------------------------------

def test_the_same_seed_gives_the_same_values_draws_and_evaluations():
    n = 10
    players = list(range(n))
    settings = AdsSettings(method="adaptive", decision="top-k", top_k=4)
    first = fedvalue.ads(random_table_game(players, 3), [players], settings, seed=7)
    again = fedvalue.ads(random_table_game(players, 3), [players], settings, seed=np.random.default_rng(7))
    np.testing.assert_array_equal(first.values, again.values)
    np.testing.assert_array_equal(first.stderr, again.stderr)
    assert first.settled.equals(again.settled) and first.num_evaluations == again.num_evaluations
    other = fedvalue.ads(random_table_game(players, 3), [players], settings, seed=8)
    assert not np.array_equal(first.values, other.values)


@pytest.mark.parametrize("settings", [AdsSettings(method="adaptive", decision="top-k", top_k=3), threshold(0.05)])
def test_two_booked_standard_errors_hold_the_exact_values_of_a_weighted_majority_game(settings):
    """0/1 marginals, a pivot rare at most positions: a bin's few draws often agree by chance."""
    players = list(range(12))
    vote = weighted_majority([6, 5, 4, 3, 2, 2, 1, 1, 1, 1, 1, 1], 15)
    exact = fedvalue.ads(vote, [players], method="exact").values.to_numpy()
    held = []
    for seed in range(60):
        result = fedvalue.ads(vote, [players], settings, seed=seed)
        held += list(np.abs(result.values.to_numpy() - exact) <= 2 * result.stderr.to_numpy())
    assert np.mean(held) >= 0.93, np.mean(held)


@pytest.mark.parametrize("kind", ["random", "near-additive"])
def test_two_booked_standard_errors_hold_the_exact_values_over_many_seeds(kind):
    """The cut is the median exact value, so half the players sit near it and are drawn over several looks,
    where stopping on an interval costs coverage most; the booked se, widened for the looks, holds."""
    n, held = 10, []
    for game_seed in range(20):
        table = (np.random.default_rng(game_seed).uniform(size=1 << n) if kind == "random"
                 else near_additive_table(n, game_seed, near=4))
        exact = exact_values(table_game(table, n), n)
        for seed in range(5):
            result = fedvalue.ads(table_game(table, n), [list(range(n))], threshold(float(np.median(exact))),
                                  seed=np.random.default_rng([game_seed, seed]))
            held += list(np.abs(result.values.to_numpy() - exact) <= 2 * result.stderr.to_numpy())
    assert np.mean(held) >= 0.93, np.mean(held)


def test_ordered_groups_are_valued_group_by_group_and_each_is_efficient():
    players = list(range(11))
    utility = random_table_game(players, 9)
    groups = [players[:5], players[5:]]
    exact = fedvalue.ads(utility, groups, method="exact").values
    result = fedvalue.ads(utility, groups, threshold(0.05), seed=4)
    assert (np.abs(result.values - exact) <= 4 * result.stderr + 1e-12).all()
    assert result.max_efficiency_gap < 1e-12 and len(result.efficiency_gaps) == 2


def test_a_budget_is_a_hard_cap_that_the_pilot_must_fit():
    n = 12
    table = np.random.default_rng(3).uniform(size=1 << n)
    cut = float(np.median(exact_values(table_game(table, n), n)))  # half the players near the cut
    free = fedvalue.ads(table_game(table, n), [list(range(n))], threshold(cut), seed=0)
    budget = minimum_coalitions(n) + 300
    capped = fedvalue.ads(table_game(table, n), [list(range(n))], threshold(cut, budget=budget), seed=0)
    assert capped.num_evaluations <= budget < free.num_evaluations
    assert np.isfinite(capped.stderr).all() and capped.max_efficiency_gap < 1e-12
    with pytest.raises(ValueError, match=r"budget: adaptive needs at least \d+ evaluations .*exact end strata"):
        fedvalue.ads(table_game(table, n), [list(range(n))], threshold(budget=100), seed=0)


def test_the_look_quantile_spreads_the_one_look_level_over_the_looks():
    alpha = 0.5 * (1 - 0.9544997361036416)  # P(Z ≥ 2)
    z4 = look_quantile(2.0, 4)
    assert look_quantile(2.0, 1) == 2.0 and 2.5 < z4 < 2.6
    assert 0.5 * math.erfc(z4 / math.sqrt(2)) == pytest.approx(alpha / 4, rel=1e-9)
    assert look_quantile(40.0, 4) == 40.0  # past the float's tail: no inflation to compute


# --- settings ------------------------------------------------------------------------------

@pytest.mark.parametrize("keywords, named", [
    ({"method": "adaptive"}, "decision: method='adaptive' spends its evaluations on a decision; expected one of "
                             r"\['threshold', 'top-k'\]; got None"),
    ({"method": "adaptive", "decision": "median"}, "decision: .* got 'median'"),
    ({"method": "adaptive", "decision": "threshold"}, "cut: expected a finite number .*; got None"),
    ({"method": "adaptive", "decision": "threshold", "cut": float("nan")}, "cut: expected a finite number"),
    ({"method": "adaptive", "decision": "threshold", "cut": 0.0, "top_k": 2}, "top_k: a 'threshold' decision"),
    ({"method": "adaptive", "decision": "top-k"}, "top_k: expected a positive integer .*; got None"),
    ({"method": "adaptive", "decision": "top-k", "top_k": 0}, "top_k: expected a positive integer"),
    ({"method": "adaptive", "decision": "top-k", "top_k": 2, "cut": 0.0}, "cut: a 'top-k' decision takes top_k"),
    ({"method": "adaptive", "decision": "top-k", "top_k": 2, "z": 0.0}, "z: expected a finite number > 0; got 0.0"),
    ({"method": "adaptive", "decision": "top-k", "top_k": 2, "stderr_estimator": "plain"},
     "stderr_estimator: method='adaptive' books its own"),
    ({"method": "mc", "decision": "threshold"}, "decision: only method='adaptive' takes a decision; got "
                                                "decision='threshold' with method='mc'"),
    ({"cut": 0.0}, "cut: only method='adaptive' takes a decision; got cut=0.0 with method='auto'"),
    ({"method": "exact", "z": 3.0}, "z: only method='adaptive'"),
])
def test_bad_settings_are_refused_with_the_field_named(keywords, named):
    with pytest.raises(ValueError, match=named):
        AdsSettings(**keywords)


def test_max_evaluations_below_the_worst_case_is_refused_before_any_evaluation():
    calls = []

    def utility(coalition):
        calls.append(coalition)
        return 0.0

    with pytest.raises(ValueError, match="max_evaluations: adaptive ADS .* may need \\d+ utility evaluations"):
        fedvalue.ads(utility, [list(range(12))], threshold(max_evaluations=500))
    assert calls == []


def test_the_decision_fields_are_written_only_for_the_adaptive_method():
    """Other methods' settings read as they did before (the records and run.json of earlier runs, byte for
    byte); an adaptive round's settings survive the round record's JSON."""
    assert set(AdsSettings().as_dict()).isdisjoint(ADAPTIVE_FIELDS)
    assert set(AdsSettings(method="mc", budget=40).as_dict()).isdisjoint(ADAPTIVE_FIELDS)
    adaptive = AdsSettings(method="adaptive", decision="top-k", top_k=3, z=2.5, budget=900)
    assert {"decision": "top-k", "cut": None, "top_k": 3, "z": 2.5}.items() <= adaptive.as_dict().items()
    settings = RoundSettings(methods=("ads",), valuation=adaptive, seed=5)
    assert RoundSettings.from_json(json.loads(json.dumps(settings.as_json()))) == settings
