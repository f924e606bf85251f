"""The coalition rule through a run: under ``fixed-weight`` a client that sends back the model it received is
booked 0 by ADS and LOO in every round it is sampled (under ``renormalized`` it is not), the round record
keeps the rule and the audit recomputes the books under it; a record that claims the other rule is caught.
A strategy that aggregates by its own code, or a run with defences, is refused the fixed-weight rule when
it is made (in-process grid, real FedAvg and torch training, no Ray)."""

from __future__ import annotations

import dataclasses

import pytest
from flwr.app import ConfigRecord, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, FedMedian

from fedvalue.analysis.run_summary import load_run
from fedvalue.audit.checks import audit_run
from fedvalue.audit.round import recompute_books
from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.run.archive import read_round_record, record_bytes, round_record_paths
from fedvalue.valuation.settings import AdsSettings, ValuationSettings
from strategies import BookSettings, PartitionSampler, ValuingStrategy
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from tests.strategies.harness.inprocess import InProcessGrid
from tests.strategies.test_valuing import NODE_OF, PID_OF, initial_arrays, local_training, utility  # noqa: F401

FREE_RIDER = 2


def handler(message, node_id):
    """Every client trains as in test_valuing, but FREE_RIDER sends back what it received."""
    pid = PID_OF[node_id]
    if message.metadata.message_type == MessageType.QUERY:
        return RecordDict({"client": ConfigRecord({"partition-id": pid})})
    received = arrays_to_numpy(message.content["arrays"])
    arrays, n, loss = (received, 30, 1.0) if pid == FREE_RIDER else local_training(received, pid)
    return RecordDict({"arrays": numpy_to_arrays(arrays), "metrics": MetricRecord({"num-examples": n, "train-loss": loss}),
                       "client": ConfigRecord({"partition-id": pid})})


def valued_run(tmp_path, utility, rule: str):  # noqa: F811
    valuation = ValuationSettings(("ads", "loo"), AdsSettings(method="exact"), coalition_rule=rule)
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(tmp_path / rule),
                               sampler=PartitionSampler(4, schedule="even", seed=1), seed=0, valuation=valuation)
    strategy.start(InProcessGrid(NODE_OF.values(), handler), initial_arrays(), num_rounds=3, timeout=10)
    return tmp_path / rule


def free_rider_values(run_dir) -> list[float]:
    ledger = load_run(run_dir).ledger
    rows = ledger[(ledger["client_id"] == str(FREE_RIDER)) & ledger["method"].isin(["ads", "loo"])]
    assert len(rows) >= 2  # it was sampled
    return rows["value"].tolist()


def test_a_free_rider_is_a_null_player_under_the_fixed_weight_rule_and_the_audit_agrees(tmp_path, utility):  # noqa: F811
    fixed = valued_run(tmp_path, utility, "fixed-weight")
    assert free_rider_values(fixed) == [0.0] * len(free_rider_values(fixed))
    assert all(v != 0.0 for v in free_rider_values(valued_run(tmp_path, utility, "renormalized")))
    report = audit_run(fixed, utility=utility)
    assert report.intact, report.problems
    records = round_record_paths(fixed)
    assert {read_round_record(p).settings.coalition_rule for p in records.values()} == {"fixed-weight"}

    # A record rewritten to claim the renormalized rule no longer gives the booked values, and the audit
    # catches the claim against run.json before it recomputes anything.
    t, path = next((t, p) for t, p in records.items() if FREE_RIDER in read_round_record(p).replies)
    record = read_round_record(path)
    claimed = dataclasses.replace(record, settings=dataclasses.replace(record.settings, coalition_rule="renormalized"))
    books, *_ = recompute_books(claimed, utility)
    recomputed = {(r.client_id, r.method): r.value for r in books.ledger_rows}
    assert recomputed[(FREE_RIDER, "ads")] != 0.0 and recomputed[(FREE_RIDER, "loo")] != 0.0
    path.write_bytes(record_bytes(claimed))
    report = audit_run(fixed, utility=utility)
    assert not report.intact
    assert f"recompute: round {t}'s record: its coalition rule is 'renormalized', run.json says 'fixed-weight'" in (
        report.problems), report.problems


def test_the_fixed_weight_rule_is_refused_where_it_is_not_defined(utility):  # noqa: F811
    valuation = ValuationSettings(coalition_rule="fixed-weight")
    with pytest.raises(ValueError, match="coalition_rule: 'fixed-weight' weighs each coalition by FedAvg's round "
                                         "weights; FedMedian aggregates by its own code"):
        ValuingStrategy(FedMedian(fraction_evaluate=0.0), utility, valuation=valuation)
    with pytest.raises(ValueError, match="defences: the defended game values clusters under the renormalized"):
        ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, valuation=valuation,
                        books=BookSettings(defences=DefenceSettings()))
