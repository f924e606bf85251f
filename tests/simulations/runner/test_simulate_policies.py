"""What a user who acts on values in their own code meets in simulate(): a per-round ``evaluate``
that sees the global arrays and changes nothing booked, and a strategy that chooses its own
clients (Power-of-Choice) left to choose them. Real Ray runs of a small linear model."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import FedAvg

from clients import ClientData, HonestClient
from fedvalue.ledger import read_round
from fedvalue.utilities import TorchModelUtility
from simulations.datasets import make_linear_model
from simulations.runner import initial_model_arrays, simulate
from simulations.runner.api import ServerEvaluation
from strategies import ChoosesOwnClients, PartitionSampler, PowerOfChoice, ValuingStrategy

FEATURES, CLASSES, CLIENTS, ROUNDS = 5, 3, 6, 3


def model() -> torch.nn.Module:
    return make_linear_model(FEATURES, CLASSES, seed=0)


def load_client(partition_id: int) -> ClientData:
    rng = np.random.default_rng(partition_id)
    y = rng.integers(0, CLASSES, size=30 + 10 * partition_id)
    x = (np.eye(CLASSES, FEATURES)[y] + rng.normal(scale=0.5 + 0.2 * partition_id, size=(len(y), FEATURES)))
    x = x.astype(np.float32)
    return ClientData(partition_id, x, y, x[:0], y[:0], behaviour=HonestClient())


def utility() -> TorchModelUtility:
    rng = np.random.default_rng(99)
    y = rng.integers(0, CLASSES, size=60)
    return TorchModelUtility(model(), (np.eye(CLASSES, FEATURES)[y] + rng.normal(size=(60, FEATURES))).astype(np.float32),
                             y)


def run(out, *, strategy=None, **keywords):
    return simulate(strategy=strategy or FedAvg(fraction_train=0.5, fraction_evaluate=0.0), model_factory=model,
                    load_client_data=load_client, num_clients=CLIENTS, num_rounds=ROUNDS, utility=utility(), out=out,
                    train_config={"lr": 0.3, "local-epochs": 1}, seed=4, round_timeout=300, **keywords)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two runs of Power-of-Choice from the same seed, one with an ``evaluate`` that draws from every global
    generator: (folder, what evaluate saw, the evaluated run's strategy)."""
    out, seen = tmp_path_factory.mktemp("own-policy"), {}
    held_out = utility()

    def evaluate(server_round, arrays):
        seen[server_round] = arrays
        random.random(), np.random.rand(3), torch.rand(2)  # the user's code draws from every global generator
        return {"accuracy": held_out(arrays)}

    run(out / "plain", strategy=PowerOfChoice(2, 4, seed=1, fraction_evaluate=0.0))
    poc = PowerOfChoice(2, 4, seed=1, fraction_evaluate=0.0)
    books = run(out / "evaluated", strategy=poc, evaluate=evaluate)
    return out, seen, poc, books


def test_evaluate_sees_every_round_s_global_arrays_and_changes_nothing_booked(pair):
    out, seen, _, _ = pair
    assert (out / "plain" / "ledger.csv").read_bytes() == (out / "evaluated" / "ledger.csv").read_bytes()
    assert sorted(seen) == list(range(ROUNDS + 1))
    initial = initial_model_arrays(model, 4)
    assert all(np.array_equal(seen[0][k], initial[k].numpy()) for k in seen[0])
    for t in range(1, ROUNDS):  # A_t is the next round's start
        start = read_round(out / "evaluated", t + 1).start_arrays
        assert all(np.array_equal(seen[t][k], start[k]) for k in start), t


def test_evaluate_returning_something_else_is_named_and_a_callable_is_required():
    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})
    with pytest.raises(TypeError, match="evaluate: expected it to return None or a mapping .* got '0.9' in round 3"):
        ServerEvaluation(lambda t, a: "0.9")(3, arrays)
    assert ServerEvaluation(lambda t, a: None)(1, arrays) is None
    assert ServerEvaluation(lambda t, a: {"acc": 1})(1, arrays)["acc"] == 1.0
    with pytest.raises(TypeError, match="evaluate: expected a callable"):
        ServerEvaluation("accuracy")


def test_power_of_choice_chooses_its_own_clients_in_simulate_and_a_sampler_beside_it_is_refused(pair, tmp_path):
    _, _, poc, books = pair
    assert isinstance(poc, ChoosesOwnClients)
    for t in range(1, ROUNDS + 1):
        trained = [int(c) for c in str(books.rounds.loc[books.rounds["round"] == t, "clients"].iloc[0]).split()]
        losses = poc.losses[t]
        assert len(losses) == 4
        assert trained == sorted(sorted(losses, key=lambda c: (-losses[c], c))[:2]), t
    with pytest.raises(ValueError, match="sampler: expected None with PowerOfChoice, which chooses its own clients"):
        ValuingStrategy(PowerOfChoice(2, 4), utility(), sampler=PartitionSampler(2, seed=0))
    with pytest.raises(ValueError, match="sampler: expected None with PowerOfChoice"):
        run(tmp_path / "both", strategy=PowerOfChoice(2, 4), sampler=PartitionSampler(2, seed=0))
    assert not (tmp_path / "both").exists()
