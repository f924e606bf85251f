"""A run with the defences and a delta-weights free-rider, in process (the real ClientApp behind
an in-process grid whose nodes keep their own state across rounds, as Flower's do): the replay
test flags it from round 2 on with A_{t−2} kept in each record, a run that dies and resumes
writes the uninterrupted ledger (the first resumed round takes A_{t−2} from the last saved
record), and the audit recomputes every defended row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp.strategy import FedAvg

from clients.app import ClientData, make_client_app
from clients.attacks import DeltaWeightsFreeRider
from clients.behaviours import Replicator
from fedvalue.audit.checks import audit_run
from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.run.archive import read_round_record, record_path, write_round_record
from fedvalue.analysis.run_summary import load_run
from fedvalue.run.settings import RunSettings
from fedvalue.valuation.settings import ValuationSettings
from strategies import PartitionSampler, RepresentativesOnly, ValuingStrategy
from strategies.arrays import numpy_to_arrays
from strategies.book_settings import BookSettings
from tests.strategies.harness.inprocess import InProcessGrid, set_server_identity
from tests.strategies.hooks.test_flow_books import (
    NODE_OF,
    NUM_CLIENTS,
    PID_OF,
    initial_state,
    load_client,
    make_model,
    utility,
)

ROUNDS = 4


class Crash(RuntimeError):
    """Stands in for the process dying right after a round committed."""


def load(pid: int) -> ClientData:
    data = load_client(pid)
    if pid == 0:
        data.behaviour = DeltaWeightsFreeRider()
    if pid == 5:  # trains on client 4's data: the same update under another identity
        source = load_client(4)
        data.behaviour = Replicator(source.x_train, source.y_train, source_id=4)
    return data


def grid(states: dict) -> InProcessGrid:
    """The federation's nodes; ``states`` is what each keeps across rounds (and across a server's crash)."""
    app = make_client_app(load, make_model)

    def handler(message: Message, node_id: int) -> RecordDict:
        context = Context(run_id=1, node_id=node_id, node_config={"partition-id": PID_OF[node_id]},
                          state=states.setdefault(node_id, RecordDict()), run_config={})
        return app(message, context).content
    return InProcessGrid(list(NODE_OF.values()), handler)


def run(run_dir, states: dict, *, resume=False, crash_after=None, acceptance=None):
    def on_round(row):
        if crash_after is not None and row.round == crash_after:
            raise Crash(f"killed after round {crash_after}")

    strategy = ValuingStrategy(
        FedAvg(fraction_evaluate=0.0), utility(), run_dir=str(run_dir), sampler=PartitionSampler(NUM_CLIENTS, seed=1),
        seed=3, valuation=ValuationSettings(methods=("ads", "loo")), acceptance=acceptance,
        books=BookSettings(flows=True, defences=DefenceSettings()),
        run=RunSettings(run_config={"experiment": "defences"}, resume=resume))
    strategy.on_round = on_round
    config = ConfigRecord({"lr": 0.5, "local-epochs": 2, "batch-size": 0, "seed": 0})
    return strategy.start(grid(states), numpy_to_arrays(initial_state()), num_rounds=ROUNDS, timeout=10,
                          train_config=config)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    set_server_identity()
    run_dir = tmp_path_factory.mktemp("defended")
    run(run_dir, {})
    return run_dir


def test_the_free_rider_is_flagged_and_the_audit_recomputes_the_defences(uninterrupted):
    ledger = load_run(uninterrupted).ledger
    flags = ledger[ledger["method"] == "defence_free_rider"].set_index(["round", "client_id"])["value"]
    assert all(flags[(t, "0")] == 1.0 for t in range(1, ROUNDS + 1))  # round 1: zero update, then replays
    assert flags.drop(index="0", level="client_id").eq(0).all()
    clusters = ledger[ledger["method"] == "defence_cluster"].set_index(["round", "client_id"])["value"]
    assert all(clusters[(t, c)] == 2.0 for t in range(1, ROUNDS + 1) for c in ("4", "5"))
    defended = ledger[(ledger["method"] == "ads_defended") & (ledger["client_id"] == "0")]["value"]
    assert (defended == 0).all()
    assert "previous-global" not in read_round_record(record_path(uninterrupted, 1)).references
    second = read_round_record(record_path(uninterrupted, 2))
    np.testing.assert_array_equal(second.references["previous-global"]["0.weight"],
                                  read_round_record(record_path(uninterrupted, 1)).start_arrays["0.weight"])
    report = audit_run(uninterrupted, utility=utility())
    assert report.intact, report.problems + report.unverifiable


@pytest.mark.parametrize("crash_after", [1, 2])
def test_a_resumed_run_writes_the_uninterrupted_ledger(tmp_path, uninterrupted, crash_after):
    states: dict = {}  # the clients live on while the server dies and resumes
    with pytest.raises(Crash):
        run(tmp_path, states, crash_after=crash_after)
    run(tmp_path, states, resume=True)
    assert (tmp_path / "ledger.csv").read_bytes() == (uninterrupted / "ledger.csv").read_bytes()
    rounds = [load_run(d).rounds.drop(columns=["valuation_seconds", "hash"]) for d in (tmp_path, uninterrupted)]
    pd.testing.assert_frame_equal(*rounds)
    assert audit_run(tmp_path, utility=utility()).intact


def test_aggregating_only_representatives_is_recorded_and_the_audit_derives_it_again(tmp_path):
    run(tmp_path, {}, acceptance=RepresentativesOnly())
    books = load_run(tmp_path)
    for t in range(1, ROUNDS + 1):
        record = read_round_record(record_path(tmp_path, t))
        assert sorted(record.accepted) == [1, 2, 3, 4]  # no free-rider, one of the twins
        ads = books.ledger[(books.ledger["round"] == t) & (books.ledger["method"] == "ads_defended")]["value"]
        row = books.rounds.set_index("round").loc[t]
        # The defended game's grand coalition is now the realized step: group efficiency again.
        assert ads.sum() == pytest.approx(row["utility_realized"] - row["utility_before"], abs=1e-12)
    assert audit_run(tmp_path, utility=utility()).intact
    record = read_round_record(record_path(tmp_path, 2))
    record.accepted = [1, 2, 3, 4, 5]
    write_round_record(tmp_path, record)
    problems = audit_run(tmp_path, utility=utility()).problems
    assert any("the defences' representatives are [1, 2, 3, 4]; the record accepted [1, 2, 3, 4, 5]" in p
               for p in problems)
