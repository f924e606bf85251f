"""A budget of coalition evaluations, and progress reports, for ADS and a round's valuation.

References: exact ADS on the same game, the game's own count
of evaluations, and the same valuation unwatched (watching must change nothing)."""

from __future__ import annotations

import numpy as np
import pytest

from fedvalue.valuation.ads import ads

from fedvalue.valuation.settings import AdsSettings

from fedvalue.valuation.plan import budget_method, minimum_budget
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.round_game import fedavg_round_game, value_round
from fedvalue.scoring.torch_utilities import TorchModelUtility
from simulations.datasets.models import make_mlp
from tests.fedvalue.fedavg_rounds import round_around

SAMPLERS = ("mc", "tmc", "antithetic", "stratified", "kernelshap")


def nonlinear_game(n: int, seed: int):
    """v(S) = Σ_{i∈S} a_i + log(1 + (Σ_{i∈S} w_i)²): interactions of every order, so every
    sampler has a sampling error (pairwise games are exact for the paired ones)."""
    rng = np.random.default_rng(seed)
    a, w = rng.normal(scale=0.2, size=n), rng.normal(size=n)

    def v(coalition):
        members = sorted(coalition)
        return float(a[members].sum() + np.log1p(w[members].sum() ** 2))

    return v


@pytest.mark.parametrize("method", SAMPLERS)
@pytest.mark.parametrize("groups", [[list(range(12))], [list(range(5)), list(range(5, 12))]])
def test_every_sampler_stays_within_its_budget_with_standard_errors(method, groups):
    v = nonlinear_game(12, 1)
    exact = ads(CoalitionGame(v, range(12)), groups, method="exact").values
    budget = sum(minimum_budget(method, len(g)) for g in groups) * 3
    game = CoalitionGame(v, range(12))
    result = ads(game, groups, method=method, budget=budget, seed=4)
    assert result.num_evaluations == game.num_evaluations <= budget
    assert result.method == f"ads-{method}"
    assert np.isfinite(result.stderr).all() and (result.stderr >= 0).all()
    error = np.abs(result.values - exact)
    if method != "tmc":  # tmc is biased by up to its tolerance; the others are unbiased
        assert (error <= 6 * result.stderr + 1e-9).all(), (error.max(), result.stderr.max())
    # A larger budget spends at least as much (small groups are soon seen whole: then no more).
    bigger = ads(CoalitionGame(v, range(12)), groups, method=method, budget=4 * budget, seed=4)
    assert result.num_evaluations <= bigger.num_evaluations <= 4 * budget
    assert bigger.num_evaluations > result.num_evaluations or bigger.num_evaluations == \
        CoalitionGame(v, range(12)).num_evaluations + sum(2 ** len(g) - 1 for g in groups) + 1


def test_auto_picks_exact_when_it_fits_else_the_first_sampler_that_does():
    assert budget_method("auto", [6], 64, 64) == "exact"
    assert budget_method("auto", [6], 63, 64) == "kernelshap"  # stratified needs 230 (twice that here)
    assert budget_method("auto", [6], 460, 64) == "exact"
    assert budget_method("auto", [20], 2 * minimum_budget("stratified", 20), 2**20) == "stratified"
    assert budget_method("auto", [20], 2 * minimum_budget("stratified", 20) - 1, 2**20) == "kernelshap"
    assert budget_method("auto", [20], minimum_budget("kernelshap", 20) - 1, 2**20) == "mc"
    with pytest.raises(ValueError, match="budget: mc needs at least 41 evaluations"):
        budget_method("auto", [20], 40, 2**20)
    with pytest.raises(ValueError, match="budget: exact ADS over groups of sizes \\[6\\] needs 64"):
        budget_method("exact", [6], 63, 64)
    with pytest.raises(ValueError, match="budget: 100 evaluations asked for, more than max_evaluations=50"):
        budget_method("auto", [6], 100, 64, max_evaluations=50)
    with pytest.raises(ValueError, match="budget: expected a positive integer"):
        AdsSettings(budget=0)


def test_a_budget_larger_than_the_game_stops_once_everything_is_cached():
    v = nonlinear_game(5, 2)
    game = CoalitionGame(v, range(5))
    result = ads(game, [list(range(5))], method="mc", budget=10_000, seed=0)
    assert game.num_evaluations <= 32 and result.num_permutations < 10_000


@pytest.mark.parametrize("settings", [AdsSettings(method="exact"), AdsSettings(method="stratified", budget=500),
                                      AdsSettings(method="mc", epsilon=0.2)])
def test_progress_is_monotone_ends_at_the_evaluations_and_changes_nothing(settings):
    model = make_mlp(6, 3, hidden=(8,), seed=0)
    rng = np.random.default_rng(1)
    utility = TorchModelUtility(model, rng.normal(size=(120, 6)).astype(np.float32), rng.integers(0, 3, 120),
                                batch_size=50)
    start, clients, weights = round_around(2, 8, model)
    ids = list(range(8))
    calls: list[tuple[int, int]] = []
    watched = value_round(fedavg_round_game(ids, start, clients, weights, utility), ("ads", "loo"), settings,
                          seed=3, progress=lambda done, planned: calls.append((done, planned)))
    plain = value_round(fedavg_round_game(ids, start, clients, weights, utility), ("ads", "loo"), settings, seed=3)
    for method in ("ads", "loo"):
        np.testing.assert_array_equal(watched.results[method].values, plain.results[method].values)
        np.testing.assert_array_equal(watched.results[method].stderr, plain.results[method].stderr)
    done = [d for d, _ in calls]
    assert done == sorted(done) and all(d <= p for d, p in calls)
    assert calls[-1] == (watched.num_evaluations, watched.num_evaluations)
    if settings.method == "exact":  # the 256 coalitions are one batch, reported as the scorer goes
        assert calls[0][1] == 256 and len({d for d in done if 0 < d < 256}) > 2


def test_a_round_budget_counts_loo_and_holds():
    model = make_mlp(6, 3, hidden=(8,), seed=0)
    rng = np.random.default_rng(1)
    utility = TorchModelUtility(model, rng.normal(size=(80, 6)).astype(np.float32), rng.integers(0, 3, 80))
    start, clients, weights = round_around(5, 9, model)
    ids = list(range(9))
    for budget, expected in ((512, "ads-exact"), (511, "ads-kernelshap"), (200, "ads-kernelshap"),
                             (60, "ads-mc")):
        valuation = value_round(fedavg_round_game(ids, start, clients, weights, utility), ("ads", "loo"),
                                AdsSettings(budget=budget), seed=0)
        assert valuation.results["ads"].method == expected
        assert valuation.num_evaluations <= budget
