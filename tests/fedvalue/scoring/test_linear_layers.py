"""Coalitions scored through first layers linear in their parameters (Conv1d/2d/3d,
Embedding, Linear on non-flat inputs), equal to the plain one-state-at-a-time path.

The reference is ``TorchModelUtility.__call__`` on the state FedAvg's own rule
(``weighted_mean``) builds for each coalition: accuracies equal exactly, losses to float
rounding. Odd shapes (stride, padding, dilation, groups, padding modes, no bias) are where
a first-layer combination that ignored the layer's own arithmetic would go wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedvalue.valuation.round_game import fedavg_aggregator, fedavg_round_game, round_game, value_round, weighted_mean
from fedvalue.scoring.torch_utilities import TorchModelUtility
from simulations.datasets.models import make_cnn
from tests.fedvalue.fedavg_rounds import all_coalition_rows, round_around


def _model(name: str) -> tuple[torch.nn.Sequential, tuple[int, ...], bool]:
    """A model whose first parametrized layer is the one under test, its input shape per
    example (after which x is flattened or indices), and whether x holds indices."""
    torch.manual_seed(7)
    nn = torch.nn
    if name == "conv2d-stride-pad-dilation-groups":
        return nn.Sequential(nn.Unflatten(1, (2, 9, 9)), nn.Conv2d(2, 4, 3, stride=2, padding=2, dilation=2, groups=2),
                             nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, 5)), (2 * 9 * 9,), False
    if name == "conv2d-reflect-no-bias":
        return nn.Sequential(nn.Unflatten(1, (1, 7, 7)), nn.Conv2d(1, 3, (3, 2), padding=1, padding_mode="reflect",
                                                                    bias=False),
                             nn.Tanh(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3 * 3 * 4, 5)), (49,), False
    if name == "conv1d-circular-stride":
        return nn.Sequential(nn.Unflatten(1, (3, 11)), nn.Conv1d(3, 6, 4, stride=3, padding=2, padding_mode="circular"),
                             nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4, 5)), (33,), False
    if name == "conv3d":
        return nn.Sequential(nn.Unflatten(1, (1, 4, 5, 5)), nn.Conv3d(1, 2, 3, padding=1, stride=(1, 2, 2)),
                             nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 3 * 3, 5)), (100,), False
    if name == "embedding-sequence":
        return nn.Sequential(nn.Embedding(13, 6, padding_idx=0), nn.Flatten(), nn.ReLU(), nn.Linear(4 * 6, 5)), \
            (4,), True
    if name == "embedding-flat-mlp-tail":  # flat outputs and an MLP tail: the factored path
        return nn.Sequential(nn.Embedding(17, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 5)), (), True
    if name == "linear-on-sequences":
        return nn.Sequential(nn.Unflatten(1, (3, 4)), nn.Linear(4, 6), nn.ReLU(), nn.Flatten(), nn.Linear(18, 5)), \
            (12,), False
    raise KeyError(name)


NAMES = ["conv2d-stride-pad-dilation-groups", "conv2d-reflect-no-bias", "conv1d-circular-stride", "conv3d",
         "embedding-sequence", "embedding-flat-mlp-tail", "linear-on-sequences"]


def _held_out(seed: int, shape: tuple[int, ...], indices: bool, num: int = 150):
    rng = np.random.default_rng(seed)
    if indices:
        x = rng.integers(0, 13, size=(num, *shape))
    else:
        x = rng.normal(size=(num, *shape)).astype(np.float32)
    return x, rng.integers(0, 5, num)


def _plain(utility, clients, weights, coalitions):
    return [utility(weighted_mean([clients[k] for k in c], weights[list(c)])) for c in coalitions]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
def test_every_coalition_equals_the_plain_path(name, metric):
    model, shape, indices = _model(name)
    x, y = _held_out(1, shape, indices)
    utility = TorchModelUtility(model, x, y, metric=metric, batch_size=60)  # three held-out batches
    assert utility.first_linear is not None
    num_clients = 6 if name == "embedding-flat-mlp-tail" else 4  # 63 rows: enough to factor
    start, clients, weights = round_around(2, num_clients, model, spread=0.4)
    coalitions, rows = all_coalition_rows(num_clients, weights)
    states = utility.linear([start, *clients])
    fast = states.values(rows)
    plain = _plain(utility, clients, weights, coalitions)
    if metric == "accuracy":
        np.testing.assert_array_equal(fast, plain)
    else:
        np.testing.assert_allclose(fast, plain, rtol=1e-6, atol=1e-6)
    factored = states._halves(states._checked(rows), states._tail_plan()) is not None
    assert factored == (name == "embedding-flat-mlp-tail")


@pytest.mark.parametrize("name", ["conv2d-stride-pad-dilation-groups", "embedding-flat-mlp-tail"])
def test_first_layer_outputs_recomputed_per_batch_give_the_same_bits(name, monkeypatch):
    """Past ``head_cache_bytes`` the first-layer outputs are computed per call and batch
    (held-out batches become the outer loop): the same sums, bit for bit."""
    model, shape, indices = _model(name)
    x, y = _held_out(3, shape, indices)
    utility = TorchModelUtility(model, x, y, metric="neg_loss", batch_size=70)
    start, clients, weights = round_around(4, 4, model, spread=0.4)
    _, rows = all_coalition_rows(4, weights)
    kept = utility.linear([start, *clients])
    assert kept.keeps_heads
    recomputed = utility.linear([start, *clients])
    monkeypatch.setattr(recomputed, "head_cache_bytes", 0)
    assert not recomputed.keeps_heads
    for subset in (rows, rows[::3], rows[1:2]):  # factored, chunked, one row
        np.testing.assert_array_equal(recomputed.scores(subset).sums, kept.scores(subset).sums)
    assert recomputed._heads is None  # nothing kept


def test_layers_not_linear_in_their_parameters_score_whole_states():
    nn = torch.nn
    torch.manual_seed(0)
    for model in (nn.Sequential(nn.Embedding(13, 4, max_norm=1.0), nn.Flatten(), nn.Linear(16, 5)),
                  nn.Sequential(nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(),
                                nn.Linear(8, 5)).eval()):
        utility = TorchModelUtility(model, *_held_out(5, (4,) if isinstance(model[0], nn.Embedding) else (16,),
                                                       isinstance(model[0], nn.Embedding), num=40))
        if isinstance(model[0], nn.Embedding):
            assert utility.first_linear is None  # max_norm renormalizes the looked-up rows
        else:
            assert utility.first_linear is not None and not utility.supports_linear  # BatchNorm's counter


@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
def test_lenet_round_values_equal_the_plain_round_game(metric):
    """The simulations' CNN (Unflatten, Conv2d first): exact ADS and LOO of a FedAvg round
    through the fast path equal the plain round game's."""
    model = make_cnn(64, 10, seed=8)
    rng = np.random.default_rng(9)
    x = rng.random((150, 64)).astype(np.float32)
    y = rng.integers(0, 10, 150)
    utility = TorchModelUtility(model, x, y, metric=metric, batch_size=64)
    assert utility.first_linear.weight_key == "1.weight"
    start, clients, weights = round_around(10, 5, model, spread=0.2)
    ids = [f"c{k}" for k in range(5)]
    fast = value_round(fedavg_round_game(ids, start, clients, weights, utility), ("ads", "loo"))
    plain = value_round(round_game(ids, start, fedavg_aggregator(ids, clients, weights), utility), ("ads", "loo"))
    for method in ("ads", "loo"):
        if metric == "accuracy":
            np.testing.assert_array_equal(fast.results[method].values, plain.results[method].values)
        else:
            np.testing.assert_allclose(fast.results[method].values, plain.results[method].values, rtol=0, atol=1e-6)
