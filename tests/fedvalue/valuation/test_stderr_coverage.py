"""MC-ADS's standard errors hold their coverage: on real FedAvg rounds valued exactly, 2 booked standard
errors of MC-ADS at 100 evaluations (about 12 permutations of 10 clients) hold the exact value at least 93% of
the time, and the plain standard error booked before does not (the check can fail); the estimator's own
properties against their references (:mod:`fedvalue.valuation.result`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fedvalue
from fedvalue.run.settings import RoundSettings
from fedvalue.valuation.ads import sample_ordered_permutations, subset_form
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.result import permutation_stderr, positions_in, positions_within_groups
from fedvalue.valuation.settings import AdsSettings

CLIENTS = 10
#: Rounds of each regime; MC draws per round (each valuing all 10 clients).
ROUNDS, REPEATS = 4, 10
#: The coverage 2 standard errors must hold, and the one-sided binomial margin of a sample of
#: ``draws`` values at the 1% level (z = 2.326): coverage 0.93 is rejected below 0.93 − z·√(0.93·0.07/draws).
NOMINAL, Z_ONE_PERCENT = 0.93, 2.326


def real_rounds(regime: str, seed: int = 0) -> list[np.ndarray]:
    """``ROUNDS`` successive FedAvg rounds on digits as the noisy federation runs them: 10 clients (iid
    shares), an MLP 64-32-10, one local epoch of SGD (lr 0.1, batches of 32) from the round's start;
    ``label-flip``: every second client's labels all flipped, ``free-rider``: every second client sends the
    start back. Each round's game v_t(S) = −loss(FedAvg of S) on the held-out quarter, as a table of its
    2^10 coalition values (bit k: client k)."""
    import torch

    from clients.behaviours import flip_labels
    from clients.training import get_model_arrays, set_model_arrays, train_locally
    from fedvalue.scoring.torch_utilities import TorchModelUtility
    from fedvalue.valuation.round_game import fedavg_round_game, weighted_mean
    from simulations.datasets.loaders import load_dataset, split_holdout
    from simulations.datasets.models import make_mlp
    from simulations.datasets.partitions import partition_iid

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train, holdout = split_holdout(load_dataset("digits"), 0.25, seed=seed)
        parts = partition_iid(len(train.y), CLIENTS, seed=seed)
        weights = [float(len(p)) for p in parts]
        utility = TorchModelUtility(make_mlp(64, 10, hidden=(32,), seed=seed), holdout.x, holdout.y, metric="neg_loss")
        state = get_model_arrays(make_mlp(64, 10, hidden=(32,), seed=seed))
        tables = []
        for t in range(ROUNDS):
            replies = []
            for k, part in enumerate(parts):
                bad = k % 2 == 1 and regime != "clean"
                if bad and regime == "free-rider":
                    replies.append({key: value.copy() for key, value in state.items()})
                    continue
                labels = flip_labels(train.y[part], 1.0, 10, seed=[seed, t, k]) if bad else train.y[part]
                model = set_model_arrays(make_mlp(64, 10, hidden=(32,), seed=seed), state)
                train_locally(model, train.x[part], labels, epochs=1, learning_rate=0.1, batch_size=32,
                              seed=[seed, t, k])
                replies.append(get_model_arrays(model))
            game = fedavg_round_game(list(range(CLIENTS)), state, replies, weights, utility)
            tables.append(np.asarray(game.values(list(range(1 << CLIENTS)))))
            state = weighted_mean(replies, weights)
        return tables
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tables() -> list[np.ndarray]:
    return [table for regime in ("clean", "label-flip", "free-rider") for table in real_rounds(regime)]


def table_game(table: np.ndarray) -> CoalitionGame:
    """A fresh cache over the table, so that a budget counts MC's own evaluations."""
    return CoalitionGame(lambda coalition: float(table[sum(1 << k for k in coalition)]), range(CLIENTS))


def coverage(tables: list[np.ndarray], estimator: str) -> tuple[int, int]:
    """(values within 2 standard errors of exact, values) of MC-ADS at a budget of 100 evaluations."""
    held = draws = 0
    for t, table in enumerate(tables):
        exact = subset_form(table, CLIENTS)
        for repeat in range(REPEATS):
            result = fedvalue.ads(table_game(table), [list(range(CLIENTS))], method="mc", budget=100,
                                  stderr_estimator=estimator, seed=np.random.default_rng([repeat, t]))
            held += int(np.sum(np.abs(result.values.to_numpy() - exact) <= 2 * result.stderr.to_numpy()))
            draws += CLIENTS
    return held, draws


def lowest_accepted(draws: int) -> float:
    return NOMINAL - Z_ONE_PERCENT * math.sqrt(NOMINAL * (1 - NOMINAL) / draws)


def test_two_standard_errors_hold_the_exact_value_93_percent_of_the_time_on_real_rounds(tables):
    held, draws = coverage(tables, "by-position")
    assert held / draws >= lowest_accepted(draws), (held, draws)


def test_the_plain_standard_error_booked_before_does_not(tables):
    """The same check fails for the sample standard deviation over √m: the check can fail."""
    held, draws = coverage(tables, "plain")
    assert held / draws < lowest_accepted(draws), (held, draws)


def test_the_estimates_are_the_same_under_both_estimators(tables):
    for estimator_seed in range(3):
        found = [fedvalue.ads(table_game(tables[0]), [list(range(CLIENTS))], method="mc", budget=100,
                              stderr_estimator=name, seed=estimator_seed) for name in ("by-position", "plain")]
        np.testing.assert_array_equal(found[0].values.to_numpy(), found[1].values.to_numpy())
        assert found[0].num_evaluations == found[1].num_evaluations


# --- the estimator against its references -----------------------------------------------------------------------


def permutation_marginals(utilities: np.ndarray, size: int, count: int, seed: int):
    """Marginals (count × size) and positions of ``count`` uniform permutations of a table game."""
    orders = sample_ordered_permutations([size], count, np.random.default_rng(seed))
    masks = np.concatenate([np.zeros((count, 1), np.int64), np.cumsum(np.left_shift(1, orders), axis=1)], axis=1)
    marginals = np.empty((count, size))
    np.put_along_axis(marginals, orders, np.diff(utilities[masks], axis=1), axis=1)
    return marginals, positions_in(orders)


def test_plain_is_the_sample_standard_deviation_over_the_root_of_the_permutations():
    marginals, positions = permutation_marginals(np.random.default_rng(1).normal(size=1 << 6), 6, 9, 2)
    np.testing.assert_array_equal(permutation_stderr(marginals, positions, estimator="plain"),
                                  marginals.std(axis=0, ddof=1) / 3.0)
    assert np.isnan(permutation_stderr(marginals[:1], positions[:1])).all()
    with pytest.raises(ValueError, match="estimator: expected one of \\['by-position', 'plain'\\]; got 'other'"):
        permutation_stderr(marginals, positions, estimator="other")


def test_by_position_is_the_formula():
    """Q_ik = (Σ_{s: i at k} D_si + P_k) / (c_ik + 1), σ̂_i² = mean_k Q_ik, written out by loops."""
    marginals, positions = permutation_marginals(np.random.default_rng(3).normal(size=1 << 5), 5, 7, 4)
    m, d = marginals.shape
    squares = (marginals - marginals.mean(axis=0)) ** 2 * m / (m - 1)
    pooled = [sum(squares[s, i] for s in range(m) for i in range(d) if positions[s, i] == k) / m for k in range(d)]
    expected = []
    for i in range(d):
        moments = []
        for k in range(d):
            own = [squares[s, i] for s in range(m) if positions[s, i] == k]
            moments.append((sum(own) + pooled[k]) / (len(own) + 1))
        expected.append(math.sqrt(sum(moments) / d / m))
    np.testing.assert_allclose(permutation_stderr(marginals, positions), expected, rtol=1e-12)


def test_constant_marginals_get_zero_and_the_estimate_converges_to_the_true_standard_deviation():
    size = 6
    additive = np.array([sum(0.1 * (k + 1) for k in range(size) if mask >> k & 1) for mask in range(1 << size)])
    marginals, positions = permutation_marginals(additive, size, 8, 0)
    np.testing.assert_allclose(permutation_stderr(marginals, positions), 0.0, atol=1e-15)
    utilities = np.random.default_rng(5).normal(size=1 << size)
    marginals, positions = permutation_marginals(utilities, size, 20_000, 6)
    # Var X_i over uniform permutations, from the table: the marginals of i on every S, weighted by P(S before i).
    true = []
    for i in range(size):
        without = [s for s in range(1 << size) if not s >> i & 1]
        weight = [1 / (size * math.comb(size - 1, bin(s).count("1"))) for s in without]
        gains = [utilities[s | 1 << i] - utilities[s] for s in without]
        mean = np.dot(weight, gains)
        true.append(math.sqrt(np.dot(weight, (np.array(gains) - mean) ** 2) / len(marginals)))
    np.testing.assert_allclose(permutation_stderr(marginals, positions), true, rtol=0.03)


def test_positions_are_taken_within_each_group():
    order = sample_ordered_permutations([2, 3], 4, np.random.default_rng(0))
    positions = positions_within_groups(order, [2, 3])
    for s in range(4):
        assert sorted(positions[s, :2]) == [0, 1] and sorted(positions[s, 2:]) == [0, 1, 2]
        for j, column in enumerate(order[s]):
            assert positions[s, column] == (j if j < 2 else j - 2)


def test_a_round_record_that_does_not_name_the_estimator_was_booked_with_the_plain_one():
    written = RoundSettings(methods=("ads",), valuation=AdsSettings(method="mc", budget=100)).as_json()
    assert written["valuation"]["stderr_estimator"] == "by-position"
    assert RoundSettings.from_json(written).valuation.stderr_estimator == "by-position"
    del written["valuation"]["stderr_estimator"]
    plain = RoundSettings.from_json(written)
    assert plain.valuation == AdsSettings(method="mc", budget=100, stderr_estimator="plain")
    assert plain.as_json() == written  # and written back as it was written before
