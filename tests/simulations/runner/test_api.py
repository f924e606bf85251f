"""simulate()'s seeding and input checks without an engine: A_0 from an unseeded factory, the
default sampler, TracIn flows refused without inference splits (server and client side), a bad client
device refused."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.app.metadata import Metadata
from flwr.serverapp.strategy import FedAvg, FedMedian, Strategy

from clients import ClientData, make_client_app
from fedvalue.scoring.torch_utilities import TorchModelUtility
from simulations import simulate
from simulations.runner.api import default_sampler, initial_model_arrays
from strategies.aggregation.random_state import RandomState
from strategies import BookSettings
from strategies.arrays import arrays_to_numpy


def unseeded_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))


def disturb() -> None:
    np.random.seed(int(time.time_ns() % 2**32))
    random.seed(time.time_ns())
    torch.manual_seed(time.time_ns() % 2**63)


def same_state(a: RandomState, b: RandomState) -> bool:
    return repr(a.numpy) == repr(b.numpy) and a.python == b.python and torch.equal(a.torch_cpu, b.torch_cpu)


def test_the_initial_model_comes_from_the_seed_not_the_global_generators():
    disturb()
    before = RandomState.capture()
    first = arrays_to_numpy(initial_model_arrays(unseeded_model, 7))
    assert same_state(before, RandomState.capture())  # the caller's generators are left alone
    disturb()
    again = arrays_to_numpy(initial_model_arrays(unseeded_model, 7))
    other = arrays_to_numpy(initial_model_arrays(unseeded_model, 8))
    assert all(np.array_equal(first[key], again[key]) for key in first)
    assert not np.array_equal(first["0.weight"], other["0.weight"])
    with pytest.raises(TypeError, match="model_factory: expected a callable"):
        initial_model_arrays(unseeded_model(), 7)


class NoFraction(Strategy):
    """A strategy with no Flower sampling parameters (its methods are never called here)."""

    configure_train = aggregate_train = configure_evaluate = aggregate_evaluate = summary = None


def test_the_default_sampler_takes_the_inner_strategys_size_and_the_runs_seed():
    sampler = default_sampler(FedAvg(fraction_train=0.5), 10, seed=4)
    assert sampler.clients_per_round == 5 and sampler.seed == 4
    assert sampler.sample(3, range(10)) == sampler.sample(3, range(10))
    assert default_sampler(FedAvg(fraction_train=0.1, min_train_nodes=3), 10, seed=0).clients_per_round == 3
    assert default_sampler(FedMedian(fraction_train=1.0), 4, seed=0).clients_per_round == 4
    assert default_sampler(FedAvg(fraction_train=0.0), 4, seed=0) is None
    with pytest.raises(ValueError, match="sampler: expected a sampler .* for a NoFraction"):
        default_sampler(NoFraction(), 4, seed=0)


def no_inference_split(partition_id: int) -> ClientData:
    rng = np.random.default_rng(partition_id)
    x = rng.normal(size=(8, 4)).astype(np.float32)
    infer = 2 if partition_id == 1 else 0
    return ClientData(partition_id=partition_id, x_train=x, y_train=rng.integers(0, 3, 8),
                      x_infer=x[:infer], y_infer=np.zeros(infer, dtype=np.int64))


def test_flows_without_inference_splits_are_refused_before_anything_starts(tmp_path):
    utility = TorchModelUtility(unseeded_model(), np.zeros((2, 4), np.float32), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"flows: TracIn flows need every client's inference split \(ClientData's "
                                         r"x_infer, y_infer\); 2 of 3 clients have none \(partition 0, 2\)\. .*"
                                         r"BookSettings\(flows=False\)"):
        simulate(strategy=FedAvg(fraction_evaluate=0.0), model_factory=unseeded_model,
                 load_client_data=no_inference_split, num_clients=3, num_rounds=1, utility=utility,
                 out=tmp_path / "run", books=BookSettings(flows=True), train_config={"lr": 0.1, "local-epochs": 1})
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("client_device, match", [
    ("tpu", r"device: expected a torch device string of type cpu or cuda"),
    ("cuda", r"engine\.num_gpus_per_client: clients training on 'cuda' need Ray GPU shares .*got 0"),
])
def test_a_bad_client_device_is_refused_before_anything_starts(tmp_path, client_device, match):
    utility = TorchModelUtility(unseeded_model(), np.zeros((2, 4), np.float32), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=match):
        simulate(strategy=FedAvg(fraction_evaluate=0.0), model_factory=unseeded_model,
                 load_client_data=no_inference_split, num_clients=3, num_rounds=1, utility=utility,
                 out=tmp_path / "run", train_config={"lr": 0.1, "local-epochs": 1}, client_device=client_device)
    assert not (tmp_path / "run").exists()


def message(content: RecordDict, message_type: str) -> Message:
    metadata = Metadata(run_id=1, message_id="m", src_node_id=0, dst_node_id=5, reply_to_message_id="", group_id="1",
                        created_at=time.time(), ttl=3600.0, message_type=message_type)
    return Message(content, metadata=metadata)


def context(partition_id: int) -> Context:
    return Context(run_id=1, node_id=5, node_config={"partition-id": partition_id, "num-partitions": 3},
                   state=RecordDict(), run_config={})


def test_the_client_refuses_a_gradient_query_without_an_inference_split_and_keeps_the_generators():
    app = make_client_app(no_inference_split, unseeded_model)
    arrays = ArrayRecord({k: Array(v) for k, v in arrays_to_numpy(initial_model_arrays(unseeded_model, 0)).items()})
    query = RecordDict({"arrays": arrays, "config": ConfigRecord({"inference-gradient": True})})
    with pytest.raises(ValueError, match="x_infer, y_infer: the server asked client 0 for its inference gradient"):
        app(message(query, "query"), context(0))
    assert "inference-gradient" in app(message(query, "query"), context(1)).content.array_records
    train = RecordDict({"arrays": arrays, "config": ConfigRecord({"lr": 0.1, "local-epochs": 2, "seed": 3,
                                                                  "server-round": 1})})
    disturb()
    before = RandomState.capture()
    first = app(message(train, "train"), context(2)).content["arrays"]
    assert same_state(before, RandomState.capture())  # the factory's draws happen in a fork
    disturb()
    again = app(message(train, "train"), context(2)).content["arrays"]
    assert all(np.array_equal(first[k].numpy(), again[k].numpy()) for k in first)
