"""``audit_run(..., utility=...)`` recomputes the books from the saved round records.

The hash chain catches a changed line, but a forger can rewrite the chain too (it is
not signed). The recomputation cannot be forged that way: every value is derived again
from the saved states and replies and must match. The tests forge both ways: a changed
value with a rewritten chain, and a changed saved reply.
"""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, MessageType
from flwr.serverapp.strategy import FedAvg, FedAvgM

from fedvalue.run.archive import read_round_record, round_record_paths, write_round_record
from fedvalue.audit.checks import audit_run
from strategies import PartitionSampler, TopK, ValuingStrategy
from strategies.arrays import numpy_to_arrays
from strategies.aggregation.reaggregate import replay_aggregator

from tests.fedvalue.forgery import rechain, reseal
from fedvalue.valuation.settings import AdsSettings, ValuationSettings
from strategies.book_settings import BookSettings

from tests.strategies.harness.inprocess import InProcessGrid, set_server_identity
from tests.strategies.intake.test_faults import nan_handler
from tests.strategies.hooks.test_flow_books import client_app_grid, initial_state, load_client, utility
from tests.strategies.test_valuing import NODE_OF, PID_OF, initial_arrays as linear_initial_arrays, utility as _linear_utility_fixture

linear_utility = _linear_utility_fixture


def flows_run(run_dir, strategy_class=ValuingStrategy, inner=None, **options):
    strategy = strategy_class(
        inner or FedAvg(fraction_evaluate=0.0), utility(), run_dir=str(run_dir),
        sampler=PartitionSampler(4, seed=1), seed=3, books=BookSettings(flows=True), **options
    )
    strategy.start(client_app_grid(load_client), numpy_to_arrays(initial_state()), num_rounds=3, timeout=10,
                   train_config=ConfigRecord({"lr": 0.1, "local-epochs": 2, "batch-size": 0, "seed": 0}))
    return run_dir


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    set_server_identity()
    return flows_run(tmp_path_factory.mktemp("fedavg"))


def test_an_honest_run_recomputes_exactly(fedavg_run):
    report = audit_run(fedavg_run, utility=utility())
    assert report.ok, report.problems
    assert any("recomputed every value of 3 rounds" in c for c in report.checks)
    assert not any("not recomputed" in c for c in report.checks)


@pytest.mark.parametrize("method", ["ads", "loo", "tracin_inflow", "tracin_outflow", "tracin_self"])
def test_a_changed_value_with_a_forged_chain_is_caught_by_recomputation(tmp_path, fedavg_run, method):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for path in fedavg_run.rglob("*"):
        if path.is_file():
            target = run_dir / path.relative_to(fedavg_run)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    lines = (run_dir / "ledger.csv").read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if f",{method}," in line and line.startswith("2,")
                 and ",ok," in line)
    cells = lines[index].split(",")
    # The run's U is a loss: its values are compared within 10 times their float32 rounding on the auditor's
    # machine (8e-7 for round 2's LOO values here: fedvalue.audit.rounding_envelope), its flows exactly.
    cells[3] = repr(float(cells[3]) * 1.001 + (1e-5 if method in ("ads", "loo") else 1e-6))
    lines[index] = ",".join(cells)
    (run_dir / "ledger.csv").write_text("".join(lines))
    if method == "ads":  # keep group efficiency too: move the same amount off another client
        other = next(i for i, line in enumerate(lines) if ",ads," in line and line.startswith("2,") and i != index)
        moved = float(cells[3]) - float((fedavg_run / "ledger.csv").read_text().splitlines()[index].split(",")[3])
        other_cells = lines[other].split(",")
        other_cells[3] = repr(float(other_cells[3]) - moved)
        lines[other] = ",".join(other_cells)
        (run_dir / "ledger.csv").write_text("".join(lines))
    (run_dir / "ledger.parquet").unlink()
    rechain(run_dir)
    assert audit_run(run_dir).ok  # chain, schema and efficiency are all satisfied by the forgery
    report = audit_run(run_dir, utility=utility())
    assert not report.ok
    assert any(f"round 2 {method} of client" in p for p in report.problems)


def test_a_changed_saved_reply_is_caught(tmp_path, fedavg_run):
    run_dir = tmp_path / "run"
    for path in fedavg_run.rglob("*"):
        if path.is_file():
            target = run_dir / path.relative_to(fedavg_run)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    record = read_round_record(round_record_paths(run_dir)[1])
    client = record.accepted[0]
    record.replies[client] = {k: v * np.float32(1.01) for k, v in record.replies[client].items()}
    write_round_record(run_dir, record)
    report = audit_run(run_dir, utility=utility())
    assert any("its digest is not the one its round's seal committed to" in p for p in report.problems)
    reseal(run_dir)  # a forger also rewrites the seals and the manifest
    report = audit_run(run_dir, utility=utility())
    assert not report.ok
    assert any("recompute: round 1" in p for p in report.problems)


def test_selection_and_rejected_replies_are_recomputed(tmp_path, linear_utility):
    run_dir = tmp_path / "topk"
    grid = InProcessGrid(NODE_OF.values(), nan_handler({2: float("nan")}))
    ValuingStrategy(FedAvg(fraction_evaluate=0.0), linear_utility, acceptance=TopK(2, "ads"), run_dir=str(run_dir),
                    sampler=PartitionSampler(5, seed=0)).start(grid, linear_initial_arrays(), num_rounds=2, timeout=10)
    report = audit_run(run_dir, utility=linear_utility)
    assert report.ok, report.problems
    assert any("recomputed every value of 2 rounds" in c for c in report.checks)
    # Marking another client as selected is a changed number the recomputation sees.
    lines = (run_dir / "ledger.csv").read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if ",selected,0.0," in line)
    lines[index] = lines[index].replace(",selected,0.0,", ",selected,1.0,")
    (run_dir / "ledger.csv").write_text("".join(lines))
    (run_dir / "ledger.parquet").unlink()
    rechain(run_dir)
    report = audit_run(run_dir, utility=linear_utility)
    assert any("selected of client" in p for p in report.problems)


def test_an_honest_run_with_a_failure_between_replies_audits_intact_with_the_utility(tmp_path, linear_utility):
    """A client that raises in the middle of a round (and a NaN reply after it): the books
    list the clients in reply order, and the audit books the round again from the same
    record in the same order, so an honest run is intact; a record reordered to put the
    failure last is then a different round."""
    run_dir = tmp_path / "failing"
    nan = nan_handler({3: float("nan")})

    def handler(message, node_id):
        if PID_OF[node_id] == 1 and message.metadata.message_type == MessageType.TRAIN:
            return Error(code=0, reason="client 1 crashed")
        return nan(message, node_id)

    ValuingStrategy(FedAvg(fraction_evaluate=0.0), linear_utility, run_dir=str(run_dir),
                    sampler=PartitionSampler(6, seed=0)).start(InProcessGrid(NODE_OF.values(), handler),
                                                                linear_initial_arrays(), num_rounds=2, timeout=10)
    rounds = list(csv.DictReader(open(run_dir / "rounds.csv", newline="")))
    assert [r["clients"] for r in rounds] == ["0 1 2 3 4 5"] * 2 and rounds[0]["num_failed"] == "2"
    report = audit_run(run_dir, utility=linear_utility)
    assert report.intact, (report.problems, report.unverifiable)
    assert any("recomputed every value of 2 rounds" in c for c in report.checks)
    record = read_round_record(round_record_paths(run_dir)[1])
    assert [(e.client_id, e.status) for e in record.entries] == [
        (0, "ok"), (1, "failed"), (2, "ok"), (3, "rejected"), (4, "ok"), (5, "ok")]
    assert record.entries[1].reason.endswith("client 1 crashed")
    record.entries = [e for e in record.entries if e.status != "failed"] + [record.entries[1]]
    write_round_record(run_dir, record)
    reseal(run_dir)
    assert any("round 1 clients: booked '0 1 2 3 4 5'" in p for p in audit_run(run_dir, utility=linear_utility).problems)


def momentum() -> FedAvgM:
    return FedAvgM(fraction_evaluate=0.0, server_momentum=0.9)


@pytest.fixture(scope="module")
def momentum_run(tmp_path_factory):
    set_server_identity()
    return flows_run(tmp_path_factory.mktemp("momentum"), inner=momentum())


def copied(run_dir, tmp_path):
    target = tmp_path / "copy"
    for path in run_dir.rglob("*"):
        if path.is_file():
            (target / path.relative_to(run_dir)).parent.mkdir(parents=True, exist_ok=True)
            (target / path.relative_to(run_dir)).write_bytes(path.read_bytes())
    return target


def test_rounds_of_other_strategies_without_a_replay_are_said_to_be_unrecomputed(momentum_run):
    report = audit_run(momentum_run, utility=utility())
    assert report.ok, report.problems  # nothing failed, but the audit fails closed: not verifiable, not intact
    assert not report.intact and report.verdict == "NOT verifiable"
    assert any("rounds [1, 2, 3] aggregate through FedAvgM's own code: their values were NOT recomputed" in c
               for c in report.unverifiable)


def test_rounds_of_other_strategies_are_recomputed_by_replaying_their_saved_state(momentum_run, tmp_path):
    """FedAvgM's momentum moves A_t away from the weighted mean; the record saved the
    momentum buffer when the replies arrived, so the audit replays the strategy's own
    aggregation (flows and values included): intact. A changed momentum buffer in a
    record is then a different round."""
    replay = replay_aggregator(momentum)
    report = audit_run(momentum_run, utility=utility(), replay=replay)
    assert report.intact, (report.problems, report.unverifiable)
    assert any("recomputed every value of 3 rounds" in c for c in report.checks)
    run_dir = copied(momentum_run, tmp_path)
    record = read_round_record(round_record_paths(run_dir)[3])
    tree, arrays = record.replay
    assert arrays, "round 3 starts with a momentum buffer"
    record.replay = (tree, {k: v * 1.5 if v.dtype.kind == "f" else v for k, v in arrays.items()})
    write_round_record(run_dir, record)
    reseal(run_dir)
    report = audit_run(run_dir, utility=utility(), replay=replay)
    assert not report.ok and any("recompute: round 3" in p for p in report.problems)


def test_a_record_without_a_replay_state_is_not_verifiable_and_says_why(momentum_run, tmp_path):
    run_dir = copied(momentum_run, tmp_path)
    record = read_round_record(round_record_paths(run_dir)[2])
    record.replay = None
    write_round_record(run_dir, record)
    reseal(run_dir)
    report = audit_run(run_dir, utility=utility(), replay=replay_aggregator(momentum))
    assert not report.intact
    assert any("values of round 2: not recomputed, its record holds no replay state" in u for u in report.unverifiable)


def test_mc_valued_rounds_are_recomputed_from_the_round_seed(tmp_path, linear_utility):
    """MC-ADS draws its permutations from the round's seed (fedvalue.valuation.round_game.round_rng): the audit
    draws the same ones and recomputes every value exactly; another seed gives other values."""
    run_dir = tmp_path / "mc"
    grid = InProcessGrid(NODE_OF.values(), nan_handler({}))
    ValuingStrategy(
        FedAvg(fraction_evaluate=0.0), linear_utility, run_dir=str(run_dir), seed=11,
        sampler=PartitionSampler(5, seed=0),
        valuation=ValuationSettings(ads=AdsSettings(method="mc", epsilon=0.5))
    ).start(
        grid, linear_initial_arrays(), num_rounds=2, timeout=10)
    with open(run_dir / "ledger.csv", newline="") as handle:
        stderr = [float(row["stderr"]) for row in csv.DictReader(handle) if row["stderr"]]
    assert max(stderr) > 0  # MC was used: permutations were drawn
    report = audit_run(run_dir, utility=linear_utility)
    assert report.ok, report.problems
    assert any("recomputed every value of 2 rounds from the saved arrays (largest difference 0.0e+00)" in c
               for c in report.checks)
    for path in round_record_paths(run_dir).values():  # the audit reads the seed from the record
        record = read_round_record(path)
        record.settings = dataclasses.replace(record.settings, seed=12)
        write_round_record(run_dir, record)
    reseal(run_dir)
    assert not audit_run(run_dir, utility=linear_utility).ok


class MyFedAvg(FedAvg):
    """A user's FedAvg subclass that keeps FedAvg's aggregation (the README's example)."""


def test_a_fedavg_subclass_keeping_its_aggregation_is_recomputed(tmp_path, fedavg_run):
    run_dir = flows_run(tmp_path / "mine", inner=MyFedAvg(fraction_evaluate=0.0))
    report = audit_run(run_dir, utility=utility())
    assert report.intact, (report.problems, report.unverifiable)
    assert any("recomputed every value of 3 rounds" in c for c in report.checks)
    assert (run_dir / "ledger.csv").read_bytes() == (fedavg_run / "ledger.csv").read_bytes()
