"""NodeDirectory: runs on one engine share it and query each node once; the books do not change."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, MessageType
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from clients.app import ClientData, make_client_app
from fedvalue.analysis.run_summary import load_run
from fedvalue.scoring.torch_utilities import TorchModelUtility
from simulations.datasets.models import make_mlp
from strategies import PartitionSampler, ValuingStrategy
from strategies.intake.nodes import NodeDirectory, QueryTimedOut
from strategies.arrays import numpy_to_arrays
from fedvalue.valuation.settings import ValuationSettings
from fedvalue.run.settings import RunSettings
from strategies.valuing_settings import IntakeSettings

from tests.strategies.harness.bare_and_wrapped import one_torch_thread  # noqa: F401
from tests.strategies.harness.clientapp_grid import ClientAppGrid, EngineLikeGrid
from tests.strategies.harness.inprocess import InProcessGrid

NUM_CLIENTS, FEATURES, CLASSES = 5, 4, 2
NODES = {9001 + 7 * pid: pid for pid in range(NUM_CLIENTS)}


def model_factory() -> torch.nn.Module:
    return make_mlp(FEATURES, CLASSES, hidden=(8,), seed=0)


def load_client(partition_id: int) -> ClientData:
    rng = np.random.default_rng([3, partition_id])
    x = rng.normal(size=(20 + 4 * partition_id, FEATURES)).astype(np.float32)
    y = (x[:, 0] + 0.5 * partition_id * x[:, 1] > 0).astype(np.int64)
    return ClientData(partition_id=partition_id, x_train=x, y_train=y, x_infer=x[:0], y_infer=y[:0])


def utility() -> TorchModelUtility:
    x = np.random.default_rng(8).normal(size=(100, FEATURES)).astype(np.float32)
    return TorchModelUtility(model_factory(), x, (x[:, 0] > 0).astype(np.int64))


def run_on(grid, run_dir, seed: int, nodes: NodeDirectory | None) -> None:
    strategy = ValuingStrategy(
        FedAvg(fraction_evaluate=0.0), utility(), run_dir=str(run_dir), sampler=PartitionSampler(3, seed=seed),
        seed=seed, valuation=ValuationSettings(methods=("ads", "loo")), intake=IntakeSettings(nodes=nodes),
        run=RunSettings(checkpoint=False)
    )
    initial = numpy_to_arrays({k: v.detach().numpy() for k, v in model_factory().state_dict().items()})
    strategy.start(grid, initial, num_rounds=2, timeout=60,
                   train_config=ConfigRecord({"lr": 0.2, "local-epochs": 2, "seed": seed}))


def queries(grid) -> int:
    return sum(m.metadata.message_type == MessageType.QUERY for m in grid.sent)


def test_runs_sharing_a_directory_query_each_node_once_and_keep_their_books(tmp_path):
    shared_grid, own_grid = (ClientAppGrid(make_client_app(load_client, model_factory), NODES) for _ in range(2))
    nodes = NodeDirectory()
    for seed in (0, 1):
        run_on(shared_grid, tmp_path / f"shared-{seed}", seed, nodes)
        run_on(own_grid, tmp_path / f"own-{seed}", seed, None)
    assert queries(shared_grid) == nodes.queries_sent == NUM_CLIENTS  # asked once for both runs
    assert queries(own_grid) == 2 * NUM_CLIENTS  # a directory per run: asked once per run
    assert nodes.client_to_node == {pid: node for node, pid in NODES.items()}
    for seed in (0, 1):
        shared = (tmp_path / f"shared-{seed}" / "ledger.csv").read_bytes()
        assert shared == (tmp_path / f"own-{seed}" / "ledger.csv").read_bytes()
        valued = load_run(tmp_path / f"shared-{seed}").ledger
        assert len(valued) == 2 * 3 * 2 and set(valued["client_id"].astype(int)) <= set(range(NUM_CLIENTS))


def test_an_own_app_that_fails_before_its_first_round_leaves_no_directory_it_made(tmp_path):
    """A ServerApp whose nodes never report a partition id: the run it started goes (it held
    run.json and the start checkpoint, nothing anyone can use); a directory that was there
    before keeps what the run wrote, as the docs say."""
    grid = EngineLikeGrid(ClientApp(), NODES)  # no handler: every node refuses the query
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility(), run_dir=str(tmp_path / "new"),
                               sampler=PartitionSampler(3, seed=0))
    initial = numpy_to_arrays({k: v.detach().numpy() for k, v in model_factory().state_dict().items()})
    with pytest.raises(QueryTimedOut):
        strategy.start(grid, initial, num_rounds=2, timeout=60)
    assert not (tmp_path / "new").exists()
    (tmp_path / "given").mkdir()
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility(), run_dir=str(tmp_path / "given"),
                               sampler=PartitionSampler(3, seed=0))
    with pytest.raises(QueryTimedOut):
        strategy.start(grid, initial, num_rounds=2, timeout=60)
    assert {"run.json", "checkpoint.json"} <= {p.name for p in (tmp_path / "given").iterdir()}


def test_a_node_that_did_not_answer_is_asked_again():
    answered = []

    def handler(message, node_id):
        from flwr.app import ConfigRecord as Record, RecordDict

        answered.append(node_id)
        return RecordDict({"client": Record({"partition-id": NODES[node_id]})} if len(answered) > 1 else {})

    grid = InProcessGrid(list(NODES)[:2], handler)
    nodes = NodeDirectory()
    assert nodes.partition_map(grid, timeout=1) == {1: 9008}  # the first node's reply carried no id
    assert nodes.partition_map(grid, timeout=1) == {0: 9001, 1: 9008}  # only it is asked again
    assert answered == [9001, 9008, 9001] and nodes.queries_sent == 3


def test_nodes_answering_without_an_id_are_said_so_and_not_blamed_on_the_timeout():
    from flwr.app import RecordDict

    grid = InProcessGrid(list(NODES), lambda message, node_id: RecordDict())
    with pytest.raises(QueryTimedOut) as raised:
        NodeDirectory().partition_map(grid, timeout=2)
    message = str(raised.value)
    assert message.startswith("sampler: no node reported its partition id to the server's query: 5 of 5 nodes "
                              "answered without a partition id the server could register"), message
    assert "app.query()(valuation_query)" in message and "query_timeout" not in message


def test_nodes_that_refuse_the_query_are_counted_with_the_first_error():
    """Flower's ClientApp without a query handler (nor the mod): every node refuses the query and
    its evaluate form at once; waiting longer would not help, so the timeout is not named."""
    grid = EngineLikeGrid(ClientApp(), NODES)  # no handler for either message type
    with pytest.raises(QueryTimedOut) as raised:
        NodeDirectory().partition_map(grid, timeout=2)
    message = str(raised.value)
    assert ("5 of 5 nodes refused it (first error: ValueError: No query function registered with name 'default'); "
            "5 of 5 nodes refused it again as an evaluate message (first error: ValueError: No evaluate function "
            "registered with name 'default')") in message, message
    assert "query_timeout" not in message and "clients.valuation_mod" in message


def test_nodes_that_do_not_answer_in_time_name_the_knob_of_an_own_app_and_of_the_command_line():
    from flwr.app import RecordDict

    grid = InProcessGrid(list(NODES), lambda message, node_id: RecordDict())
    grid.send_and_receive = lambda messages, timeout=None: []  # no reply within the timeout
    with pytest.raises(QueryTimedOut) as raised:
        NodeDirectory().partition_map(grid, timeout=2)
    error = raised.value
    assert str(error).endswith("5 of 5 nodes did not answer within 2 s. Nodes that are slow to start (a loaded "
                               "machine) need longer: raise IntakeSettings(query_timeout=…)."), str(error)
    assert error.said_with("--query-timeout").endswith("need longer: raise --query-timeout.")
    assert pickle.loads(pickle.dumps(error)).args == error.args


@pytest.mark.parametrize(("kwargs", "error", "named"), [
    (dict(query_timeout=0), ValueError, "query_timeout: expected a finite number > 0; got 0"),
    (dict(query_timeout=float("inf")), ValueError, "query_timeout: expected a finite number > 0"),
    (dict(query_timeout="60"), ValueError, "query_timeout"),
    (dict(nodes={}), TypeError, "nodes: expected a strategies.intake.nodes.NodeDirectory"),
])
def test_bad_query_timeout_or_directory_is_named(kwargs, error, named):
    with pytest.raises(error, match=named):
        ValuingStrategy(FedAvg(), utility(), intake=IntakeSettings(**kwargs))


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_queries_in_batches_map_the_same_partitions(batch):
    """partition_map(..., batch=B): the directory queries go out B at a time, each batch answered before the next,
    and the map is the one of all at once."""
    from flwr.app import ConfigRecord as Record, RecordDict

    sizes = []

    class CountingGrid(InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None):
            messages = list(messages)
            sizes.append(len(messages))
            return super().send_and_receive(messages, timeout=timeout)

    def handler(message, node_id):
        return RecordDict({"client": Record({"partition-id": NODES[node_id]})})

    whole = NodeDirectory().partition_map(InProcessGrid(list(NODES), handler), timeout=5)
    assert NodeDirectory().partition_map(CountingGrid(list(NODES), handler), timeout=5, batch=batch) == whole
    assert sizes == [batch] * (NUM_CLIENTS // batch) + ([NUM_CLIENTS % batch] if NUM_CLIENTS % batch else [])
