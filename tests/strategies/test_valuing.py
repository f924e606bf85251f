"""ValuingStrategy on hand-built replies through an in-process grid (no Ray)."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Error, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg

from fedvalue.analysis.run_summary import load_run
from fedvalue.schema import LEDGER_COLUMNS
from fedvalue.scoring.torch_utilities import TorchModelUtility
from strategies import PartitionSampler, ValuingStrategy
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from tests.fedvalue.reference_games import ordered_permutation_values
from fedvalue.valuation.settings import AdsSettings, ValuationSettings
from strategies.book_settings import BookSettings

from tests.strategies.harness.inprocess import InProcessGrid

NUM_FEATURES, NUM_CLASSES = 5, 3
NODE_OF = {pid: 1000 + 7 * pid for pid in range(6)}
PID_OF = {node: pid for pid, node in NODE_OF.items()}


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(NUM_FEATURES, NUM_CLASSES)


def client_data(pid: int):
    rng = np.random.default_rng(100 + pid)
    n = 20 + 10 * pid  # unequal weights
    x = rng.normal(size=(n, NUM_FEATURES)).astype(np.float32)
    y = (x[:, 0] + (pid % 3) * x[:, 1] > 0).astype(np.int64) + (pid == 5)  # client 5 sees a shifted task
    return x, y


def local_training(arrays: dict, pid: int) -> tuple[dict, int, float]:
    """Real torch training: 5 full-batch GD steps on the client's own data."""
    model = make_model()
    model.load_state_dict({k: torch.tensor(v) for k, v in arrays.items()})
    x, y = client_data(pid)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(5):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.tensor(x)), torch.tensor(y))
        loss.backward()
        optimizer.step()
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}, len(x), float(loss.detach())


def make_handler(failing: set[int] = frozenset()):
    def handler(message, node_id):
        pid = PID_OF[node_id]
        if message.metadata.message_type == MessageType.QUERY:
            return RecordDict({"client": ConfigRecord({"partition-id": pid})})
        if pid in failing:
            return Error(code=0, reason=f"client {pid} crashed")
        trained, n, loss = local_training(arrays_to_numpy(message.content["arrays"]), pid)
        return RecordDict({
            "arrays": numpy_to_arrays(trained),
            "metrics": MetricRecord({"num-examples": n, "train-loss": loss}),
            "client": ConfigRecord({"partition-id": pid}),
        })
    return handler


@pytest.fixture
def utility():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(200, NUM_FEATURES)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return TorchModelUtility(make_model(), x, y, metric="neg_loss")


def initial_arrays() -> ArrayRecord:
    return numpy_to_arrays({k: v.detach().numpy() for k, v in make_model().state_dict().items()})


def test_fedavg_full_coalition_is_the_realized_state_and_values_match_brute_force(tmp_path, utility):
    grid = InProcessGrid(NODE_OF.values(), make_handler())
    strategy = ValuingStrategy(
        FedAvg(fraction_evaluate=0.0), utility, run_dir=str(tmp_path), sampler=PartitionSampler(4, seed=3),
        seed=0, books=BookSettings(noisy_clients={5})
    )
    strategy.start(grid, initial_arrays(), num_rounds=3, timeout=10)
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert len(rounds) == 3
    # (a) v_t(I_t) is U(A_t) exactly; group efficiency holds to rounding.
    assert (rounds["utility_after"] == rounds["utility_realized"]).all()
    assert (rounds["efficiency_gap"].abs() < 1e-9).all()
    assert (rounds["num_evaluations"] == 2 ** 4).all()
    assert (rounds["ads_method"] == "ads-exact").all()

    # Last round by brute force: FedAvg of every coalition, Shapley over all orders.
    train_messages = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    last = train_messages[-4:]
    start = arrays_to_numpy(last[0].content["arrays"])
    replies = {PID_OF[m.metadata.dst_node_id]: local_training(start, PID_OF[m.metadata.dst_node_id]) for m in last}

    def v(coalition):
        if not coalition:
            return utility(start)
        total = sum(replies[c][1] for c in coalition)
        mean = {k: sum(replies[c][0][k].astype(np.float64) * replies[c][1] / total for c in coalition) for k in start}
        return utility({k: a.astype(np.float32) for k, a in mean.items()})

    expected = ordered_permutation_values(v, [sorted(replies)])
    ledger = load_run(tmp_path).ledger
    ads_rows = ledger[(ledger["round"] == 3) & (ledger["method"] == "ads")].set_index("client_id")
    for pid, value in expected.items():
        assert ads_rows.loc[str(pid), "value"] == pytest.approx(value, abs=1e-6)
    loo_rows = ledger[(ledger["round"] == 3) & (ledger["method"] == "loo")].set_index("client_id")
    full = frozenset(replies)
    for pid in replies:
        assert loo_rows.loc[str(pid), "value"] == pytest.approx(v(full) - v(full - {pid}), abs=1e-6)
    assert list(ledger.columns) == list(LEDGER_COLUMNS)
    assert set(ledger.loc[ledger["client_id"] == "5", "noisy"]) <= {True}
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "ledger.parquet"), ledger, check_dtype=False)


def run_fedadam(valued: bool, utility):
    random.seed(0)  # Flower's own sampler draws from the global random module
    inner = FedAdam(fraction_evaluate=0.0, eta=0.05, min_available_nodes=6)
    strategy = ValuingStrategy(inner, utility, seed=0) if valued else inner
    grid = InProcessGrid(NODE_OF.values(), make_handler())
    result = strategy.start(grid, initial_arrays(), num_rounds=3, timeout=10)
    return inner, strategy, result


def test_fedadam_state_and_trajectory_are_untouched_by_valuation(utility):
    plain, _, plain_result = run_fedadam(False, utility)
    inner, valued, valued_result = run_fedadam(True, utility)
    for key, array in arrays_to_numpy(plain_result.arrays).items():
        np.testing.assert_array_equal(arrays_to_numpy(valued_result.arrays)[key], array)
    for state in ("m_t", "v_t", "current_arrays"):
        for key, array in getattr(plain, state).items():
            np.testing.assert_array_equal(getattr(inner, state)[key], array)
    # The copy-based game reproduces FedAdam's realized step for the full coalition.
    for row in valued.rounds:
        assert row.utility_after == row.utility_realized
        assert abs(row.efficiency_gap) < 1e-9


def test_fedavg_trajectory_is_untouched_by_valuation(utility):
    results = []
    for valued in (False, True):
        random.seed(0)
        inner = FedAvg(fraction_evaluate=0.0, min_available_nodes=6)
        strategy = ValuingStrategy(inner, utility) if valued else inner
        results.append(strategy.start(InProcessGrid(NODE_OF.values(), make_handler()), initial_arrays(), num_rounds=2, timeout=10))
    for key, array in arrays_to_numpy(results[0].arrays).items():
        np.testing.assert_array_equal(arrays_to_numpy(results[1].arrays)[key], array)


class CoordinateMedian(FedAvg):
    """A user's own strategy: coordinate-wise median of the replies instead of the mean."""

    def aggregate_train(self, server_round, replies):
        replies = [r for r in replies if not r.has_error()]
        if not replies:
            return None, None
        stacked = [arrays_to_numpy(r.content["arrays"]) for r in replies]
        median = {k: np.median(np.stack([s[k] for s in stacked]), axis=0).astype(np.float32) for k in stacked[0]}
        return numpy_to_arrays(median), MetricRecord({"clients": len(replies)})


def test_user_defined_strategy_is_valued_with_its_own_rule(utility):
    grid = InProcessGrid(NODE_OF.values(), make_handler())
    strategy = ValuingStrategy(CoordinateMedian(fraction_evaluate=0.0), utility, sampler=PartitionSampler(5, seed=1))
    strategy.start(grid, initial_arrays(), num_rounds=1, timeout=10)
    messages = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    start = arrays_to_numpy(messages[0].content["arrays"])
    trained = {PID_OF[m.metadata.dst_node_id]: local_training(start, PID_OF[m.metadata.dst_node_id])[0] for m in messages}

    def v(coalition):
        if not coalition:
            return utility(start)
        return utility({k: np.median(np.stack([trained[c][k] for c in sorted(coalition)]), axis=0).astype(np.float32) for k in start})

    expected = ordered_permutation_values(v, [sorted(trained)])
    values = strategy.last_valuation.results["ads"].values
    for pid, value in expected.items():
        assert values[pid] == pytest.approx(value, abs=1e-9)
    assert strategy.rounds[0].utility_after == strategy.rounds[0].utility_realized


def test_failed_client_is_booked_and_left_out_of_the_game(tmp_path, utility):
    grid = InProcessGrid(NODE_OF.values(), make_handler(failing={2}))
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(tmp_path),
                               sampler=PartitionSampler(6, seed=0))
    strategy.start(grid, initial_arrays(), num_rounds=1, timeout=10)
    ledger = load_run(tmp_path).ledger
    failed = ledger[ledger["client_id"] == "2"]
    assert set(failed["status"]) == {"failed"} and failed["value"].isna().all()
    assert list(strategy.last_valuation.game.players) == [0, 1, 3, 4, 5]
    rounds = load_run(tmp_path).rounds
    assert rounds.loc[0, "num_failed"] == 1 and rounds.loc[0, "utility_after"] == rounds.loc[0, "utility_realized"]


def test_even_schedule_takes_every_client_once_per_pass():
    sampler = PartitionSampler(2, schedule="even", seed=4)
    taken = [sampler.sample(t, list(range(6))) for t in (1, 2, 3)]
    assert sorted(c for chosen in taken for c in chosen) == list(range(6))
    assert taken == [PartitionSampler(2, schedule="even", seed=4).sample(t, list(range(6))) for t in (1, 2, 3)]
    assert taken != [PartitionSampler(2, schedule="even", seed=5).sample(t, list(range(6))) for t in (1, 2, 3)]


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(clients_per_round=0), "clients_per_round: expected a positive integer"),
    (dict(clients_per_round=2, schedule="round-robin"), "schedule: expected one of"),
])
def test_sampler_bad_input(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        PartitionSampler(**kwargs)


def test_sampler_more_clients_than_available():
    with pytest.raises(ValueError, match="clients_per_round: expected at most the 3 available"):
        PartitionSampler(4).sample(1, [0, 1, 2])


def test_wrapper_bad_input(utility):
    with pytest.raises(TypeError, match="strategy: expected a flwr.serverapp.strategy.Strategy"):
        ValuingStrategy(object(), utility)
    with pytest.raises(ValueError, match="methods: expected a subset"):
        ValuingStrategy(FedAvg(), utility, valuation=ValuationSettings(methods=("ads", "banzhaf")))


def test_bad_estimator_settings_are_refused_when_the_strategy_is_made(utility):
    with pytest.raises(ValueError, match="delta: "):
        ValuingStrategy(FedAvg(), utility, valuation=ValuationSettings(ads=AdsSettings(delta=1.5)))


def test_the_round_line_reads_ties_as_ties():
    """Values the line prints the same are tied: no one client is named largest or smallest."""
    from fedvalue.schema import LedgerRow, Status
    from strategies.server_log import round_line

    def rows(*values):
        return [LedgerRow(1, client, "ads", value, None, 10, Status.OK) for client, value in enumerate(values)]

    assert round_line(1, rows(0.25, 0.25), ("ads",), None) == ("fedvalue: round 1: 2 of 2 sampled clients valued, in "
                                                               "memory; ads 0.25 for all 2 (a tie)")
    assert round_line(1, rows(0.5, 0.1, 0.5, 0.1 + 1e-12), ("ads",), "/r").endswith(
        "ads largest 0.5 (clients 0, 2, tied), smallest 0.1 (clients 1, 3, tied)")
    assert round_line(1, rows(0.3, 0.2), ("ads",), "/r").endswith("ads largest 0.3 (client 0), smallest 0.2 (client 1)")
    assert round_line(1, rows(0.3), ("ads",), "/r").endswith("; ads 0.3 (client 0)")
