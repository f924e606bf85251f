"""Antithetic permutations and paired KernelSHAP against closed forms and exact ADS."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import fedvalue
from fedvalue.valuation.settings import AdsSettings
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.round_game import value_round
from fedvalue.valuation.shapley_sampling import shapley_kernel_sizes
from fedvalue.run.settings import RoundSettings

from tests.fedvalue.reference_games import ordered_permutation_values, random_table_game

SAMPLING = ("mc", "antithetic", "stratified", "kernelshap")


# --- closed-form games ----------------------------------------------------------------------

def dividend_game(num_players: int, seed: int, orders=(1, 2, 3, 4), count=60, scale=0.05):
    """v(S) = Σ_T c_T [T ⊆ S] (Harsanyi dividends): φ_i = Σ_{T∋i} c_T / |T| in closed form."""
    rng = np.random.default_rng(seed)
    dividends = {}
    for _ in range(count):
        order = int(rng.choice(orders))
        members = frozenset(rng.choice(num_players, order, replace=False).tolist())
        dividends[members] = dividends.get(members, 0.0) + float(rng.normal(0, scale / order))
    shapley = np.zeros(num_players)
    for members, c in dividends.items():
        for i in members:
            shapley[i] += c / len(members)
    items = [(sum(1 << i for i in t), c) for t, c in dividends.items()]

    def utility(coalition: frozenset) -> float:
        mask = sum(1 << i for i in coalition)
        return 0.7 + sum(c for t, c in items if t & mask == t)

    return utility, shapley


def pairwise_game(num_players: int, seed: int, interaction: float = 0.01):
    """Additive plus pairwise terms: φ_i = a_i + ½ Σ_{j≠i} b_ij."""
    rng = np.random.default_rng(seed)
    a = rng.normal(0.02, 0.02, num_players)
    b = np.triu(rng.normal(0, interaction, (num_players, num_players)), 1)
    b = b + b.T

    def utility(coalition: frozenset) -> float:
        z = np.zeros(num_players)
        z[list(coalition)] = 1.0
        return float(0.5 + a @ z + 0.5 * z @ b @ z)

    return utility, a + 0.5 * b.sum(axis=1)


def voting_game(weights: list[int], quota: int):
    """v(S) = 1 if Σ_{i∈S} w_i ≥ quota; Shapley by counting coalitions per (size, weight)."""
    n = len(weights)
    shapley = np.zeros(n)
    for i in range(n):
        counts = np.zeros((n, quota + 1))  # coalitions of the others by size and capped weight
        counts[0, 0] = 1
        for j in (j for j in range(n) if j != i):
            shifted = np.zeros_like(counts)
            for w in range(quota + 1):
                shifted[1:, min(quota, w + weights[j])] += counts[:-1, w]
            counts += shifted
        for s in range(n):
            swing = counts[s, max(0, quota - weights[i]) : quota].sum()
            shapley[i] += swing * math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n)

    def utility(coalition: frozenset) -> float:
        return float(sum(weights[k] for k in coalition) >= quota)

    return utility, shapley


def test_the_voting_reference_equals_brute_force():
    utility, shapley = voting_game([3, 1, 2, 2, 4, 1], 7)
    from tests.fedvalue.reference_games import shapley_subset_formula

    brute = shapley_subset_formula(utility, list(range(6)))
    np.testing.assert_allclose(shapley, [brute[k] for k in range(6)], atol=1e-12)


def test_the_shapley_kernel_over_sizes_sums_to_one_and_is_symmetric():
    p = shapley_kernel_sizes(9)
    assert abs(p.sum() - 1) < 1e-12
    np.testing.assert_allclose(p, p[::-1], atol=1e-15)


# --- exactness where theory says so ----------------------------------------------------------

def test_antithetic_pairs_are_exact_on_pairwise_games_at_n_30():
    utility, shapley = pairwise_game(30, seed=0)
    result = fedvalue.ads(utility, [list(range(30))], method="antithetic", stderr_target=1e-9, seed=1)
    np.testing.assert_allclose(result.values.to_numpy(), shapley, atol=1e-12)
    assert result.num_permutations == 2 * 15  # one block of pairs: every pair mean is exact
    assert float(result.stderr.max()) < 1e-12


def test_kernelshap_is_exact_on_additive_games_and_always_efficient():
    rng = np.random.default_rng(3)
    a = rng.normal(size=25)
    result = fedvalue.ads(lambda S: float(sum(a[k] for k in S)), [list(range(25))], method="kernelshap",
                          stderr_target=1e-9, seed=2)
    np.testing.assert_allclose(result.values.to_numpy(), a, atol=1e-9)
    utility, _ = dividend_game(20, seed=4)
    result = fedvalue.ads(utility, [list(range(20))], method="kernelshap", epsilon=0.3, seed=5)
    assert result.max_efficiency_gap < 1e-12
    assert result.method == "ads-kernelshap"


def test_ordered_groups_are_valued_group_by_group():
    utility, _ = pairwise_game(7, seed=6, interaction=0.05)
    groups = [[0, 1, 2], [3, 4, 5, 6]]
    brute = ordered_permutation_values(utility, groups)
    antithetic = fedvalue.ads(utility, groups, method="antithetic", stderr_target=1e-9, seed=7)
    np.testing.assert_allclose(antithetic.values.to_numpy(), [brute[p] for p in range(7)], atol=1e-12)
    kernel = fedvalue.ads(utility, groups, method="kernelshap", epsilon=0.05, seed=8)
    np.testing.assert_allclose(kernel.values.to_numpy(), [brute[p] for p in range(7)], atol=2e-3)
    assert kernel.max_efficiency_gap < 1e-12  # per group


# --- closed-form games at larger n: error within the reported standard errors ------------------

@pytest.mark.parametrize("method", SAMPLING)
@pytest.mark.parametrize("game", ["dividends", "voting"])
def test_every_sampler_is_within_its_standard_errors_at_n_24(method, game):
    if game == "dividends":
        utility, shapley = dividend_game(24, seed=9)
    else:
        weights = [int(w) for w in np.random.default_rng(10).integers(1, 9, 24)]
        utility, shapley = voting_game(weights, sum(weights) // 2 + 1)
    result = fedvalue.ads(CoalitionGame(utility, list(range(24))), [list(range(24))], method=method,
                          stderr_target=0.004, seed=11)
    error = np.abs(result.values.to_numpy() - shapley)
    if game == "dividends":  # voting's 0/1 marginals keep MC and kernelshap above it at their caps
        assert float(result.stderr.max()) <= 0.004
    # Max over 24 players of |N(0, σ_i)| stays below 4.5 max σ_i.
    assert float(error.max()) <= 4.5 * float(result.stderr.max())
    assert result.max_efficiency_gap < 1e-9  # every sampler is efficient, stratified by its correction
    assert result.num_evaluations <= 2 ** 24


def test_on_near_additive_games_the_paired_samplers_need_far_fewer_coalitions():
    utility, shapley = dividend_game(20, seed=12, orders=(1, 1, 1, 2, 3), scale=0.05)
    costs = {}
    for method in SAMPLING:
        result = fedvalue.ads(CoalitionGame(utility, list(range(20))), [list(range(20))], method=method,
                              stderr_target=0.002, seed=13)
        assert float(np.abs(result.values.to_numpy() - shapley).max()) < 0.01
        costs[method] = result.num_evaluations
    assert costs["antithetic"] * 3 < costs["mc"]
    assert costs["kernelshap"] * 3 < costs["mc"]


# --- auto ------------------------------------------------------------------------------------

def test_auto_keeps_exact_and_mc_where_it_chose_them_before():
    utility, _ = dividend_game(16, seed=14)
    assert fedvalue.ads(utility, [list(range(8))], seed=0).method == "ads-exact"
    assert fedvalue.ads(utility, [list(range(8))], stderr_target=0.01, seed=0).method == "ads-exact"
    plain = fedvalue.ads(utility, [list(range(16))], seed=0)
    mc = fedvalue.ads(utility, [list(range(16))], method="mc", seed=0)
    assert plain.method == "ads-mc"  # (ε, δ) only: Hoeffding's m* permutations, as before
    np.testing.assert_array_equal(plain.values, mc.values)


def test_auto_with_a_stderr_target_takes_the_cheapest_sampler_and_names_it():
    utility, shapley = pairwise_game(18, seed=15)
    game = CoalitionGame(utility, list(range(18)))
    valuation = value_round(game, ("ads",), AdsSettings(stderr_target=1e-3), seed=16)
    result = valuation.results["ads"]
    assert result.method in ("ads-antithetic", "ads-kernelshap")
    np.testing.assert_allclose(result.values.to_numpy(), shapley, atol=5e-3)
    again = value_round(CoalitionGame(utility, list(range(18))), ("ads",),
                                 AdsSettings(stderr_target=1e-3), seed=16).results["ads"]
    np.testing.assert_array_equal(result.values, again.values)  # the audit reproduces it


def test_auto_on_an_unstructured_game_meets_the_target_too():
    # A random table has no structure for the paired samplers: whichever wins, it meets the target.
    game = CoalitionGame(random_table_game(list(range(12)), seed=17), list(range(12)))
    result = fedvalue.ads(game, [list(range(12))], stderr_target=0.05, epsilon=0.1, seed=18)
    assert result.method in ("ads-mc", "ads-antithetic", "ads-kernelshap")
    assert float(result.stderr.max()) <= 0.05


@pytest.mark.parametrize("method", ["antithetic", "stratified", "kernelshap"])
def test_samplers_respect_max_evaluations_and_name_it(method):
    with pytest.raises(ValueError, match="max_evaluations"):
        fedvalue.ads(lambda S: 0.0, [list(range(20))], method=method, max_evaluations=100)
    with pytest.raises(ValueError, match="max_evaluations"):
        fedvalue.ads(lambda S: 0.0, [list(range(20))], stderr_target=0.1, max_evaluations=100)


def test_a_bad_method_names_every_choice():
    with pytest.raises(ValueError, match="'antithetic', 'stratified' or 'kernelshap'; got 'svarm'"):
        AdsSettings(method="svarm")


@pytest.mark.parametrize("method", ["antithetic", "stratified", "kernelshap"])
def test_samplers_are_deterministic_and_each_coalition_is_evaluated_once(method):
    from tests.fedvalue.reference_games import CountingUtility

    counting = CountingUtility(random_table_game(list(range(8)), seed=19))
    game = CoalitionGame(counting, list(range(8)))
    first = fedvalue.ads(game, [list(range(8))], method=method, epsilon=0.2, seed=20)
    second = fedvalue.ads(random_table_game(list(range(8)), seed=19), [list(range(8))], method=method,
                          epsilon=0.2, seed=20)
    np.testing.assert_array_equal(first.values, second.values)
    assert len(counting.calls) == len(set(counting.calls)) == game.num_evaluations <= 2 ** 8


def test_a_group_of_one_gets_its_whole_marginal():
    result = fedvalue.ads(lambda S: 0.3 * len(S) + 0.1 * (1 in S and 2 in S), [[0], [1, 2]],
                          method="kernelshap", seed=0)
    np.testing.assert_allclose(result.values.to_numpy(), [0.3, 0.35, 0.35], atol=1e-12)
    assert list(itertools.chain(result.groups)) == [(0,), (1, 2)]


# --- real round games at n = 12–16 against exact -------------------------------------------

def real_round(num_clients: int, seed: int = 0):
    """A FedAvg round on digits: a small MLP after one warm-up round, clients that trained
    locally from it (every second one on 70% flipped labels); held-out accuracy."""
    import torch

    from clients.behaviours import flip_labels
    from clients.training import get_model_arrays, set_model_arrays, train_locally
    from fedvalue.valuation.round_game import fedavg_round_game, weighted_mean
    from fedvalue.scoring.torch_utilities import TorchModelUtility
    from simulations.datasets.loaders import load_dataset, split_holdout
    from simulations.datasets.partitions import partition_iid
    from simulations.datasets.models import make_mlp

    torch.set_num_threads(1)
    data = load_dataset("digits")
    rng = np.random.default_rng(seed)
    train, holdout = split_holdout(data, 0.25, seed=rng)
    parts = partition_iid(len(train.y), num_clients, seed=rng)

    def local(state, part, labels, tag):
        model = set_model_arrays(make_mlp(64, 10, hidden=(32,), seed=seed), state)
        train_locally(model, train.x[part], labels, epochs=3, learning_rate=0.1, seed=[seed, tag, len(part)])
        return get_model_arrays(model)

    start = get_model_arrays(make_mlp(64, 10, hidden=(32,), seed=seed))
    start = weighted_mean([local(start, p, train.y[p], 0) for p in parts], [len(p) for p in parts])
    clients = [local(start, p, flip_labels(train.y[p], 0.7, 10, seed=[seed, k]) if k % 2 else train.y[p], 1)
               for k, p in enumerate(parts)]
    utility = TorchModelUtility(make_mlp(64, 10, hidden=(32,), seed=seed), holdout.x, holdout.y)
    ids = list(range(num_clients))
    weights = [float(len(p)) for p in parts]
    full = fedavg_round_game(ids, start, clients, weights, utility)
    table = full.values(range(1 << num_clients))  # every coalition once, read by fresh caches below
    exact = fedvalue.ads(full, [ids], method="exact").values.to_numpy()

    def fresh() -> CoalitionGame:
        return CoalitionGame(None, ids, batch_utility=lambda cs: [float(table[sum(1 << k for k in c)]) for c in cs])

    return fresh, exact


@pytest.mark.parametrize("num_clients", [12, pytest.param(14, marks=pytest.mark.slow),
                                         pytest.param(16, marks=pytest.mark.slow)])
def test_on_real_rounds_the_new_samplers_match_exact_for_fewer_coalitions_than_mc(num_clients):
    fresh, exact = real_round(num_clients)
    ids = list(range(num_clients))
    mc = fedvalue.ads(fresh(), [ids], method="mc", seed=0)  # the seed's estimator: m* permutations
    mc_error = float(np.abs(mc.values.to_numpy() - exact).max())
    target = float(mc.stderr.max())  # the same standard error as MC's
    for method in ("antithetic", "stratified", "kernelshap"):
        result = fedvalue.ads(fresh(), [ids], method=method, stderr_target=target, seed=1)
        error = float(np.abs(result.values.to_numpy() - exact).max())
        assert float(result.stderr.max()) <= target, method
        assert error <= 4.5 * target, method  # the reported standard errors are honest
        assert result.num_evaluations <= mc.num_evaluations, method
        if method == "stratified":  # MC's standard error for at most half its coalitions
            assert result.num_evaluations <= mc.num_evaluations / 2
            assert error <= 2 * mc_error


def test_the_rounds_table_names_the_sampler_auto_took():
    from fedvalue.run.archive import RoundRecord
    from fedvalue.rounds.booking import ClientEntry, book_round
    from fedvalue.valuation.round_game import fedavg_round_game

    rng = np.random.default_rng(21)
    target = rng.normal(size=4)
    start = {"w": np.zeros(4)}
    ids = [f"c{k}" for k in range(16)]
    replies = {c: {"w": target + rng.normal(0, 0.2 + 0.4 * (k % 2), 4)} for k, c in enumerate(ids)}
    weights = [float(w) for w in rng.integers(10, 50, 16)]

    def utility(arrays) -> float:
        return -float(np.sum((arrays["w"] - target) ** 2))

    game = fedavg_round_game(ids, start, [replies[c] for c in ids], weights, utility)
    settings = AdsSettings(stderr_target=0.02)  # 2^16 > MC's m*·n: past exact
    valuation = value_round(game, ("ads", "loo"), settings, seed=22)
    entries = [ClientEntry(c, "ok", w, int(w)) for c, w in zip(ids, weights)]
    record = RoundRecord(round=3, start_arrays=start, entries=entries, replies=replies, accepted=list(ids),
                         settings=RoundSettings(methods=("ads", "loo")))
    books = book_round(record, valuation, utility, realized=None)
    method = books.round_row.ads_method
    assert method == valuation.results["ads"].method and method == "ads-stratified"  # MC stays near 0.14 at its cap here
    stderrs = [r.stderr for r in books.ledger_rows if r.method == "ads"]
    assert len(stderrs) == 16 and max(stderrs) <= 0.02
    assert game.num_evaluations < 2 ** 16 / 4
