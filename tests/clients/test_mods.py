"""valuation_mod: a ClientApp written as Flower's template writes it (train and evaluate only, no
query handler, no partition id in its replies) gets what the books need from one mod. Real
ClientApps, real torch training, the real ValuingStrategy, on an in-process grid that turns a
ClientApp's exceptions into error replies as the engine does."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from ray import cloudpickle

from clients import ClientData, TorchInferenceGradient, make_client_app, valuation_mod, valuation_query
from fedvalue.analysis.run_summary import load_run
from fedvalue.scoring.torch_utilities import TorchModelUtility
from simulations.datasets.models import make_mlp
from strategies import BookSettings, PartitionSampler, RunSettings, ValuingStrategy
from strategies.protocol import CLIENT_RECORD_KEY, GRADIENT_KEY, PARTITION_ID_KEY, QUERY_KEY
from strategies.arrays import numpy_to_arrays
from tests.strategies.harness.clientapp_grid import EngineLikeGrid
from tests.strategies.harness.inprocess import set_server_identity

FEATURES, CLASSES, NUM_CLIENTS = 4, 3, 4
NODES = {5003 + 11 * pid: pid for pid in range(NUM_CLIENTS)}


def make_model() -> torch.nn.Module:
    return make_mlp(FEATURES, CLASSES, hidden=(8,), seed=0)


def partition(partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([7, partition_id])
    x = rng.normal(size=(24, FEATURES)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1).astype(np.int64)


def inference_split(context: Context) -> tuple[np.ndarray, np.ndarray]:
    x, y = partition(int(context.node_config["partition-id"]))
    return x[16:], y[16:]


def template_app(mods=()) -> ClientApp:
    """A ClientApp as Flower's template writes one: train and evaluate, nothing of fedvalue."""
    app = ClientApp(mods=list(mods))

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        model = make_model()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x, y = partition(int(context.node_config["partition-id"]))
        torch.manual_seed(int(msg.content["config"].get("server-round", 0)))
        optimizer = torch.optim.SGD(model.parameters(), lr=msg.content["config"]["lr"])
        for _ in range(3):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x[:16])), torch.from_numpy(y[:16]))
            loss.backward()
            optimizer.step()
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                              "metrics": MetricRecord({"train_loss": float(loss.detach()), "num-examples": 16})})
        return Message(content=content, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        model = make_model()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x, y = inference_split(context)
        accuracy = float((model(torch.from_numpy(x)).argmax(1) == torch.from_numpy(y)).float().mean())
        return Message(RecordDict({"metrics": MetricRecord({"eval_acc": accuracy, "num-examples": len(y)})}),
                       reply_to=msg)

    return app


def utility() -> TorchModelUtility:
    x = np.random.default_rng(9).normal(size=(60, FEATURES)).astype(np.float32)
    return TorchModelUtility(make_model(), x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1).astype(np.int64))


def initial() -> ArrayRecord:
    return numpy_to_arrays({k: v.detach().numpy() for k, v in make_model().state_dict().items()})


def run(app: ClientApp, run_dir, *, sampler=True, flows=False) -> tuple[ValuingStrategy, EngineLikeGrid]:
    grid = EngineLikeGrid(app, NODES)
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.5, min_evaluate_nodes=1), utility(), run_dir=str(run_dir),
                               sampler=PartitionSampler(2, seed=0) if sampler else None,
                               books=BookSettings(flows=flows), run=RunSettings(checkpoint=False))
    strategy.start(grid, initial(), num_rounds=2, timeout=60, train_config=ConfigRecord({"lr": 0.3}))
    return strategy, grid


@pytest.fixture(autouse=True)
def server_identity():
    set_server_identity()


def test_a_template_app_with_the_mod_is_booked_by_partition_and_found_without_a_query_handler(tmp_path):
    strategy, grid = run(template_app([valuation_mod()]), tmp_path / "run")
    ledger = load_run(tmp_path / "run").ledger
    assert set(ledger["status"]) == {"ok"} and len(ledger) == 2 * 2 * 2  # rounds x clients x (ads, loo)
    assert set(ledger["client_id"].astype(int)) <= set(range(NUM_CLIENTS))
    assert strategy.nodes.client_to_node == {pid: node for node, pid in NODES.items()}
    # Asked once as a query (no handler: error replies), then once as an evaluate the mod answers.
    directory = [m for m in grid.sent if m.content.config_records.get("config", {}).get(QUERY_KEY) == "directory"]
    assert sorted(str(m.metadata.message_type) for m in directory) == ["evaluate"] * 4 + ["query"] * 4
    assert set(strategy.nodes.query_types.values()) == {MessageType.EVALUATE}


def test_the_recipe_with_the_mods_query_handler_is_asked_once_and_no_node_raises(tmp_path):
    """The documented recipe, ``app.query()(valuation_query)`` beside the mod: Flower hands the
    server's queries (the directory's, TracIn's) to the mod at once. No ClientApp raises, so the
    engine logs no ERROR traceback; the ledger is the fallback's, byte for byte."""
    app = template_app([valuation_mod(inference_gradient=TorchInferenceGradient(make_model, inference_split))])
    app.query()(valuation_query)
    strategy, grid = run(app, tmp_path / "run", flows=True)
    assert grid.errors == []
    queries = [m for m in grid.sent if m.content.config_records.get("config", {}).get(QUERY_KEY) is not None]
    assert len(queries) > NUM_CLIENTS and {str(m.metadata.message_type) for m in queries} == {MessageType.QUERY}
    assert set(strategy.nodes.query_types.values()) == {MessageType.QUERY}
    fallback = template_app([valuation_mod(inference_gradient=TorchInferenceGradient(make_model, inference_split))])
    _, refused = run(fallback, tmp_path / "fallback", flows=True)
    assert {kind for kind, _ in refused.errors} == {MessageType.QUERY}  # what the handler spares every node
    assert (tmp_path / "run" / "ledger.csv").read_bytes() == (tmp_path / "fallback" / "ledger.csv").read_bytes()


def test_the_log_says_whose_sample_the_round_went_to(tmp_path, caplog):
    """Flower's FedAvg logs the nodes it sampled; the wrapper's line after it says how many
    clients the sampler sent the round to instead, and which."""
    app = template_app([valuation_mod()])
    app.query()(valuation_query)
    caplog.set_level(logging.INFO, logger="flwr")
    strategy, _ = run(app, tmp_path / "run")
    lines = [r.getMessage() for r in caplog.records]
    inner = [k for k, line in enumerate(lines) if line.startswith("configure_train: Sampled 4 nodes (out of 4)")]
    ours = [k for k, line in enumerate(lines) if line.startswith("fedvalue: round ") and " sends the round to " in line]
    assert len(inner) == len(ours) == 2 and all(k + 1 == j for k, j in zip(inner, ours))
    booked = load_run(tmp_path / "run").ledger
    for t, k in enumerate(ours, start=1):
        chosen = sorted(booked.loc[(booked["round"] == t) & (booked["method"] == "ads"), "client_id"].astype(int))
        assert lines[k] == (f"fedvalue: round {t}: PartitionSampler sends the round to 2 of 4 clients, partitions "
                            f"{chosen}, in place of the 4 nodes the inner strategy sampled")


def test_the_query_handler_without_the_mod_says_the_mod_is_missing(tmp_path):
    app = template_app()
    app.query()(valuation_query)
    with pytest.raises(RuntimeError, match=r"refused it \(first error: ValueError: valuation_query: the server's "
                                           r"query reached the app's query handler, so the ClientApp has no "
                                           r"valuation mod; build it as ClientApp\(mods=\[clients.valuation_mod"):
        run(app, tmp_path / "run")


def test_without_the_mod_the_sampler_says_what_to_add(tmp_path):
    with pytest.raises(RuntimeError, match=r"no node reported its partition id.*mods=\[valuation_mod\(\)\]"):
        run(template_app(), tmp_path / "run")


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_replies_without_identity_are_warned_about_once_never_booked_silently(tmp_path):
    records = Records()
    logging.getLogger("flwr").addHandler(records)
    try:
        run(template_app(), tmp_path / "bare", sampler=False)
        run(template_app([valuation_mod()]), tmp_path / "modded", sampler=False)
    finally:
        logging.getLogger("flwr").removeHandler(records)
    warnings = [m for m in records.messages if "say no partition id" in m]
    assert len(warnings) == 1 and "mods=[clients.valuation_mod()]" in warnings[0]  # once, and not for the mod's run
    assert set(load_run(tmp_path / "bare").ledger["client_id"].astype(str).str[:5]) == {"node-"}
    assert set(load_run(tmp_path / "modded").ledger["client_id"].astype(int)) <= set(range(NUM_CLIENTS))


def train_message(arrays: ArrayRecord, **config) -> Message:
    from tests.clients.test_app import instruction

    return instruction(RecordDict({"arrays": arrays, "config": ConfigRecord({"lr": 0.3, "server-round": 1, **config})}),
                       "train")


def node_context(partition_id: int) -> Context:
    return Context(run_id=1, node_id=11, node_config={"partition-id": partition_id, "num-partitions": 4},
                   state=RecordDict(), run_config={})


def test_the_mod_changes_nothing_the_app_trains_and_adds_the_partition_id():
    bare = template_app()(train_message(initial()), node_context(2))
    modded = template_app([valuation_mod()])(train_message(initial()), node_context(2))
    for key, array in bare.content["arrays"].items():
        assert modded.content["arrays"][key].numpy().tobytes() == array.numpy().tobytes()
    assert dict(modded.content["metrics"]) == dict(bare.content["metrics"])
    assert dict(modded.content[CLIENT_RECORD_KEY]) == {PARTITION_ID_KEY: 2}
    by_function = template_app([valuation_mod(lambda context: 7)])(train_message(initial()), node_context(2))
    assert by_function.content[CLIENT_RECORD_KEY][PARTITION_ID_KEY] == 7
    with pytest.raises(ValueError, match="valuation_mod's partition_id\\(context\\): expected a non-negative integer; got -1"):
        template_app([valuation_mod(lambda context: -1)])(train_message(initial()), node_context(2))
    with pytest.raises(ValueError, match="node_config\\['partition-id'\\].*--node-config 'partition-id=N'"):
        valuation_mod().client_id(Context(run_id=1, node_id=11, node_config={}, state=RecordDict(), run_config={}))


def load_client(partition_id: int) -> ClientData:
    x, y = partition(partition_id)
    return ClientData(partition_id=partition_id, x_train=x[:16], y_train=y[:16], x_infer=x[16:], y_infer=y[16:])


def test_the_mods_inference_gradient_is_make_client_apps_at_the_received_arrays():
    """Reference: the project's own ClientApp computes g on the same inference split."""
    gradient = TorchInferenceGradient(make_model, inference_split)
    modded = template_app([valuation_mod(inference_gradient=gradient)])
    from tests.clients.test_app import instruction

    query = instruction(RecordDict({"arrays": initial(), "config": ConfigRecord({GRADIENT_KEY: True,
                                                                                 QUERY_KEY: "inference-gradient"})}),
                        "query")
    want = make_client_app(load_client, make_model)(query, node_context(1))
    # No query handler in a template app: the server's query comes as an evaluate the mod answers.
    as_evaluate = instruction(query.content, "evaluate")
    for message in (train_message(initial(), **{GRADIENT_KEY: True}), as_evaluate):
        got = modded(message, node_context(1))
        for key, array in want.content[GRADIENT_KEY].items():
            np.testing.assert_allclose(got.content[GRADIENT_KEY][key].numpy(), array.numpy(), rtol=1e-6, atol=1e-7)
        assert got.content[CLIENT_RECORD_KEY]["inference-loss"] == pytest.approx(
            want.content[CLIENT_RECORD_KEY]["inference-loss"], rel=1e-6)
    app = cloudpickle.loads(cloudpickle.dumps(modded))  # travels to Ray workers with every message
    assert GRADIENT_KEY in app(train_message(initial(), **{GRADIENT_KEY: True}), node_context(1)).content


def test_tracin_flows_are_booked_through_the_mod(tmp_path):
    app = template_app([valuation_mod(inference_gradient=TorchInferenceGradient(make_model, inference_split))])
    run(app, tmp_path / "flows", flows=True)
    ledger = load_run(tmp_path / "flows").ledger
    inflow = ledger[ledger["method"] == "tracin_inflow"]
    assert set(ledger["status"]) == {"ok", "idle"} and len(inflow) == 2 * NUM_CLIENTS  # idle clients answered too
    assert inflow["value"].notna().all()


def test_flows_asked_of_a_mod_without_a_gradient_fail_naming_the_parameter(tmp_path):
    reply = EngineLikeGrid(template_app([valuation_mod()]), NODES).send_and_receive(
        [Message(RecordDict({"arrays": initial(), "config": ConfigRecord({"lr": 0.3, GRADIENT_KEY: True})}),
                 dst_node_id=next(iter(NODES)), message_type=MessageType.TRAIN)])[0]
    assert reply.has_error() and "inference_gradient: the server asks for this client's inference gradient" in \
        reply.error.reason
    with pytest.raises(TypeError, match="inference_gradient: expected None or a callable"):
        valuation_mod(inference_gradient="grad")
