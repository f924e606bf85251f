"""Any torch model: BatchNorm, dropout, embeddings and integer buffers are valued exactly.

Each model runs bare and wrapped (FedAvg on the weighted-mean path, FedAdam through its own
code) on real ClientApps: every reply is valued (none failed), v_t(I_t) = U(A_t) exactly,
group efficiency holds and the wrapped run is the bare run bit for bit. The utility's fast
linear path declines what it cannot handle and equals the plain path where it runs.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from flwr.serverapp.strategy import FedAdam, FedAvg

from clients.app import ClientData
from fedvalue.valuation.round_game import fedavg_round_game, weighted_mean
from fedvalue.scoring.linear import split_first_linear
from fedvalue.scoring.torch_utilities import TorchModelUtility

from tests.strategies.harness.bare_and_wrapped import Setup, assert_untouched_and_sound, one_torch_thread, run  # noqa: F401

FEATURES, CLASSES, VOCABULARY, TOKENS = 6, 3, 10, 4


class EmbeddingBag(torch.nn.Module):
    """Token ids (as floats, the way clients send inputs) -> mean embedding -> logits."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embedding = torch.nn.Embedding(VOCABULARY, 8)
        self.head = torch.nn.Linear(8, CLASSES)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)

    def forward(self, x):
        return self.head(self.embedding(x.long()).mean(dim=1))


class CountingMLP(torch.nn.Module):
    """An MLP with an integer buffer counting training forward passes (0-d int64)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _seeded(torch.nn.Sequential(torch.nn.Linear(FEATURES, 12), torch.nn.Tanh(),
                                                torch.nn.Linear(12, CLASSES)))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        if self.training:
            self.calls += 1
        return self.body(x)


class ScaledLinear(torch.nn.Linear):
    """A Linear subclass computing 2·(x Wᵀ + b): not what the fast path assumes of nn.Linear."""

    def forward(self, x):
        return 2 * super().forward(x)


def _seeded(module: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return module


MODELS = {
    "batchnorm": lambda: _seeded(torch.nn.Sequential(torch.nn.Linear(FEATURES, 12), torch.nn.BatchNorm1d(12),
                                                     torch.nn.ReLU(), torch.nn.Linear(12, CLASSES))),
    "dropout": lambda: _seeded(torch.nn.Sequential(torch.nn.Linear(FEATURES, 12), torch.nn.ReLU(),
                                                   torch.nn.Dropout(0.3), torch.nn.Linear(12, CLASSES))),
    "embedding": EmbeddingBag,
    "integer-buffer": CountingMLP,
}


def _inputs(model: str, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    if model == "embedding":
        x = rng.integers(0, VOCABULARY, size=(n, TOKENS)).astype(np.float32)
        return x, (x[:, 0] % CLASSES).astype(np.int64)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    return x, ((x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)).clip(0, CLASSES - 1)


def setup_for(model: str) -> Setup:
    def load_client(partition_id: int) -> ClientData:
        x, y = _inputs(model, np.random.default_rng([3, partition_id]), 24 + 8 * partition_id)  # whole batches of 8
        return ClientData(partition_id=partition_id, x_train=x, y_train=y, x_infer=x[:0], y_infer=y[:0])

    def make_utility() -> TorchModelUtility:
        x, y = _inputs(model, np.random.default_rng(99), 200)
        return TorchModelUtility(MODELS[model](), x, y, metric="neg_loss")

    return Setup(MODELS[model], load_client, make_utility, num_clients=4, rounds=2,
                 train_config={"lr": 0.1, "local-epochs": 3, "batch-size": 8, "seed": 0})


@pytest.mark.parametrize("strategy", ["fedavg", "fedadam"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_model_is_valued_exactly_and_leaves_the_run_untouched(model, strategy):
    setup = setup_for(model)
    build = {"fedavg": lambda: FedAvg(fraction_evaluate=0.0),
             "fedadam": lambda: FedAdam(fraction_evaluate=0.0, eta=0.05)}[strategy]
    bare = run(setup, build, wrapped=False)
    wrapped = run(setup, build, wrapped=True)
    assert_untouched_and_sound(setup, bare, wrapped)


def test_training_with_dropout_is_reproducible_and_keeps_the_callers_random_state():
    from clients.training import train_locally

    x, y = _inputs("dropout", np.random.default_rng(0), 40)
    results = []
    for _ in range(2):
        torch.manual_seed(7)
        model = MODELS["dropout"]()
        before = torch.get_rng_state()
        train_locally(model, x, y, epochs=3, learning_rate=0.1, seed=5)
        assert torch.equal(torch.get_rng_state(), before)  # the caller's generator is untouched
        results.append(torch.cat([p.detach().ravel() for p in model.parameters()]))
    other = MODELS["dropout"]()
    train_locally(other, x, y, epochs=3, learning_rate=0.1, seed=6)
    assert torch.equal(results[0], results[1])
    assert not torch.equal(results[0], torch.cat([p.detach().ravel() for p in other.parameters()]))


@pytest.mark.parametrize("model", sorted(MODELS))
def test_round_game_on_any_model_equals_the_plain_utility_of_each_coalition(model):
    """The FedAvg round game (fast path where the utility offers one) against U of the
    materialized weighted mean, for every coalition of three trained replies."""
    setup = setup_for(model)
    utility = setup.make_utility()
    start = {k: v.detach().numpy().copy() for k, v in setup.model_factory().state_dict().items()}
    rng = np.random.default_rng(1)
    replies = []
    for _ in range(3):
        reply = {}
        for key, value in start.items():
            noise = rng.normal(scale=0.2, size=value.shape)
            reply[key] = (value + noise).astype(value.dtype) if value.dtype.kind == "f" else value + 3
        replies.append(reply)
    weights = [10.0, 20.0, 30.0]
    game = fedavg_round_game([0, 1, 2], start, replies, weights, utility)
    for size in range(4):
        for coalition in itertools.combinations(range(3), size):
            expected = utility(start) if not coalition else utility(
                weighted_mean([replies[i] for i in coalition], [weights[i] for i in coalition]))
            got = game.value(game.mask_of(coalition))
            assert np.isfinite(got)
            assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), coalition
    assert utility.supports_linear == all(v.dtype.kind == "f" for v in start.values())


def test_fast_path_declines_a_linear_subclass_and_still_scores_it_exactly():
    model = _seeded(torch.nn.Sequential(ScaledLinear(FEATURES, 8), torch.nn.ReLU(), torch.nn.Linear(8, CLASSES)))
    assert split_first_linear(model) is None
    x, y = _inputs("batchnorm", np.random.default_rng(2), 100)
    utility = TorchModelUtility(model, x, y, metric="neg_loss")
    basis = [{k: v.detach().numpy() + i * 0.1 for k, v in model.state_dict().items()} for i in range(3)]
    rows = np.array([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])
    fast = utility.linear(basis).values(rows)
    plain = [utility(weighted_mean(basis, list(row))) for row in rows]
    np.testing.assert_allclose(fast, plain, rtol=1e-6)
