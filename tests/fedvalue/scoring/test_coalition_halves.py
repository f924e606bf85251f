"""Coalition rows factored over two halves of the basis, and the scoring path built on it.

References: the rows rebuilt from their factors; the plain one-state-at-a-time path on the
state FedAvg's own rule builds; the chunked path of the same ``LinearStates``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fedvalue.scoring.coalition_halves import split_rows
from fedvalue.scoring.linear import LinearStates
from fedvalue.valuation.round_game import weighted_mean
from fedvalue.scoring.torch_utilities import TorchModelUtility
from tests.fedvalue.fedavg_rounds import all_coalitions, fedavg_rows, round_around


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 9),
    seed=st.integers(0, 2**31 - 1),
    count=st.integers(1, 80),
    max_left=st.integers(1, 40),
)
def test_factors_rebuild_the_rows_and_respect_the_left_bound(n, seed, count, max_left):
    rng = np.random.default_rng(seed)
    weights = rng.integers(1, 1000, n).astype(float)
    masks = [tuple(np.flatnonzero(rng.random(n) < 0.5)) or (int(rng.integers(n)),) for _ in range(count)]
    rows = fedavg_rows(masks, weights)
    halves = split_rows(rows, max_left=max_left)
    if halves is None:  # a one-column left half always fits: only when every row uses one column
        assert len(np.flatnonzero(rows.any(axis=0))) == 1
        return
    assert len(halves.left.directions) <= max_left
    np.testing.assert_allclose(halves.rebuilt(n + 1), rows, rtol=0, atol=1e-12)
    for half in (halves.left, halves.right):
        np.testing.assert_allclose(half.directions.sum(axis=1), 1.0, rtol=0, atol=1e-11)
        present = half.of >= 0
        np.testing.assert_allclose(half.sums[~present], 0.0)
        assert (half.sums[present] > 0).all()
    assert halves.left.columns.stop == halves.right.columns.start


@pytest.mark.parametrize("n", [2, 5, 8, 11])
def test_all_coalitions_have_one_direction_per_nonempty_part(n):
    """[ADS] exact enumeration: 2^n − 1 rows, 2^|L| − 1 left and 2^|R| − 1 right directions."""
    rng = np.random.default_rng(n)
    rows = fedavg_rows(all_coalitions(n), rng.integers(1, 100, n).astype(float))
    halves = split_rows(rows, max_left=2**n)
    left = halves.left.columns.stop - halves.left.columns.start
    right = halves.right.columns.stop - halves.right.columns.start
    assert (left, right) == (n // 2, n - n // 2)
    assert len(halves.left.directions) == 2**left - 1
    assert len(halves.right.directions) == 2**right - 1
    small = split_rows(rows, max_left=2 ** (n // 2) - 2)  # the cut moves left
    assert small is None if n // 2 == 1 else small.left.columns.stop - small.left.columns.start == n // 2 - 1


@pytest.mark.parametrize("rows, reason", [
    (np.array([[0.5, 0.5, 0.0], [-0.5, 1.0, 0.5]]), "negative"),
    (np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]), "a zero row"),
    (np.array([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]), "one used column"),
    (np.zeros((0, 3)), "no rows"),
])
def test_rows_that_do_not_factor_are_refused(rows, reason):
    assert split_rows(rows, max_left=8) is None, reason


# --- the factored scoring path ------------------------------------------------------------------

def _models():
    torch.manual_seed(70)
    return {
        "relu": torch.nn.Sequential(torch.nn.Linear(7, 12), torch.nn.ReLU(), torch.nn.Linear(12, 9),
                                    torch.nn.ReLU(), torch.nn.Linear(9, 4)),
        "tanh-nobias-sigmoid": torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(7, 8), torch.nn.Tanh(), torch.nn.Linear(8, 6, bias=False),
            torch.nn.Sigmoid(), torch.nn.Linear(6, 4)),
        "no-activation": torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 4, bias=False)),
        "activation-last": torch.nn.Sequential(torch.nn.Linear(7, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4),
                                               torch.nn.ReLU()),
    }


@pytest.mark.parametrize("name", list(_models()))
@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
@pytest.mark.parametrize("block_rows", [17, 1024])
def test_factored_path_equals_the_chunked_and_the_plain_paths(name, metric, block_rows, monkeypatch):
    """Every coalition of a 6-client round, with held-out batches of 60 walked in blocks
    that do not divide them: the factored path (it must be the one taken) gives the plain
    path's accuracies exactly and its losses to float rounding, as the chunked path does."""
    model = _models()[name]
    rng = np.random.default_rng(71)
    x = rng.normal(size=(250, 7)).astype(np.float32)
    y = rng.integers(0, 4, 250)
    utility = TorchModelUtility(model, x, y, metric=metric, batch_size=60)
    start, clients, weights = round_around(72, 6, model, spread=0.5)
    coalitions = all_coalitions(6)
    rows = fedavg_rows(coalitions, weights)
    plain = [utility(weighted_mean([clients[k] for k in c], weights[list(c)])) for c in coalitions]
    taken = []
    original = LinearStates._half_scores
    monkeypatch.setattr(LinearStates, "_half_scores", lambda self, *a: taken.append(1) or original(self, *a))
    monkeypatch.setattr(LinearStates, "block_rows", block_rows)
    factored = utility.linear([start, *clients]).values(rows)
    assert taken == [1]
    monkeypatch.setattr(LinearStates, "rows_per_direction", 10**9)  # forces the chunked path
    chunked = utility.linear([start, *clients]).values(rows)
    assert taken == [1]
    tolerance = 0 if metric == "accuracy" else 1e-6
    np.testing.assert_allclose(factored, plain, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(chunked, plain, rtol=tolerance, atol=tolerance)


def test_factored_path_without_the_fused_add_relu_kernel_gives_the_same_values(monkeypatch):
    """The fused relu(x + αy) is an ATen kernel; where it is missing, add then ReLU."""
    model = _models()["relu"]
    rng = np.random.default_rng(73)
    x = rng.normal(size=(200, 7)).astype(np.float32)
    y = rng.integers(0, 4, 200)
    utility = TorchModelUtility(model, x, y, metric="neg_loss", batch_size=64)
    start, clients, weights = round_around(74, 7, model, spread=0.5)
    rows = fedavg_rows(all_coalitions(7), weights)
    fused = utility.linear([start, *clients]).values(rows)
    monkeypatch.setattr("fedvalue.scoring.linear.ADD_RELU", None)
    unfused = utility.linear([start, *clients]).values(rows)
    np.testing.assert_allclose(unfused, fused, rtol=1e-6, atol=1e-7)


def test_a_batch_of_few_coalitions_takes_the_chunked_path(monkeypatch):
    """Leave-one-out's n rows have about as many half directions as rows: not factored."""
    model = _models()["relu"]
    rng = np.random.default_rng(75)
    utility = TorchModelUtility(model, rng.normal(size=(50, 7)).astype(np.float32), rng.integers(0, 4, 50))
    start, clients, weights = round_around(76, 8, model, spread=0.5)
    loo = [tuple(k for k in range(8) if k != out) for out in range(8)]
    taken = []
    monkeypatch.setattr(LinearStates, "_half_scores", lambda self, *a: taken.append(1))
    states = utility.linear([start, *clients])
    plain = [utility(weighted_mean([clients[k] for k in c], weights[list(c)])) for c in loo]
    np.testing.assert_array_equal(states.values(fedavg_rows(loo, weights)), plain)
    assert taken == []
