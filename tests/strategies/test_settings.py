"""The valuing strategy's settings objects: each is checked once when made (the error names
the field), taken whole by the strategy, written into run.json as the round records write
it, and compared with the records by the audit (runs written before, with the older option
names or without ``stderr_estimator``, still audit)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg

from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.valuation.settings import ADAPTIVE_FIELDS, AdsSettings, ValuationSettings
from fedvalue.run.archive import read_round_record, record_path
from fedvalue.analysis.run_summary import load_run
from fedvalue.audit.checks import audit_run
from fedvalue.audit.round import settings_problems
from fedvalue.run.settings import RunSettings
from simulations.runner.engine_settings import EngineSettings
from strategies import PartitionSampler, RunCallbacks, ValuingStrategy
from strategies.intake.nodes import NodeDirectory
from strategies.book_settings import BookSettings
from strategies.valuing_settings import IntakeSettings

from tests.strategies.harness.inprocess import InProcessGrid
from tests.strategies.test_valuing import NODE_OF, initial_arrays, make_handler, utility as _utility_fixture

utility = _utility_fixture


@pytest.mark.parametrize(("make", "error", "named"), [
    (lambda: ValuationSettings(methods=("ads", "banzhaf")), ValueError, "methods: expected a subset"),
    (lambda: ValuationSettings(methods="ads"), TypeError, "methods: expected a sequence of names"),
    (lambda: ValuationSettings(ads={"method": "mc"}), TypeError, "ads: expected a fedvalue.valuation.settings.AdsSettings; got dict"),
    (lambda: RunCallbacks(on_progress=3), TypeError, "on_progress: expected a callable"),
    (lambda: BookSettings(flows=1), TypeError, "flows: expected True or False; got 1"),
    (lambda: BookSettings(flows=True, flows_projection_dim=0), ValueError,
     "^flows_projection_dim: expected a positive integer or None; got 0"),
    (lambda: BookSettings(flows=True, flows_projection_dim=-4), ValueError,
     "^flows_projection_dim: expected a positive integer or None; got -4"),
    (lambda: BookSettings(flows=True, flows_projection_dim=2.5), ValueError,
     "^flows_projection_dim: expected a positive integer or None; got 2.5"),
    (lambda: BookSettings(flows=True, flows_projection_dim=4096.0), ValueError,
     "^flows_projection_dim: expected a positive integer or None; got 4096.0"),
    (lambda: BookSettings(flows=True, flows_projection_dim=True), ValueError,
     "^flows_projection_dim: expected a positive integer or None; got True"),
    (lambda: BookSettings(flows=True, flows_projection_dim="4096"), ValueError,
     "^flows_projection_dim: expected a positive integer or None; got '4096'"),
    (lambda: BookSettings(flows_projection_dim=4096), ValueError,
     r"^flows_projection_dim: projects the vectors of TracIn flows, which this run does not book \(flows=False\)"),
    (lambda: BookSettings(flows=True, flows_projection_dim=4096, defences=DefenceSettings()), ValueError,
     "^flows_projection_dim: the defences book a defended TracIn outflow from the full inference gradients"),
    (lambda: BookSettings(fairness="dp"), TypeError, "fairness: expected a fedvalue.scoring.fairness.objectives.GroupFairness"),
    (lambda: BookSettings(fair_curvature=0.5), ValueError, "fair_curvature: fairness influence with curvature needs"),
    (lambda: BookSettings(noisy_clients="0,1"), TypeError, "noisy_clients: expected a collection of client ids"),
    (lambda: IntakeSettings(query_timeout=-1), ValueError, "query_timeout: expected a finite number > 0; got -1"),
    (lambda: IntakeSettings(reject_non_finite="no"), TypeError, "reject_non_finite: expected True or False"),
    (lambda: IntakeSettings(nodes={}), TypeError, "nodes: expected a strategies.intake.nodes.NodeDirectory"),
    (lambda: RunSettings(checkpoint="yes"), TypeError, "checkpoint: expected True or False; got 'yes'"),
    (lambda: RunSettings(run_config=[("seed", 0)]), TypeError, "run_config: expected a mapping"),
    (lambda: RunCallbacks(on_round="print"), TypeError, "on_round: expected a callable"),
    (lambda: RunSettings(sign_key="/nonexistent/key.pem"), TypeError, "sign_key"),
    (lambda: EngineSettings(max_parallel_clients=0), ValueError, "max_parallel_clients: expected a positive integer"),
    (lambda: EngineSettings(ray_address=""), ValueError, "ray_address: expected a non-empty address string or None"),
])
def test_each_setting_is_checked_when_made_and_the_error_names_it(make, error, named):
    with pytest.raises(error, match=named):
        make()


@pytest.mark.parametrize("name", ["valuation", "books", "intake", "run"])
def test_the_strategy_refuses_anything_but_its_settings_object(name, utility):
    with pytest.raises(TypeError, match=f"{name}: expected a .*Settings \\(or None\\); got dict"):
        ValuingStrategy(FedAvg(), utility, **{name: {}})


def test_settings_are_taken_whole_and_normalized_once(utility):
    nodes = NodeDirectory()
    valuation = ValuationSettings(methods=["ads"], ads=AdsSettings(method="mc", epsilon=0.5))
    strategy = ValuingStrategy(FedAvg(), utility, valuation=valuation, books=BookSettings(noisy_clients=[3, 3, 4]),
                               intake=IntakeSettings(nodes=nodes, query_timeout=5))
    assert strategy.methods == ("ads",) and strategy.valuation.ads is valuation.ads
    assert strategy.book_settings.noisy_clients == frozenset({3, 4})
    assert strategy.nodes is nodes and strategy.intake.query_timeout == 5.0
    assert ValuingStrategy(FedAvg(), utility).valuation == ValuationSettings()  # None: the defaults


def mc_run_with(run_dir, utility, ads: AdsSettings, clients_per_round: int = 4):
    config = {"seed": 11, "methods": ["ads", "loo"], "valuation": ads.as_dict()}
    ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(run_dir),
                    sampler=PartitionSampler(clients_per_round, seed=0),
                    seed=11, valuation=ValuationSettings(ads=ads), run=RunSettings(run_config=config)).start(
        InProcessGrid(NODE_OF.values(), make_handler()), initial_arrays(), num_rounds=2, timeout=10)
    return run_dir


@pytest.fixture
def mc_run(tmp_path, utility):
    return mc_run_with(tmp_path / "run", utility, AdsSettings(method="mc", epsilon=0.5, stderr_target=0.05))


def test_run_json_holds_the_estimator_as_the_records_write_it_and_the_audit_compares_them(mc_run, utility):
    config = json.loads((mc_run / "run.json").read_text())
    record = read_round_record(record_path(mc_run, 1))
    assert record.settings.valuation.as_dict() == config["valuation"] == AdsSettings(
        method="mc", epsilon=0.5, stderr_target=0.05).as_dict()
    assert settings_problems(record, config) == []
    assert audit_run(mc_run, utility=utility).intact
    changed = {**config, "valuation": {**config["valuation"], "epsilon": 0.1}}
    assert settings_problems(record, changed) == ["its epsilon is 0.5, run.json says 0.1"]


def test_a_run_json_written_before_with_the_option_names_is_still_compared(mc_run):
    """Runs written before run.json held ``valuation`` named the estimator by the CLI's options
    (a zero stderr_target then meant none)."""
    record = read_round_record(record_path(mc_run, 1))
    legacy = {"seed": 11, "methods": ["ads", "loo"], "ads_method": "mc", "epsilon": 0.5, "delta": 0.05,
              "truncation_tolerance": 1e-3, "stderr_target": 0.05}
    assert settings_problems(record, legacy) == []
    assert settings_problems(record, {**legacy, "ads_method": "tmc"}) == ["its method is 'mc', run.json says 'tmc'"]
    assert settings_problems(record, {**legacy, "stderr_target": 0.0}) == [
        "its stderr_target is 0.05, run.json says None"]


def test_a_run_valued_adaptively_books_its_method_and_the_audit_recomputes_it(tmp_path, utility):
    """Six clients a round (positions 2 and 3 sampled): the records and run.json name the decision, rounds.csv
    names ``ads-adaptive``, the books are efficient and the audit recomputes them from the records."""
    ads = AdsSettings(method="adaptive", decision="threshold", cut=0.0, epsilon=0.3)
    run_dir = mc_run_with(tmp_path / "run", utility, ads, clients_per_round=6)
    config = json.loads((run_dir / "run.json").read_text())
    assert config["valuation"]["decision"] == "threshold" and config["valuation"]["cut"] == 0.0
    assert read_round_record(record_path(run_dir, 1)).settings.valuation == ads
    run = load_run(run_dir)
    assert set(run.rounds["ads_method"]) == {"ads-adaptive"}
    assert (run.ledger.query("method == 'ads'")["stderr"] > 0).any()
    report = audit_run(run_dir, utility=utility)
    assert report.intact, report.problems


def booked_stderr(run_dir) -> dict:
    ledger = load_run(run_dir).ledger
    return {(int(r.round), str(r.client_id)): float(r.stderr) for r in ledger.itertuples() if r.method == "ads"}


def test_a_run_booked_before_the_standard_error_was_a_setting_audits_with_the_plain_one(tmp_path, utility,
                                                                                          monkeypatch):
    """Its records and run.json do not name ``stderr_estimator`` (written here by an ``as_dict`` without it) and its
    ledger holds the plain standard errors: the audit reads the records as ``"plain"`` and finds the books intact.
    A run of today names ``"by-position"`` and books other standard errors for the same draws."""
    ads = AdsSettings(method="mc", epsilon=0.5, budget=40)
    before = {"stderr_estimator", *ADAPTIVE_FIELDS}  # the fields as_dict did not write then
    monkeypatch.setattr(AdsSettings, "as_dict", lambda self: {f.name: getattr(self, f.name) for f in
                                                              dataclasses.fields(self) if f.name not in before})
    old = mc_run_with(tmp_path / "old", utility, dataclasses.replace(ads, stderr_estimator="plain"))
    monkeypatch.undo()
    assert "stderr_estimator" not in json.loads((old / "run.json").read_text())["valuation"]
    assert read_round_record(record_path(old, 1)).settings.valuation.stderr_estimator == "plain"
    assert audit_run(old, utility=utility).intact
    new = mc_run_with(tmp_path / "new", utility, ads)
    assert json.loads((new / "run.json").read_text())["valuation"]["stderr_estimator"] == "by-position"
    assert audit_run(new, utility=utility).intact
    plain, by_position = booked_stderr(old), booked_stderr(new)
    assert plain.keys() == by_position.keys() and plain != by_position
    old_values = load_run(old).ledger.query("method == 'ads'")["value"].to_numpy()
    np.testing.assert_array_equal(old_values, load_run(new).ledger.query("method == 'ads'")["value"].to_numpy())


@pytest.mark.parametrize("books", [BookSettings(flows=True)])
def test_books_sent_as_a_second_array_record_are_refused_under_client_side_dp(books, utility):
    from flwr.serverapp.strategy import (DifferentialPrivacyClientSideFixedClipping,
                                         DifferentialPrivacyServerSideFixedClipping)

    client_side = DifferentialPrivacyClientSideFixedClipping(FedAvg(), noise_multiplier=0.1, clipping_norm=1.0,
                                                             num_sampled_clients=3)
    with pytest.raises(ValueError, match="flows: DifferentialPrivacyClientSideFixedClipping clips on the clients"):
        ValuingStrategy(client_side, utility, books=books)
    server_side = DifferentialPrivacyServerSideFixedClipping(FedAvg(), noise_multiplier=0.1, clipping_norm=1.0,
                                                             num_sampled_clients=3)
    assert ValuingStrategy(server_side, utility, books=books).book_settings.flows
