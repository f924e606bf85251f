"""ADS against references: brute force over σ-respecting permutations, closed forms,
axioms as hypothesis properties, MC, truncated MC and the standard-error stop against
exact, and bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fedvalue
from fedvalue import CoalitionGame
from fedvalue.valuation.plan import mc_num_permutations

from tests.fedvalue.reference_games import (
    CountingUtility,
    ordered_permutation_values,
    random_table_game,
    shapley_subset_formula,
)

group_sizes = st.lists(st.integers(1, 3), min_size=1, max_size=3)


def make_groups(sizes: list[int]) -> list[list[str]]:
    names = iter(f"p{k}" for k in range(sum(sizes)))
    return [[next(names) for _ in range(size)] for size in sizes]


def as_array(result, players) -> np.ndarray:
    return result.values.loc[players].to_numpy(dtype=float)


# --- brute force -------------------------------------------------------------------------

@pytest.mark.parametrize("sizes", [[4], [1], [2, 3], [3, 1, 2], [1, 1, 1]])
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_equals_permutation_form_on_random_games(sizes, seed):
    assert_exact_matches_permutation_form(sizes, seed)


def assert_exact_matches_permutation_form(sizes: list[int], seed: int) -> None:
    groups = make_groups(sizes)
    players = [p for g in groups for p in g]
    utility = random_table_game(players, seed)
    expected = ordered_permutation_values(utility, groups)
    result = fedvalue.ads(utility, groups, method="exact")
    np.testing.assert_allclose(as_array(result, players), [expected[p] for p in players], atol=1e-12)
    assert result.max_efficiency_gap < 1e-12


@settings(max_examples=30, deadline=None)
@given(sizes=group_sizes, seed=st.integers(0, 10_000))
def test_exact_equals_permutation_form_property(sizes, seed):
    assert_exact_matches_permutation_form(sizes, seed)


# --- closed forms ------------------------------------------------------------------------

def test_square_game_gives_equal_shares():
    result = fedvalue.ads(lambda s: float(len(s) ** 2), [["a", "b", "c"]], method="exact")
    np.testing.assert_allclose(result.values.to_numpy(), [3.0, 3.0, 3.0])
    assert result.num_evaluations == 8


def test_additive_game_gives_each_player_its_weight():
    weights = {"a": 0.3, "b": -1.2, "c": 2.0, "d": 0.0, "e": 5.5}
    utility = lambda s: sum(weights[p] for p in s)  # noqa: E731
    for groups in ([list(weights)], [["a", "b"], ["c"], ["d", "e"]]):
        result = fedvalue.ads(utility, groups, method="exact")
        np.testing.assert_allclose(result.values.loc[list(weights)], list(weights.values()), atol=1e-12)


@pytest.mark.parametrize(
    "groups, carrier, expected",
    [
        # One group: 1/|T| to each member of T (classical unanimity game).
        ([["a", "b", "c", "d"]], {"a", "b"}, {"a": 0.5, "b": 0.5, "c": 0.0, "d": 0.0}),
        # Ordered groups: the whole unit goes to T's members in the latest group that holds any.
        ([["a", "b"], ["c", "d"]], {"a", "c", "d"}, {"a": 0.0, "b": 0.0, "c": 0.5, "d": 0.5}),
        ([["a", "b"], ["c"], ["d"]], {"a", "b"}, {"a": 0.5, "b": 0.5, "c": 0.0, "d": 0.0}),
    ],
)
def test_unanimity_game(groups, carrier, expected):
    result = fedvalue.ads(lambda s: float(carrier <= s), groups, method="exact")
    for player, value in expected.items():
        assert result.values[player] == pytest.approx(value, abs=1e-12)


def test_glove_game():
    # One left glove, two right gloves: v(S) = number of matched pairs.
    left, right = {"L"}, {"R1", "R2"}
    utility = lambda s: float(min(len(s & left), len(s & right)))  # noqa: E731
    result = fedvalue.ads(utility, [["L", "R1", "R2"]], method="exact")
    assert result.values["L"] == pytest.approx(2 / 3)
    assert result.values["R1"] == pytest.approx(1 / 6)
    assert result.values["R2"] == pytest.approx(1 / 6)


def test_weighted_voting_game():
    # Quota 4 with weights 3, 2, 1, 1. C is pivotal when exactly weight 3 precedes it:
    # {A} first (2 of 24 orders) or {B, D} first (2 orders × 2) → 4/24 = 1/6, likewise D;
    # B: after {A} or {C, D} → 1/6; A takes the rest, 1/2 (Shapley–Shubik index).
    weights = {"A": 3, "B": 2, "C": 1, "D": 1}
    utility = lambda s: float(sum(weights[p] for p in s) >= 4)  # noqa: E731
    result = fedvalue.ads(utility, [list(weights)], method="exact")
    np.testing.assert_allclose(result.values.loc[list(weights)], [1 / 2, 1 / 6, 1 / 6, 1 / 6])


# --- axioms as properties -----------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(sizes=group_sizes, seed=st.integers(0, 10_000))
def test_group_efficiency(sizes, seed):
    groups = make_groups(sizes)
    utility = random_table_game([p for g in groups for p in g], seed)
    result = fedvalue.ads(utility, groups, method="exact")
    prefix: frozenset = frozenset()
    for t, group in enumerate(groups):
        before = utility(prefix)
        prefix = prefix | set(group)
        total = sum(result.values[p] for p in group)
        assert total == pytest.approx(utility(prefix) - before, abs=1e-12)
        assert abs(result.efficiency_gaps[t]) < 1e-12


@settings(max_examples=30, deadline=None)
@given(sizes=group_sizes, seed=st.integers(0, 10_000), data=st.data())
def test_symmetric_players_within_a_group_get_equal_values(sizes, seed, data):
    groups = make_groups(sizes)
    t = data.draw(st.sampled_from([k for k, g in enumerate(groups) if len(g) >= 2] or [None]))
    if t is None:
        return
    a, b = groups[t][0], groups[t][1]
    base = random_table_game([p for g in groups for p in g], seed)
    # Symmetrize: v(S) depends on a and b only through how many of them S holds.
    def utility(s):
        return base(s - {b} | {a}) if (a in s) != (b in s) else base(s)
    result = fedvalue.ads(utility, groups, method="exact")
    assert result.values[a] == pytest.approx(result.values[b], abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(sizes=group_sizes, seed=st.integers(0, 10_000), data=st.data())
def test_null_player_gets_zero(sizes, seed, data):
    groups = make_groups(sizes)
    players = [p for g in groups for p in g]
    null = data.draw(st.sampled_from(players))
    base = random_table_game(players, seed)
    result = fedvalue.ads(lambda s: base(s - {null}), groups, method="exact")
    assert result.values[null] == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    sizes=group_sizes,
    seeds=st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)),
    coefficients=st.tuples(st.floats(-3, 3), st.floats(-3, 3)),
)
def test_linearity_in_the_utility(sizes, seeds, coefficients):
    groups = make_groups(sizes)
    players = [p for g in groups for p in g]
    v, w = (random_table_game(players, s) for s in seeds)
    a, b = coefficients
    combined = fedvalue.ads(lambda s: a * v(s) + b * w(s), groups, method="exact")
    separate = a * as_array(fedvalue.ads(v, groups, method="exact"), players) + b * as_array(
        fedvalue.ads(w, groups, method="exact"), players
    )
    np.testing.assert_allclose(as_array(combined, players), separate, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(sizes=group_sizes, seed=st.integers(0, 10_000), data=st.data())
def test_relabeling_players_relabels_values(sizes, seed, data):
    groups = make_groups(sizes)
    players = [p for g in groups for p in g]
    new_names = data.draw(st.permutations([f"q{k}" for k in range(len(players))]))
    rename = dict(zip(players, new_names))
    back = {v: k for k, v in rename.items()}
    utility = random_table_game(players, seed)
    original = fedvalue.ads(utility, groups, method="exact")
    # Also shuffle the order of players inside each group: order within a group must not matter.
    shuffled = [data.draw(st.permutations([rename[p] for p in g])) for g in groups]
    relabeled = fedvalue.ads(lambda s: utility(frozenset(back[p] for p in s)), shuffled, method="exact")
    for p in players:
        assert relabeled.values[rename[p]] == pytest.approx(original.values[p], abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_single_group_is_classical_data_shapley(size, seed):
    players = [f"p{k}" for k in range(size)]
    utility = random_table_game(players, seed)
    expected = shapley_subset_formula(utility, players)
    result = fedvalue.ads(utility, [players], method="exact")
    np.testing.assert_allclose(as_array(result, players), [expected[p] for p in players], atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 3), min_size=2, max_size=3), seed=st.integers(0, 10_000), data=st.data())
def test_later_duplicate_of_an_earlier_source_is_worth_zero(sizes, seed, data):
    """Axiom 4.1: a mutually dependent source that must follow its counterpart gets 0."""
    groups = make_groups(sizes)
    earlier_group = data.draw(st.integers(0, len(groups) - 2))
    later_group = data.draw(st.integers(earlier_group + 1, len(groups) - 1))
    original = data.draw(st.sampled_from(groups[earlier_group]))
    duplicate = "dup"
    groups[later_group] = groups[later_group] + [duplicate]
    sources = [p for g in groups for p in g if p != duplicate]
    base = random_table_game(sources, seed)
    # The utility sees the data, not who holds it: a duplicate adds nothing new.
    utility = lambda s: base(frozenset(original if p == duplicate else p for p in s))  # noqa: E731
    result = fedvalue.ads(utility, groups, method="exact")
    assert result.values[duplicate] == pytest.approx(0.0, abs=1e-12)
    # A copy inside the same group is its twin's equal instead.
    twin_groups = [list(g) for g in make_groups(sizes)]
    twin_groups[earlier_group].append(duplicate)
    twins = fedvalue.ads(utility, twin_groups, method="exact")
    assert twins.values[duplicate] == pytest.approx(twins.values[original], abs=1e-12)


# --- Monte Carlo --------------------------------------------------------------------------

def _marginal_range(utility, groups) -> float:
    players = [p for g in groups for p in g]
    marginals = [
        utility(frozenset(c) | {p}) - utility(frozenset(c))
        for size in range(len(players))
        for c in itertools.combinations(players, size)
        for p in players
        if p not in c
    ]
    return max(marginals) - min(marginals)


@pytest.mark.parametrize("groups", [[["a", "b", "c", "d", "e"]], [["a", "b"], ["c", "d", "e"]]])
def test_mc_is_within_epsilon_of_exact_at_m_star(groups):
    utility = random_table_game([p for g in groups for p in g], seed=3)
    r = _marginal_range(utility, groups)
    exact = fedvalue.ads(utility, groups, method="exact")
    for seed in range(5):
        mc = fedvalue.ads(utility, groups, method="mc", epsilon=0.1, delta=0.05, r=r, seed=seed)
        assert mc.num_permutations == fedvalue.mc_num_permutations(5, 0.1, 0.05, r)
        assert np.max(np.abs(mc.values - exact.values)) <= 0.1
        assert mc.max_efficiency_gap < 1e-12
        # The reported standard error is the spread of a mean of m* draws: error stays within 5 se.
        assert np.all(np.abs(mc.values - exact.values) <= 5 * mc.stderr + 1e-12)


def test_mc_error_shrinks_with_epsilon():
    players = [f"p{k}" for k in range(7)]
    utility = random_table_game(players, seed=11)
    exact = fedvalue.ads(utility, [players], method="exact").values
    errors = {}
    for epsilon in (0.4, 0.1, 0.025):
        errors[epsilon] = np.mean(
            [
                np.max(np.abs(fedvalue.ads(utility, [players], method="mc", epsilon=epsilon, seed=s).values - exact))
                for s in range(8)
            ]
        )
    assert errors[0.4] > errors[0.1] > errors[0.025]


def test_mc_never_evaluates_a_coalition_twice_and_is_seeded():
    players = [f"p{k}" for k in range(6)]
    counting = CountingUtility(random_table_game(players, seed=0))
    game = CoalitionGame(counting, players)
    result = fedvalue.ads(game, [players], method="mc", epsilon=0.05, seed=7)
    assert len(counting.calls) == len(set(counting.calls)) == result.num_evaluations
    assert result.num_evaluations <= 2 ** 6
    assert result.num_permutations * 6 > 2 ** 6  # without the cache it would have paid more
    again = fedvalue.ads(random_table_game(players, seed=0), [players], method="mc", epsilon=0.05, seed=7)
    pd_equal = result.values.to_numpy() == again.values.to_numpy()
    assert pd_equal.all()


def test_auto_picks_exact_when_it_is_no_dearer_than_mc():
    small = fedvalue.ads(lambda s: float(len(s)), [list("abcd")], method="auto")
    assert small.method == "ads-exact"
    players = [f"p{k}" for k in range(14)]  # 2^14 coalitions > m*·n at epsilon 0.2
    large = fedvalue.ads(lambda s: float(len(s)), [players], method="auto", epsilon=0.2, seed=0)
    assert large.method == "ads-mc"
    assert fedvalue.exact_num_coalitions([players]) > fedvalue.mc_num_permutations(14, 0.2, 0.05) * 14


def test_auto_falls_back_to_mc_under_max_evaluations():
    players = list("abcdef")
    result = fedvalue.ads(lambda s: float(len(s)), [players], epsilon=0.9, max_evaluations=40, seed=0)
    assert result.method == "ads-mc"
    assert result.num_evaluations <= 40


# --- batch hook ---------------------------------------------------------------------------

def test_batch_utility_gets_every_missing_coalition_in_one_call():
    players = list("abcde")
    base = random_table_game(players, seed=5)
    batches: list[int] = []

    def batch(coalitions):
        batches.append(len(coalitions))
        return [base(c) for c in coalitions]

    game = CoalitionGame(None, players, batch_utility=batch)
    result = fedvalue.ads(game, [players], method="exact")
    assert batches == [32]
    np.testing.assert_allclose(result.values.to_numpy(), fedvalue.ads(base, [players], method="exact").values.to_numpy())
    fedvalue.ads(game, [players], method="mc", seed=1)
    assert batches == [32]  # every MC prefix was already cached


# --- truncated MC and the standard-error stop -----------------------------------------


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


def test_cheaper_estimators_are_deterministic_and_auto_keeps_exact_where_it_is_cheaper():
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
    ({"method": "gtg"}, "method: expected 'auto', 'exact', 'mc', 'tmc', 'antithetic', 'stratified' or 'kernelshap'"),
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
    from tests.fedvalue.reference_games import CountingUtility

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
    from tests.fedvalue.reference_games import CountingUtility

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
    with pytest.raises(ValueError, match="method: expected 'auto', 'exact', 'mc', 'tmc', 'antithetic', 'stratified' or 'kernelshap'; got 'shapley'"):
        fedvalue.ads(square, [["a"]], method="shapley")



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



def test_ads_settings_are_checked_once_when_made_and_cannot_change():
    import dataclasses

    from fedvalue import AdsSettings

    with pytest.raises(ValueError, match="method: expected 'auto', 'exact', 'mc', 'tmc', 'antithetic', 'stratified' or 'kernelshap'; got 'bogus'"):
        AdsSettings(method="bogus")
    with pytest.raises(ValueError, match="stderr_target: expected a finite number > 0 or None"):
        AdsSettings(stderr_target=0.0)
    with pytest.raises(ValueError, match="max_evaluations: expected a positive integer or None"):
        AdsSettings(max_evaluations=0)
    settings = AdsSettings(method="mc", epsilon=0.2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.epsilon = 0.5
    assert AdsSettings(**settings.as_dict()) == settings  # the round record's round trip

