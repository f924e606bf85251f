"""Faults at the server: lost replies, NaN/inf updates, a round where every client fails."""

from __future__ import annotations

import numpy as np
import pandas as pd
from flwr.app import ConfigRecord, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedvalue.audit.checks import audit_run
from fedvalue.analysis.run_summary import load_run
from fedvalue.valuation.round_game import weighted_mean
from strategies import PartitionSampler, ValuingStrategy
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from strategies.valuing_settings import IntakeSettings

from tests.strategies.harness.inprocess import InProcessGrid
from tests.strategies.test_valuing import NODE_OF, PID_OF, initial_arrays, local_training, make_handler, utility as _utility_fixture

utility = _utility_fixture


class LossyGrid(InProcessGrid):
    """Drops the replies of some partitions, as a round timeout does."""

    def __init__(self, node_ids, handler, lost: set[int]):
        super().__init__(node_ids, handler)
        self.lost = lost

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        return [r for r in replies if not (r.metadata.message_type == MessageType.TRAIN
                                           and PID_OF[r.metadata.src_node_id] in self.lost)]


def test_a_client_whose_reply_never_comes_is_booked_failed(tmp_path, utility):
    grid = LossyGrid(NODE_OF.values(), make_handler(), lost={1, 2, 3, 4, 5, 0} - {0, 3, 5})
    ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(tmp_path),
                    sampler=PartitionSampler(6, seed=0)).start(grid, initial_arrays(), num_rounds=2, timeout=10)
    run = load_run(tmp_path)
    failed = run.ledger[run.ledger["status"] == "failed"]
    assert sorted(failed["client_id"].unique()) == ["1", "2", "4"]
    assert failed["value"].isna().all()
    assert (run.rounds["num_failed"] == 3).all() and (run.rounds["num_evaluations"] == 2**3).all()
    assert audit_run(tmp_path).ok


def nan_handler(bad: dict[int, float]):
    honest = make_handler()

    def handler(message, node_id):
        pid = PID_OF[node_id]
        if message.metadata.message_type != MessageType.TRAIN or pid not in bad:
            return honest(message, node_id)
        trained, n, loss = local_training(arrays_to_numpy(message.content["arrays"]), pid)
        trained = {k: np.full_like(v, bad[pid]) for k, v in trained.items()}
        return RecordDict({"arrays": numpy_to_arrays(trained),
                           "metrics": MetricRecord({"num-examples": n, "train-loss": loss}),
                           "client": ConfigRecord({"partition-id": pid})})
    return handler


def test_non_finite_updates_are_rejected_recorded_and_scored_by_their_harm(tmp_path, utility):
    grid = InProcessGrid(NODE_OF.values(), nan_handler({2: float("nan"), 4: 1e30}))
    result = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(tmp_path),
                             sampler=PartitionSampler(6, seed=0)).start(grid, initial_arrays(), num_rounds=1, timeout=10)
    run = load_run(tmp_path)
    ledger = run.ledger.set_index(["client_id", "method"])
    assert ledger.loc[("2", "ads"), "status"] == "rejected"
    assert pd.isna(ledger.loc[("2", "ads"), "value"])  # NaN arrays: not even a number to score
    # 1e30 is finite in float32, but its sum of squares is not: too large to aggregate, rejected with its harm.
    assert ledger.loc[("4", "ads"), "status"] == "rejected"
    assert "too large to aggregate" in ledger.loc[("4", "ads"), "reason"]
    # The realized state is FedAvg of the usable replies; neither rejected one reached Flower.
    start = arrays_to_numpy(initial_arrays())
    replies = {p: local_training(start, p) for p in (0, 1, 3, 5)}
    expected = weighted_mean([replies[p][0] for p in sorted(replies)], [replies[p][1] for p in sorted(replies)])
    for key, value in arrays_to_numpy(result.arrays).items():
        np.testing.assert_allclose(value, expected[key], rtol=1e-6)
    report = audit_run(tmp_path)
    assert report.ok, report.problems


def test_inf_update_gets_a_harm_value_when_its_aggregate_scores(tmp_path):
    from fedvalue.scoring.torch_utilities import TorchModelUtility

    from tests.strategies.test_valuing import NUM_FEATURES, make_model
    rng = np.random.default_rng(7)
    x = rng.normal(size=(200, NUM_FEATURES)).astype(np.float32)
    accuracy = TorchModelUtility(make_model(), x, (x[:, 0] > 0).astype(np.int64))
    grid = InProcessGrid(NODE_OF.values(), nan_handler({3: float("inf")}))
    ValuingStrategy(FedAvg(fraction_evaluate=0.0), accuracy, run_dir=str(tmp_path),
                    sampler=PartitionSampler(6, seed=0)).start(grid, initial_arrays(), num_rounds=1, timeout=10)
    ledger = load_run(tmp_path).ledger.set_index(["client_id", "method"])
    assert ledger.loc[("3", "ads"), "status"] == "rejected"
    harm = ledger.loc[("3", "ads"), "value"]
    assert np.isfinite(harm) and harm < 0  # an inf model predicts garbage: aggregating it would have hurt


def test_a_round_where_every_client_fails_keeps_the_state_and_is_recorded(tmp_path, utility):
    grid = InProcessGrid(NODE_OF.values(), make_handler(failing=set(range(6))))
    result = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(tmp_path),
                             sampler=PartitionSampler(3, seed=0)).start(grid, initial_arrays(), num_rounds=2, timeout=10)
    run = load_run(tmp_path)
    assert len(run.rounds) == 2 and (run.rounds["num_failed"] == 3).all()
    assert (run.rounds["utility_realized"] == run.rounds["utility_before"]).all()
    for key, value in arrays_to_numpy(result.arrays).items():
        np.testing.assert_array_equal(value, arrays_to_numpy(initial_arrays())[key])
    assert (run.ledger["status"] == "failed").all()
    assert audit_run(tmp_path).ok


def test_non_finite_replies_can_be_passed_through_when_configured(tmp_path, utility):
    grid = InProcessGrid(NODE_OF.values(), nan_handler({2: float("nan")}))
    result = ValuingStrategy(
        FedAvg(fraction_evaluate=0.0), utility, sampler=PartitionSampler(6, seed=0),
        intake=IntakeSettings(reject_non_finite=False)
    ).start(grid, initial_arrays(), num_rounds=1, timeout=10)
    assert all(np.isnan(v).all() for v in arrays_to_numpy(result.arrays).values())


def test_replies_that_would_break_flowers_aggregation_are_failed_not_fatal(tmp_path, utility):
    honest = make_handler()

    def handler(message, node_id):
        content = honest(message, node_id)
        pid = PID_OF[node_id]
        if message.metadata.message_type == MessageType.TRAIN and pid == 1:
            content["metrics"] = MetricRecord({"num-examples": 5, "other-metric": 1.0})
        if message.metadata.message_type == MessageType.TRAIN and pid == 3:
            arrays = arrays_to_numpy(content["arrays"])
            content["arrays"] = numpy_to_arrays({k: v[..., :1] for k, v in arrays.items()})  # wrong shapes
        return content

    ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(tmp_path),
                    sampler=PartitionSampler(6, seed=0)).start(
        InProcessGrid(NODE_OF.values(), handler), initial_arrays(), num_rounds=2, timeout=10)
    run = load_run(tmp_path)
    failed = run.ledger[run.ledger["status"] == "failed"]
    assert sorted(failed["client_id"].unique()) == ["1", "3"]
    assert (run.rounds["num_evaluations"] == 2**4).all()
