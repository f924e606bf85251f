"""The fixed-weight game's second-order book through a run (in-process grid, real FedAvg and torch training, no
Ray): ``BookSettings(fixed_second_order=True)`` books ``ads_fixed_second_order`` beside the run's own ADS, equal
to ``value_round`` of the record's fixed-weight round game by the second-order expansion, with its anchors' two
evaluations counted in rounds.csv; one client's reply split into two identities whose claims and claim-weighted
updates add up to its own is booked as that client was, every other client unchanged; the audit recomputes the
rows and fails a changed one, naming the method; a utility that is not differentiable and a strategy that
aggregates by its own code are refused when the strategy is made, naming ``fixed_second_order``; and a run
without the book carries no trace of it in its records or run.json."""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil

import numpy as np
import pytest
from flwr.app import ConfigRecord, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, FedMedian

from fedvalue.analysis.run_summary import load_run
from fedvalue.audit.checks import audit_run
from fedvalue.rounds.record_game import valid_clients, value_record
from fedvalue.run.archive import (
    npz_from_bytes,
    read_round_record,
    record_bytes,
    round_record_paths,
)
from fedvalue.scoring.torch_utilities import TorchModelUtility
from fedvalue.valuation.round_game import round_game_for, round_rng, value_round
from fedvalue.valuation.settings import FIXED_WEIGHT, AdsSettings, ValuationSettings
from strategies import BookSettings, PartitionSampler, ValuingStrategy
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from tests.fedvalue.forgery import forge_ledger_rows
from tests.strategies.harness.inprocess import InProcessGrid
from tests.strategies.test_valuing import (
    NODE_OF,
    PID_OF,
    initial_arrays,
    local_training,
    make_handler,
    make_model,
    utility,  # noqa: F401 (a fixture)
)

METHOD = "ads_fixed_second_order"
BOOKED = BookSettings(fixed_second_order=True)
EXACT = ValuationSettings(("ads", "loo"), AdsSettings(method="exact"))
#: The client whose reply the split run replaces by two identities' (its partition, 50 examples), and theirs.
SPLIT, IDENTITIES = 3, (4, 5)


def valued_run(run_dir, utility, handler, pids, *, num_rounds: int, books=BOOKED):  # noqa: F811
    """A FedAvg run over the nodes of ``pids``, every one sampled each round (exact ADS and LOO)."""
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(run_dir),
                               sampler=PartitionSampler(len(pids), seed=1), seed=0, valuation=EXACT, books=books)
    strategy.start(InProcessGrid([NODE_OF[p] for p in pids], handler), initial_arrays(), num_rounds=num_rounds,
                   timeout=10)
    return run_dir


def booked_rows(run_dir, t: int, method: str = METHOD) -> dict[str, tuple[float, float]]:
    ledger = load_run(run_dir).ledger
    rows = ledger[(ledger["round"] == t) & (ledger["method"] == method)]
    return {str(c): (float(v), float(s)) for c, v, s in zip(rows["client_id"], rows["value"], rows["stderr"])}


def test_the_booked_rows_are_the_second_order_value_of_the_records_fixed_weight_game(tmp_path, utility):  # noqa: F811
    run_dir = valued_run(tmp_path / "run", utility, make_handler(), range(4), num_rounds=3)
    rounds = load_run(run_dir).rounds.set_index("round")
    config = json.loads((run_dir / "run.json").read_text())
    assert config["fixed_second_order"] is True
    for t, path in round_record_paths(run_dir).items():
        record = read_round_record(path)
        assert record.settings.fixed_second_order and record.settings.coalition_rule == "renormalized"
        ok = valid_clients(record)
        game = round_game_for(ok, record.start_arrays, [record.replies[c] for c in ok],
                              [record.weights[c] for c in ok], utility, rule=FIXED_WEIGHT)
        expected = value_round(game, ("ads",), AdsSettings(method="second-order"), seed=round_rng(0, t))
        values = expected.results["ads"].values
        booked = booked_rows(run_dir, t)
        assert set(booked) == {str(c) for c in ok}
        for c in ok:
            assert booked[str(c)][0] == pytest.approx(float(values[c]), rel=1e-12, abs=1e-15)
            assert booked[str(c)][1] == 0.0
        # The run's own ADS is the renormalized game's, exact; the book adds its anchors' two evaluations.
        own = value_record(record, utility, round_rng(0, t))
        assert rounds.loc[t, "ads_method"] == "ads-exact"
        assert rounds.loc[t, "num_evaluations"] == own.num_evaluations + 2 == own.num_evaluations + expected.num_evaluations


def split_handler(message, node_id):
    """Clients 0-2 train as in test_valuing; the identities 4 and 5 reply SPLIT's trained model moved by ±d, each
    claiming half its 50 examples: claims 25 + 25 = 50, claim-weighted updates 25 (Δ + d) + 25 (Δ − d) = 50 Δ."""
    pid = PID_OF[node_id]
    if message.metadata.message_type == MessageType.QUERY:
        return RecordDict({"client": ConfigRecord({"partition-id": pid})})
    received = arrays_to_numpy(message.content["arrays"])
    if pid not in IDENTITIES:
        arrays, n, loss = local_training(received, pid)
    else:
        trained, n, loss = local_training(received, SPLIT)
        rng = np.random.default_rng(11)
        sign = 1.0 if pid == IDENTITIES[0] else -1.0
        arrays = {k: (v + sign * 0.05 * rng.normal(size=v.shape)).astype(v.dtype) for k, v in trained.items()}
        n //= 2
    return RecordDict({"arrays": numpy_to_arrays(arrays), "metrics": MetricRecord({"num-examples": n, "train-loss": loss}),
                       "client": ConfigRecord({"partition-id": pid})})


def test_identities_whose_claims_and_weighted_updates_add_up_are_paid_their_sum(tmp_path, utility):  # noqa: F811
    honest_run = valued_run(tmp_path / "honest", utility, make_handler(), (0, 1, 2, SPLIT), num_rounds=1)
    split_run = valued_run(tmp_path / "split", utility, split_handler, (0, 1, 2, *IDENTITIES), num_rounds=1)
    honest, split = booked_rows(honest_run, 1), booked_rows(split_run, 1)
    assert set(split) == {"0", "1", "2", *map(str, IDENTITIES)}
    a, b = (split[str(c)][0] for c in IDENTITIES)
    assert abs(a - b) > 1e-3 * abs(a + b)  # two different identities, not one value halved
    assert a + b == pytest.approx(honest[str(SPLIT)][0], rel=1e-4)  # float32 rounding of the replies' arrays
    for c in ("0", "1", "2"):
        assert split[c][0] == pytest.approx(honest[c][0], rel=1e-4)
    # The run's own ADS (the renormalized game) pays the same split otherwise: the book is what holds it.
    plain_honest, plain_split = booked_rows(honest_run, 1, "ads"), booked_rows(split_run, 1, "ads")
    assert sum(plain_split[str(c)][0] for c in IDENTITIES) > 1.1 * plain_honest[str(SPLIT)][0]


def test_the_audit_recomputes_the_rows_and_fails_a_changed_one_naming_the_method(tmp_path, utility):  # noqa: F811
    run_dir = valued_run(tmp_path / "run", utility, make_handler(), range(4), num_rounds=2)
    report = audit_run(run_dir, utility=utility)
    assert report.intact, report.problems

    # A record rewritten to say the book was off is caught against run.json before anything is recomputed.
    dropped = tmp_path / "dropped"
    shutil.copytree(run_dir, dropped)
    path = round_record_paths(dropped)[1]
    record = read_round_record(path)
    path.write_bytes(record_bytes(dataclasses.replace(
        record, settings=dataclasses.replace(record.settings, fixed_second_order=False))))
    report = audit_run(dropped, utility=utility)
    assert not report.intact
    assert "recompute: round 1's record: its fixed_second_order is False, run.json says True" in report.problems, (
        report.problems)

    with open(run_dir / "ledger.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    changed = next(row for row in rows if row["round"] == "2" and row["method"] == METHOD)
    changed["value"] = repr(float(changed["value"]) + 1e-3)
    forge_ledger_rows(run_dir, rows)  # a forger without a key: the chain, seals and manifest match the edit
    report = audit_run(run_dir, utility=utility)
    assert not report.intact
    assert any(p.startswith(f"recompute: round 2 {METHOD} of client {changed['client_id']}: value is booked")
               for p in report.problems), report.problems


def test_what_the_book_cannot_value_is_refused_when_the_strategy_is_made(utility):  # noqa: F811
    rng = np.random.default_rng(0)
    accuracy = TorchModelUtility(make_model(), rng.normal(size=(20, 5)).astype(np.float32), rng.integers(0, 3, 20))
    with pytest.raises(ValueError, match=r"^fixed_second_order: expected a differentiable utility, .* got "
                                         r"TorchModelUtility with metric='accuracy' \(not differentiable\)\. "):
        ValuingStrategy(FedAvg(fraction_evaluate=0.0), accuracy, books=BOOKED)
    with pytest.raises(ValueError, match=r"^fixed_second_order: expected an inner strategy that aggregates by "
                                         r"FedAvg's weighted mean .* got FedMedian, which aggregates by its own code"):
        ValuingStrategy(FedMedian(fraction_evaluate=0.0), utility, books=BOOKED)
    with pytest.raises(TypeError, match="fixed_second_order: expected True or False; got 1"):
        BookSettings(fixed_second_order=1)
    ValuingStrategy(FedAvg(fraction_evaluate=0.0), accuracy)  # off: nothing to refuse


#: The settings every record wrote before the book existed, in a default run.
DEFAULT_SETTINGS_KEYS = {"methods", "valuation", "seed", "strategy", "aggregation", "weighted_by_key", "flows",
                         "reject_non_finite", "selection"}


def test_a_run_without_the_book_carries_no_trace_of_it(tmp_path, utility):  # noqa: F811
    off = valued_run(tmp_path / "off", utility, make_handler(), range(4), num_rounds=1, books=None)
    on = valued_run(tmp_path / "on", utility, make_handler(), range(4), num_rounds=1)
    assert "fixed_second_order" not in json.loads((off / "run.json").read_text())
    assert METHOD not in set(load_run(off).ledger["method"])
    off_path, on_path = round_record_paths(off)[1], round_record_paths(on)[1]
    off_settings = npz_from_bytes(off_path.read_bytes(), "off")[1]["meta"]
    on_settings = npz_from_bytes(on_path.read_bytes(), "on")[1]["meta"]
    assert set(off_settings) == DEFAULT_SETTINGS_KEYS
    assert on_settings == {**off_settings, "fixed_second_order": True}
    # The two runs trained alike: their records differ by that key alone, byte for byte once it is dropped.
    record = read_round_record(on_path)
    assert not read_round_record(off_path).settings.fixed_second_order
    dropped = record_bytes(dataclasses.replace(record, settings=read_round_record(off_path).settings))
    assert dropped == off_path.read_bytes()
