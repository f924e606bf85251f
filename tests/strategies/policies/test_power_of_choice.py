"""Power-of-Choice on a real ClientApp in process (no Ray): the loss query, the choice, the books."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, MessageType, RecordDict

from clients.app import ClientData, local_loss, make_client_app
from clients.behaviours import HonestClient, LabelNoise
from fedvalue.analysis.run_summary import load_run
from fedvalue.scoring.torch_utilities import TorchModelUtility
from fedvalue.valuation.settings import ValuationSettings
from simulations.datasets.models import make_mlp
from strategies import PowerOfChoice, RunSettings, ValuingStrategy
from strategies.intake.nodes import NodeDirectory
from strategies.protocol import LOCAL_LOSS_KEY
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from strategies.valuing_settings import IntakeSettings

from tests.strategies.harness.bare_and_wrapped import one_torch_thread  # noqa: F401
from tests.strategies.harness.clientapp_grid import ClientAppGrid

NUM_CLIENTS, FEATURES, CLASSES = 8, 4, 2
NODES = {5003 + 11 * pid: pid for pid in range(NUM_CLIENTS)}
NOISY = {1, 4, 6}  # their labels are flipped: a good model has a high loss on them


def model_factory() -> torch.nn.Module:
    return make_mlp(FEATURES, CLASSES, hidden=(8,), seed=0)


def load_client(partition_id: int) -> ClientData:
    rng = np.random.default_rng([5, partition_id])
    x = rng.normal(size=(30 + 3 * partition_id, FEATURES)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    behaviour = LabelNoise(1.0, CLASSES, seed=[0, partition_id]) if partition_id in NOISY else HonestClient()
    return ClientData(partition_id=partition_id, x_train=x, y_train=y, x_infer=x[:0], y_infer=y[:0],
                      behaviour=behaviour)


def initial():
    return numpy_to_arrays({k: v.detach().numpy() for k, v in model_factory().state_dict().items()})


def run(tmp_path, *, seed: int = 0, rounds: int = 3, candidates: int = 5):
    grid = ClientAppGrid(make_client_app(load_client, model_factory), NODES)
    nodes = NodeDirectory()
    poc = PowerOfChoice(3, candidates, seed=seed, nodes=nodes, fraction_evaluate=0.0)
    x = np.random.default_rng(9).normal(size=(100, FEATURES)).astype(np.float32)
    strategy = ValuingStrategy(poc, TorchModelUtility(model_factory(), x, (x[:, 0] > 0).astype(np.int64)),
                               run_dir=str(tmp_path), seed=seed, valuation=ValuationSettings(methods=()),
                               intake=IntakeSettings(nodes=nodes), run=RunSettings(checkpoint=False))
    strategy.start(grid, initial(), num_rounds=rounds, timeout=60,
                   train_config=ConfigRecord({"lr": 0.5, "local-epochs": 3, "seed": seed}))
    return grid, poc


def test_each_round_trains_the_highest_loss_candidates_the_clients_report(tmp_path):
    grid, poc = run(tmp_path)
    rounds = load_run(tmp_path).rounds
    train = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    loss_queries = [m for m in grid.sent if m.metadata.message_type == MessageType.QUERY  # not the directory's
                    and m.content.config_records.get("config", {}).get(LOCAL_LOSS_KEY)]
    assert len(loss_queries) == 3 * 5 and len(train) == 3 * 3
    for t in (1, 2, 3):
        losses = poc.losses[t]
        assert len(losses) == 5
        expected = sorted(sorted(losses, key=lambda c: (-losses[c], c))[:3])
        assert rounds.loc[rounds["round"] == t, "clients"].iloc[0].split() == [str(c) for c in expected]
        # What each candidate reported is its loss on the data it trains on, at the round's start state.
        start = arrays_to_numpy(train[3 * (t - 1)].content["arrays"])
        for client, loss in losses.items():
            assert loss == local_loss(load_client(client), model_factory, start, seed=0, server_round=t)


def test_at_a_model_that_fits_the_clean_labels_the_label_flippers_are_chosen():
    model = model_factory()
    x = np.random.default_rng(11).normal(size=(400, FEATURES)).astype(np.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    labels = torch.tensor((x[:, 0] > 0).astype(np.int64))
    for _ in range(200):  # a model of the clean rule y = [x_0 > 0]
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.tensor(x)), labels).backward()
        optimizer.step()
    fitted = numpy_to_arrays({k: v.detach().numpy() for k, v in model.state_dict().items()})
    grid = ClientAppGrid(make_client_app(load_client, model_factory), NODES)
    poc = PowerOfChoice(3, NUM_CLIENTS, seed=0, fraction_evaluate=0.0)  # every client a candidate
    messages = poc.configure_train(1, fitted, ConfigRecord({"lr": 0.1, "local-epochs": 1}), grid)
    assert {NODES[int(m.metadata.dst_node_id)] for m in messages} == NOISY
    assert min(poc.losses[1][c] for c in NOISY) > max(v for c, v in poc.losses[1].items() if c not in NOISY)


def test_the_same_seed_gives_the_same_candidates_and_books(tmp_path):
    _, first = run(tmp_path / "a", seed=4)
    _, again = run(tmp_path / "b", seed=4)
    _, other = run(tmp_path / "c", seed=5)
    assert first.losses == again.losses
    assert load_run(tmp_path / "a").rounds["clients"].tolist() == load_run(tmp_path / "b").rounds["clients"].tolist()
    assert [sorted(first.losses[t]) for t in (1, 2, 3)] != [sorted(other.losses[t]) for t in (1, 2, 3)]


def test_a_reply_speaking_for_another_client_is_not_counted(tmp_path):
    app = make_client_app(load_client, model_factory)

    class Liar(ClientAppGrid):
        def send_and_receive(self, messages, *, timeout=None):
            replies = super().send_and_receive(messages, timeout=timeout)
            for reply in replies:  # node of partition 2 answers the loss query as partition 7, with a huge loss
                record = reply.content.config_records["client"]
                if "local-loss" in record and record["partition-id"] == 2:
                    record["partition-id"], record["local-loss"] = 7, 1e9
            return replies

    grid = Liar(app, NODES)
    poc = PowerOfChoice(2, 8, seed=0, fraction_evaluate=0.0)
    poc.configure_train(1, initial(), ConfigRecord({"lr": 0.1, "local-epochs": 1}), grid)
    assert 2 not in poc.losses[1] and poc.losses[1].get(7, 0.0) < 1e9 and len(poc.losses[1]) == 7


def test_bad_settings_name_the_parameter():
    with pytest.raises(ValueError, match="candidates: expected d >= clients_per_round=3"):
        PowerOfChoice(3, 2)
    with pytest.raises(ValueError, match="clients_per_round"):
        PowerOfChoice(0, 2)
    grid = ClientAppGrid(make_client_app(load_client, model_factory), NODES)
    with pytest.raises(ValueError, match="candidates: expected at most the 8 connected clients"):
        PowerOfChoice(3, 9).configure_train(1, initial(), ConfigRecord({}), grid)


def test_the_query_without_the_flag_answers_no_loss():
    app = make_client_app(load_client, model_factory)
    grid = ClientAppGrid(app, NODES)
    from flwr.app import Message

    node = next(iter(NODES))
    plain = Message(RecordDict({"arrays": initial(), "config": ConfigRecord({"seed": 0})}), dst_node_id=node,
                    message_type=MessageType.QUERY)
    (reply,) = grid.send_and_receive([plain])
    assert "local-loss" not in reply.content.config_records["client"]
