"""The hostile-reply battery: every kind of malformed, spoofed, poisoned or slow reply, sent by
real ClientApps through the real engine (Ray), against a run without the attackers.

One engine serves three runs of the same hostile federation (:mod:`tests.hostile.replies.hostile_app`):
``attack`` (every hostile partition tampers with its reply, each its own way), ``reference``
(they fail at once instead) and ``slow`` (as ``reference``, but the partition first in the
engine's queue sleeps far past the round's timeout, with one client worker). Each attacker
must be booked failed or rejected with a reason naming the field, the runs must complete and
audit intact, and the honest clients' books must equal the reference run's.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
from flwr.app import ConfigRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedvalue.audit.checks import audit_run
from fedvalue.run.archive import read_round_record, round_record_paths
from fedvalue.analysis.run_summary import load_run
from fedvalue.run.settings import RunSettings
from fedvalue.scoring.torch_utilities import TorchModelUtility
from fedvalue.valuation.settings import ValuationSettings
from simulations.runner.engine import serve
from simulations.runner.engine_settings import EngineSettings
from strategies import PartitionSampler, ValuingStrategy
from strategies.intake.nodes import NodeDirectory
from strategies.arrays import initial_arrays
from strategies.book_settings import BookSettings
from strategies.valuing_settings import IntakeSettings

from .hostile_app import (
    CLASSES,
    FEATURES,
    HONEST,
    MODE_KEY,
    NUM_NODES,
    NUM_TRAINING,
    ROLE_NAMES,
    SLOW_S,
    VICTIM,
    expected,
    make_hostile_app,
    model_factory,
)

ROUNDS = 2
#: The slow run's round timeout: each client's own limit, counted from when it starts.
SLOW_TIMEOUT_S = 2.5
MODES = ("attack", "reference", "slow")


def utility() -> TorchModelUtility:
    x = np.random.default_rng(5).normal(size=(120, FEATURES)).astype(np.float32)
    return TorchModelUtility(model_factory(), x, ((x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)) % CLASSES)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three runs on one engine: their directories, seconds and the shared node directory."""
    out = tmp_path_factory.mktemp("hostile")
    nodes = NodeDirectory()
    seconds: dict[str, float] = {}

    def main(grid: Grid) -> None:
        for mode in MODES:
            strategy = ValuingStrategy(
                FedAvg(fraction_evaluate=0.0), utility(), run_dir=str(out / mode),
                sampler=PartitionSampler(NUM_TRAINING, seed=0), seed=0,
                valuation=ValuationSettings(methods=("ads", "loo")), books=BookSettings(flows=True),
                intake=IntakeSettings(nodes=nodes, query_timeout=300.0), run=RunSettings(checkpoint=False))
            started = time.perf_counter()
            strategy.start(grid, initial_arrays(model_factory()), num_rounds=ROUNDS,
                           timeout=SLOW_TIMEOUT_S if mode == "slow" else 60.0,
                           train_config=ConfigRecord({"lr": 0.3, "local-epochs": 2, "seed": 0, MODE_KEY: mode}))
            seconds[mode] = time.perf_counter() - started

    serve(make_hostile_app(), main, num_supernodes=NUM_NODES, engine=EngineSettings(max_parallel_clients=1))
    return {"dirs": {mode: out / mode for mode in MODES}, "seconds": seconds, "nodes": nodes}


def ledger(runs, mode: str) -> pd.DataFrame:
    frame = load_run(runs["dirs"][mode]).ledger
    return frame.assign(client_id=frame["client_id"].astype(int))


def honest_books(runs, mode: str) -> pd.DataFrame:
    frame = ledger(runs, mode)
    return (frame[frame["client_id"].isin(HONEST)][["round", "client_id", "method", "value", "stderr", "status"]]
            .sort_values(["round", "client_id", "method"]).reset_index(drop=True))


@pytest.mark.parametrize("role", [r for r in ROLE_NAMES if r != "slow"])
def test_each_hostile_reply_is_booked_with_a_reason_naming_its_field(runs, role):
    partition = ROLE_NAMES.index(role)
    frame = ledger(runs, "attack")
    rows = frame[(frame["client_id"] == partition) & (frame["method"] == "ads")]
    status, fragment = expected(role)
    assert len(rows) == ROUNDS  # booked under its own node's partition, every round
    assert (rows["status"] == status).all(), rows[["round", "status", "reason"]]
    assert rows["reason"].map(lambda text: fragment in text).all(), (fragment, rows["reason"].tolist())
    if status == "rejected":  # valued by the harm it would have done, a number
        assert rows["value"].notna().all()


def test_the_runs_complete_and_audit_intact(runs):
    for mode in MODES:
        run = load_run(runs["dirs"][mode])
        assert list(run.rounds["round"]) == list(range(1, ROUNDS + 1))
        assert sorted(run.ledger["client_id"].astype(int).unique()) == list(range(NUM_TRAINING))
    report = audit_run(runs["dirs"]["attack"], utility=utility())
    assert report.intact, (report.problems, report.unverifiable)


def test_honest_clients_are_valued_as_in_the_run_without_the_attackers(runs):
    attacked, reference = honest_books(runs, "attack"), honest_books(runs, "reference")
    assert set(attacked["method"]) >= {"ads", "loo", "tracin_inflow", "tracin_outflow"}
    assert (attacked["status"] == "ok").all()
    pd.testing.assert_frame_equal(attacked, reference)
    columns = ["utility_before", "utility_after", "utility_realized", "num_failed"]
    rounds = {mode: load_run(runs["dirs"][mode]).rounds[columns] for mode in ("attack", "reference")}
    pd.testing.assert_frame_equal(rounds["attack"], rounds["reference"])


def test_a_reply_claiming_the_victims_id_never_reaches_the_victims_books(runs):
    records = {mode: {t: read_round_record(p) for t, p in round_record_paths(runs["dirs"][mode]).items()}
               for mode in ("attack", "reference")}
    for t in range(1, ROUNDS + 1):
        attacked, reference = records["attack"][t], records["reference"][t]
        assert attacked.statuses[VICTIM] == "ok"
        for key, value in reference.replies[VICTIM].items():
            np.testing.assert_array_equal(attacked.replies[VICTIM][key], value)
        assert attacked.weights[VICTIM] == reference.weights[VICTIM]
        assert attacked.losses[VICTIM] == reference.losses[VICTIM]
        for key, value in reference.gradients[VICTIM].items():
            np.testing.assert_array_equal(attacked.gradients[VICTIM][key], value)
        # Only the honest clients' gradients are taken (failed and gradient-less rejected replies give none).
        assert sorted(attacked.gradients) == HONEST


def test_a_slow_client_costs_only_its_own_reply(runs):
    # The honest clients queued behind it (one worker) are valued as if it had failed at once.
    pd.testing.assert_frame_equal(honest_books(runs, "slow"), honest_books(runs, "reference"))
    frame = ledger(runs, "slow")
    slow = frame[(frame["client_id"] == ROLE_NAMES.index("slow")) & (frame["method"] == "ads")]
    assert (slow["status"] == "failed").all()
    assert slow["reason"].str.contains(f"time limit of {SLOW_TIMEOUT_S:g} s").all()
    assert runs["seconds"]["slow"] < SLOW_S  # it was stopped at its limit, not waited for


def test_the_node_directory_registers_no_node_whose_id_is_not_one(runs):
    nodes = runs["nodes"]
    assert sorted(nodes.client_to_node) == list(range(NUM_TRAINING))
    assert len(nodes.node_to_client) == NUM_TRAINING  # the nodes answering "zero", [0, 1], 0.7, ... are not in it
