"""TracIn flows booked by ValuingStrategy, with the real ClientApp behind an in-process grid.

References are computed independently: each client's update from the replies, each
client's inference gradient by torch autograd at the state the round started from,
and F(u→v) = −(p_u Δ_u)·g_v by explicit pairwise loops.
"""

from __future__ import annotations

import functools
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from flwr.app import Context, Message, RecordDict
from flwr.serverapp.strategy import FedAvg

from clients.app import ClientData, make_client_app
from clients.behaviours import FreeRider, HonestClient
from fedvalue.analysis.run_summary import load_run
from fedvalue.schema import FIRST_ORDER_FILE
from fedvalue.scoring.torch_utilities import TorchModelUtility
from strategies import PartitionSampler, ValuingStrategy
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from fedvalue.valuation.settings import ValuationSettings
from strategies.book_settings import BookSettings

from tests.strategies.harness.inprocess import InProcessGrid

NUM_CLIENTS, FEATURES = 6, 4
NODE_OF = {pid: 500 + 3 * pid for pid in range(NUM_CLIENTS)}
PID_OF = {node: pid for pid, node in NODE_OF.items()}


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 2))


def initial_state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: (0.1 * rng.normal(size=v.shape)).astype(np.float32) for k, v in make_model().state_dict().items()}


def load_client(pid: int, free_riders: frozenset = frozenset()) -> ClientData:
    rng = np.random.default_rng(40 + pid)
    x = rng.normal(size=(30 + 4 * pid, FEATURES)).astype(np.float32)
    y = (x[:, 0] - 0.5 * x[:, 1] > 0).astype(np.int64)
    half = len(x) // 2
    return ClientData(pid, x[:half], y[:half], x[half:], y[half:],
                      behaviour=FreeRider() if pid in free_riders else HonestClient())


def client_app_grid(load) -> InProcessGrid:
    app = make_client_app(load, make_model)

    def handler(message: Message, node_id: int) -> RecordDict:
        context = Context(run_id=1, node_id=node_id, node_config={"partition-id": PID_OF[node_id]},
                          state=RecordDict(), run_config={})
        return app(message, context).content

    return InProcessGrid(list(NODE_OF.values()), handler)


def utility() -> TorchModelUtility:
    data = [load_client(p) for p in range(NUM_CLIENTS)]
    x = np.concatenate([d.x_infer for d in data])
    y = np.concatenate([d.y_infer for d in data])
    return TorchModelUtility(make_model(), x, y, metric="neg_loss")


def inference_gradient(pid: int, state: dict[str, np.ndarray], load) -> tuple[float, np.ndarray]:
    model = make_model()
    model.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    data = load(pid)
    loss = torch.nn.functional.cross_entropy(model(torch.tensor(data.x_infer)), torch.tensor(data.y_infer),
                                             reduction="sum")
    loss.backward()
    return float(loss), np.concatenate([p.grad.numpy().ravel() for p in model.parameters()]).astype(np.float64)


def flat(state) -> np.ndarray:
    return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in state.values()])


def run_with_flows(tmp_path, load, rounds=3, per_round=3, intake=None):
    grid = client_app_grid(load)
    strategy = ValuingStrategy(
        FedAvg(fraction_evaluate=0.0), utility(), run_dir=str(tmp_path),
        sampler=PartitionSampler(per_round, seed=5), valuation=ValuationSettings(methods=("ads",)),
        books=BookSettings(flows=True), **({} if intake is None else {"intake": intake})
    )
    train_config = {"lr": 0.05, "local-epochs": 2, "batch-size": 0, "seed": 0}
    from flwr.app import ConfigRecord
    result = strategy.start(grid, numpy_to_arrays(initial_state()), num_rounds=rounds, timeout=60,
                            train_config=ConfigRecord(train_config))
    return grid, strategy, result


def test_flows_equal_pairwise_dot_products_and_idle_clients_receive_inflow(tmp_path):
    grid, strategy, result = run_with_flows(tmp_path, load_client)
    run = load_run(tmp_path)
    flows = run.ledger[run.ledger["method"].str.startswith("tracin")]
    # Every client is booked every round: the trained ones "ok", the others "idle".
    per_round = flows.groupby("round")["client_id"].nunique()
    assert (per_round == NUM_CLIENTS).all()
    assert set(flows["status"]) == {"ok", "idle"}

    train_messages = [m for m in grid.sent if m.metadata.message_type == "train"]
    for server_round in range(1, 4):
        sent = [m for m in train_messages if m.content["config"]["server-round"] == server_round]
        start = arrays_to_numpy(sent[0].content["arrays"])
        trained = {}
        for message in sent:
            pid = PID_OF[message.metadata.dst_node_id]
            context = Context(run_id=1, node_id=0, node_config={"partition-id": pid}, state=RecordDict(), run_config={})
            reply = make_client_app(load_client, make_model)(message, context).content
            trained[pid] = (flat(arrays_to_numpy(reply["arrays"])) - flat(start), reply["metrics"]["num-examples"])
        total = sum(n for _, n in trained.values())
        step = {u: (n / total) * delta for u, (delta, n) in trained.items()}
        grads = {v: inference_gradient(v, start, load_client)[1] for v in range(NUM_CLIENTS)}
        expected = {v: {"inflow": 0.0, "outflow": 0.0, "self": 0.0} for v in range(NUM_CLIENTS)}
        for u, pu_delta in step.items():
            for v, g in grads.items():
                flow = -float(pu_delta @ g)
                if u == v:
                    expected[u]["self"] += flow
                else:
                    expected[u]["outflow"] += flow
                    expected[v]["inflow"] += flow
        booked = flows[flows["round"] == server_round].pivot(index="client_id", columns="method", values="value")
        for v in range(NUM_CLIENTS):
            row = booked.loc[str(v)]
            assert row["tracin_inflow"] == pytest.approx(expected[v]["inflow"], rel=1e-5, abs=1e-7)
            assert row["tracin_outflow"] == pytest.approx(expected[v]["outflow"], rel=1e-5, abs=1e-7)
            assert row["tracin_self"] == pytest.approx(expected[v]["self"], rel=1e-5, abs=1e-7)
        # Every unit of flow leaves one client and reaches another.
        assert booked["tracin_inflow"].sum() == pytest.approx(booked["tracin_outflow"].sum(), rel=1e-9, abs=1e-12)
        assert any(v not in step and abs(expected[v]["inflow"]) > 0 for v in range(NUM_CLIENTS))

    # The inner strategy never saw the gradients: the realized state is FedAvg of the models alone.
    assert set(arrays_to_numpy(result.arrays)) == set(initial_state())
    assert (run.rounds["utility_after"] == run.rounds["utility_realized"]).all()

    summary = run.summary()
    assert {"inflow", "outflow", "self", "balance", "ratio"} <= set(summary.columns)
    assert summary["balance"].to_numpy() == pytest.approx((summary["inflow"] - summary["outflow"]).to_numpy())


def test_first_order_check_compares_actual_and_predicted_loss_changes(tmp_path):
    run_with_flows(tmp_path, load_client, rounds=4, per_round=NUM_CLIENTS)
    check = pd.read_csv(tmp_path / FIRST_ORDER_FILE)
    # Round 4's actual change comes from the gradient query at the final state, after the loop.
    assert sorted(check["round"].unique()) == [1, 2, 3, 4]
    assert len(check) == 4 * NUM_CLIENTS
    # Recompute the actual changes from the model states: loss at A_t minus loss at A_{t-1}.
    np.testing.assert_allclose(check["actual_change"], check["loss_after"] - check["loss_before"], rtol=1e-12)
    # Small steps of a smooth loss: the first-order prediction is close.
    error = np.abs(check["actual_change"] - check["predicted_change"]).sum() / np.abs(check["actual_change"]).sum()
    assert error < 0.1

    # The run's summary reports that error and the reciprocity of the clients' total flows.
    run = load_run(tmp_path)
    figures = run.run_summary()
    assert figures["first_order_relative_error"] == pytest.approx(error, rel=1e-12)
    assert figures["first_order_rounds_checked"] == 4
    totals = run.summary()
    ratios = sorted(
        (0.0 if np.sign(i) != np.sign(o) else min(i / o, o / i)) for i, o in zip(totals["inflow"], totals["outflow"])
    )[::-1]
    assert figures["reciprocity_alpha"] == pytest.approx(ratios[int(np.ceil(0.75 * len(ratios))) - 1])
    assert figures["reciprocity_num_individuals"] == NUM_CLIENTS
    assert abs(figures["flow_balance_gap"]) < 1e-9 * max(1.0, totals["inflow"].abs().sum())


def test_a_free_rider_has_no_outflow_and_receives_inflow(tmp_path):
    load = functools.partial(load_client, free_riders=frozenset({2}))
    run_with_flows(tmp_path, load, rounds=2, per_round=NUM_CLIENTS)
    run = load_run(tmp_path)
    rider = run.ledger[(run.ledger["client_id"] == "2") & run.ledger["method"].str.startswith("tracin")]
    values = rider.groupby("method")["value"].sum()
    assert values["tracin_outflow"] == 0.0 and values["tracin_self"] == 0.0
    assert values["tracin_inflow"] > 0  # honest clients on the same task lower its loss


class BatchCountingGrid(InProcessGrid):
    """The in-process grid, noting how many messages each send_and_receive carried."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.batches: list[tuple[str, int]] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.batches.append((messages[0].metadata.message_type if messages else "", len(messages)))
        return super().send_and_receive(messages, timeout=timeout)


def test_gradient_queries_in_batches_book_the_same_flows_bit_for_bit(tmp_path, monkeypatch):
    """IntakeSettings(query_batch=3): the node directory's and the idle clients' queries go out three at a time, and
    every file of the run is the same as with all of them at once."""
    from strategies import IntakeSettings

    counted, plain = [], client_app_grid

    def counting_grid(load):
        grid = plain(load)
        counted.append(BatchCountingGrid(grid.node_ids, grid.handler))
        return counted[-1]

    run_with_flows(tmp_path / "all", load_client, rounds=3, per_round=2)
    monkeypatch.setattr(sys.modules[__name__], "client_app_grid", counting_grid)
    run_with_flows(tmp_path / "batched", load_client, rounds=3, per_round=2, intake=IntakeSettings(query_batch=3))
    queries = [size for kind, size in counted[0].batches if kind == "query"]
    # The node directory's queries of the 6 nodes first, 3 at a time; then 6 clients, 2 training: 4 idle a round,
    # sent 3 then 1; and after the last round, the final state's query of all 6 for the first-order check.
    assert queries == [3, 3] + [3, 1] * 3 + [3, 3], queries
    for name in ("ledger.csv", "rounds.csv", "first_order.csv"):
        all_at_once = (tmp_path / "all" / name).read_bytes()
        batched = (tmp_path / "batched" / name).read_bytes()
        if name == "rounds.csv":  # each row holds the valuation's wall time and the hash chain over it
            all_at_once, batched = (pd.read_csv(tmp_path / d / name).drop(columns=["valuation_seconds", "hash"])
                                    for d in ("all", "batched"))
            pd.testing.assert_frame_equal(all_at_once, batched)
        else:
            assert all_at_once == batched, name
    assert (tmp_path / "all" / "records").is_dir()
    for record in sorted((tmp_path / "all" / "records").iterdir()):
        assert record.read_bytes() == (tmp_path / "batched" / "records" / record.name).read_bytes(), record.name
