"""The ClientApp called in-process with hand-built Messages (no Ray), and the behaviours.

Messages are built with explicit Metadata, as the simulation engine delivers them, so no
task identity has to be set.
"""

from __future__ import annotations

import functools
import pickle
import time

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.app.metadata import Metadata
from flwr.serverapp.strategy import FedAvg
from ray import cloudpickle

from clients import ClientData, FreeRider, HonestClient, LabelNoise, get_model_arrays, make_client_app
from clients.behaviours import ClientBehaviour

NUM_CLASSES = 3
NUM_FEATURES = 5


def small_mlp() -> torch.nn.Module:
    generator = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(NUM_FEATURES, 8), torch.nn.ReLU(), torch.nn.Linear(8, NUM_CLASSES))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.rand(parameter.shape, generator=generator) - 0.5)
    return model


def client_data(partition_id: int, *, behaviour: ClientBehaviour | None = None, num_infer: int = 0) -> ClientData:
    rng = np.random.default_rng(partition_id)
    centers = np.eye(NUM_CLASSES, NUM_FEATURES, dtype=np.float32) * 3
    y = rng.integers(0, NUM_CLASSES, size=30 + num_infer)
    x = (centers[y] + rng.normal(size=(len(y), NUM_FEATURES))).astype(np.float32)
    return ClientData(
        partition_id=partition_id, x_train=x[:30], y_train=y[:30], x_infer=x[30:], y_infer=y[30:],
        behaviour=behaviour or HonestClient(),
    )


def instruction(content: RecordDict, message_type: str, *, dst_node_id: int = 11, message_id: str = "msg-1") -> Message:
    metadata = Metadata(
        run_id=1, message_id=message_id, src_node_id=0, dst_node_id=dst_node_id, reply_to_message_id="",
        group_id="1", created_at=time.time(), ttl=3600.0, message_type=message_type,
    )
    return Message(content, metadata=metadata)


def context(partition_id: int | None, node_id: int = 11) -> Context:
    node_config = {} if partition_id is None else {"partition-id": partition_id, "num-partitions": 4}
    return Context(run_id=1, node_id=node_id, node_config=node_config, state=RecordDict(), run_config={})


def global_arrays() -> ArrayRecord:
    return ArrayRecord({key: Array(value) for key, value in get_model_arrays(small_mlp()).items()})


def train_message(**config) -> Message:
    values = {"lr": 0.1, "local-epochs": 3, "batch-size": 0, "seed": 0, "server-round": 1} | config
    return instruction(RecordDict({"arrays": global_arrays(), "config": ConfigRecord(values)}), "train")


def reply_arrays(reply: Message) -> dict[str, np.ndarray]:
    return {key: array.numpy() for key, array in reply.content["arrays"].items()}


@pytest.fixture(scope="module")
def app():
    return make_client_app(client_data, small_mlp)


# --- train ---------------------------------------------------------------------------------


def test_train_reply_carries_arrays_metrics_and_partition_id_in_a_config_record(app):
    message = train_message()
    reply = app(message, context(2))
    assert reply.metadata.reply_to_message_id == "msg-1" and reply.metadata.src_node_id == 11
    content = reply.content
    assert list(content.array_records) == ["arrays"] and list(content.metric_records) == ["metrics"]
    assert dict(content.config_records["client"]) == {"partition-id": 2}
    metrics = content["metrics"]
    assert metrics["num-examples"] == 30 and type(metrics["num-examples"]) is int
    assert type(metrics["train-loss"]) is float and np.isfinite(metrics["train-loss"])
    trained, start = reply_arrays(reply), {k: a.numpy() for k, a in message.content["arrays"].items()}
    assert list(trained) == list(start) == list(small_mlp().state_dict())
    assert all(trained[k].dtype == np.float32 for k in trained)
    assert any(not np.array_equal(trained[k], start[k]) for k in trained)


def test_fedavg_accepts_the_replies_and_does_not_average_the_partition_id(app):
    replies = [app(train_message(), context(pid, node_id=100 + pid)) for pid in range(3)]
    arrays, metrics = FedAvg().aggregate_train(1, replies)
    assert arrays is not None and set(arrays) == set(small_mlp().state_dict())
    assert set(metrics) == {"train-loss"}
    expected = np.mean([reply_arrays(r)["2.bias"] for r in replies], axis=0)  # equal num-examples
    np.testing.assert_allclose(arrays["2.bias"].numpy(), expected, rtol=1e-6)


def test_same_seed_same_reply_other_seed_or_round_other_reply(app):
    def run(**config):
        return reply_arrays(app(train_message(**{"batch-size": 4} | config), context(1)))

    first, again = run(seed=5), run(seed=5)
    assert all(first[k].tobytes() == again[k].tobytes() for k in first)
    for other in (run(seed=6), run(seed=5, **{"server-round": 2})):
        assert any(not np.array_equal(first[k], other[k]) for k in first)


def test_partition_round_and_seed_reach_the_behaviour_through_a_seed_sequence():
    seen = []

    class Recording(ClientBehaviour):
        def transform_training_data(self, x, y, rng):
            seen.append(rng.integers(2**32))
            return x, y

    recording = Recording()
    app = make_client_app(functools.partial(client_data, behaviour=recording), small_mlp)
    for pid, round_ in [(0, 1), (0, 1), (1, 1), (0, 2)]:
        app(train_message(**{"server-round": round_, "seed": 9}), context(pid))
    assert seen[0] == seen[1] and len({seen[0], seen[2], seen[3]}) == 3


def test_label_noise_client_trains_on_flipped_labels(app):
    noisy_app = make_client_app(functools.partial(client_data, behaviour=LabelNoise(1.0, NUM_CLASSES, seed=0)), small_mlp)
    honest = reply_arrays(app(train_message(), context(0)))
    noisy_reply = noisy_app(train_message(), context(0))
    noisy = reply_arrays(noisy_reply)
    assert any(not np.array_equal(honest[k], noisy[k]) for k in honest)
    assert noisy_reply.content["metrics"]["num-examples"] == 30


def test_free_rider_replies_the_global_model_with_its_example_count():
    free_app = make_client_app(functools.partial(client_data, behaviour=FreeRider()), small_mlp)
    message = train_message()
    reply = free_app(message, context(3))
    for key, array in message.content["arrays"].items():
        np.testing.assert_array_equal(reply_arrays(reply)[key], array.numpy())
    assert reply.content["metrics"]["num-examples"] == 30


# --- evaluate and query --------------------------------------------------------------------


def test_evaluate_scores_the_inference_split_or_else_the_train_split():
    app = make_client_app(functools.partial(client_data, num_infer=12), small_mlp)
    content = RecordDict({"arrays": global_arrays(), "config": ConfigRecord({"server-round": 1})})
    reply = app(instruction(content, "evaluate"), context(1))
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == 12 and set(metrics) == {"num-examples", "eval-loss", "eval-accuracy"}
    assert 0.0 <= metrics["eval-accuracy"] <= 1.0 and reply.content["client"]["partition-id"] == 1
    train_only = make_client_app(client_data, small_mlp)(instruction(content, "evaluate"), context(1))
    assert train_only.content["metrics"]["num-examples"] == 30


def test_query_replies_the_partition_id_only(app):
    reply = app(instruction(RecordDict(), "query"), context(3))
    assert dict(reply.content["client"]) == {"partition-id": 3}
    assert not reply.content.array_records and not reply.content.metric_records


# --- errors --------------------------------------------------------------------------------


def test_missing_learning_rate_is_named(app):
    message = instruction(RecordDict({"arrays": global_arrays(), "config": ConfigRecord({"local-epochs": 1})}), "train")
    with pytest.raises(ValueError, match="train config 'lr': expected a finite number > 0; got None"):
        app(message, context(0))
    message = instruction(RecordDict({"arrays": global_arrays(), "config": ConfigRecord({"lr": 0.1})}), "train")
    with pytest.raises(ValueError, match="train config: expected key 'local-epochs'"):
        app(message, context(0))


def test_missing_partition_id_is_named(app):
    with pytest.raises(ValueError, match=r"context.node_config\['partition-id'\]: expected a non-negative int"):
        app(train_message(), context(None))


def test_loader_returning_another_partition_is_rejected():
    app = make_client_app(lambda pid: client_data(pid + 1), small_mlp)
    with pytest.raises(ValueError, match="load_client_data: asked for partition 0, got ClientData with partition_id 1"):
        app(train_message(), context(0))


def test_client_data_validates_itself():
    x, y = np.zeros((4, 2), np.float32), np.zeros(4, np.int64)
    with pytest.raises(ValueError, match="partition_id"):
        ClientData(-1, x, y, x[:0], y[:0])
    with pytest.raises(ValueError, match="x_train: expected at least one training example"):
        ClientData(0, x[:0], y[:0], x, y)
    with pytest.raises(ValueError, match="x_infer, y_infer: expected N x d inputs and N labels"):
        ClientData(0, x, y, x[:2], y[:1])
    with pytest.raises(TypeError, match="behaviour: expected a clients.behaviours.ClientBehaviour"):
        ClientData(0, x, y, x[:0], y[:0], behaviour="noisy")
    with pytest.raises(ValueError, match="loss: expected one of"):
        ClientData(0, x, y, x[:0], y[:0], loss="hinge")


def test_make_client_app_rejects_non_callables():
    with pytest.raises(TypeError, match="load_client_data"):
        make_client_app([client_data(0)], small_mlp)
    with pytest.raises(TypeError, match="model_factory"):
        make_client_app(client_data, small_mlp())


# --- transport -----------------------------------------------------------------------------


def test_the_app_survives_cloudpickle_as_ray_sends_it():
    noisy_loader = functools.partial(client_data, behaviour=LabelNoise(0.7, NUM_CLASSES, seed=[0, 1]))
    app = make_client_app(noisy_loader, small_mlp)
    copied = cloudpickle.loads(cloudpickle.dumps(app))
    a = reply_arrays(app(train_message(), context(1)))
    b = reply_arrays(copied(train_message(), context(1)))
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)


# --- behaviours ----------------------------------------------------------------------------


def test_label_noise_with_a_seed_flips_the_same_labels_every_round():
    behaviour = LabelNoise(0.5, 10, seed=[4, 2])
    x, y = np.zeros((500, 1), np.float32), np.arange(500) % 10
    first = behaviour.transform_training_data(x, y, np.random.default_rng(1))[1]
    second = behaviour.transform_training_data(x, y, np.random.default_rng(2))[1]
    np.testing.assert_array_equal(first, second)
    assert 0.4 < np.mean(first != y) < 0.6
    restored = pickle.loads(pickle.dumps(behaviour))
    np.testing.assert_array_equal(restored.transform_training_data(x, y, np.random.default_rng(3))[1], first)


def test_label_noise_without_a_seed_draws_from_the_round_generator():
    behaviour = LabelNoise(0.5, 10)
    x, y = np.zeros((500, 1), np.float32), np.arange(500) % 10
    a = behaviour.transform_training_data(x, y, np.random.default_rng(1))[1]
    b = behaviour.transform_training_data(x, y, np.random.default_rng(1))[1]
    c = behaviour.transform_training_data(x, y, np.random.default_rng(2))[1]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_label_noise_validates_where_it_is_configured():
    with pytest.raises(ValueError, match=r"p: expected a number in \[0, 1\]"):
        LabelNoise(1.2, 10)
    with pytest.raises(ValueError, match="num_classes: expected an integer ≥ 2"):
        LabelNoise(0.5, 1)
    with pytest.raises(ValueError, match="seed"):
        LabelNoise(0.5, 10, seed="zero")
    assert repr(LabelNoise(0.5, 10)) == "LabelNoise(p=0.5, num_classes=10)"


def test_honest_defaults_are_identities():
    x, y = np.ones((3, 2), np.float32), np.array([0, 1, 2])
    rng = np.random.default_rng(0)
    assert HonestClient().transform_training_data(x, y, rng) == (x, y)
    arrays = {"w": np.ones(2)}
    assert HonestClient().transform_reply({"w": np.zeros(2)}, arrays, 3, rng) == (arrays, 3)
