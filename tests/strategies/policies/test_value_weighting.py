"""Value-weighted aggregation: the rule by hand, the live aggregate against a brute-force weighted
mean, the books, and an audit that re-derives the factors (in process, no Ray)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import MessageType
from flwr.serverapp.strategy import FedAvg, FedMedian

from fedvalue.audit.checks import audit_run
from fedvalue.rounds.kinds.value_weights import value_weight_outcome, weighting_rule
from fedvalue.analysis.run_summary import load_run
from fedvalue.valuation.round_game import weighted_mean
from fedvalue.valuation.settings import ValuationSettings
from strategies import PartitionSampler, ValuingStrategy, ValueWeighting
from strategies.arrays import arrays_to_numpy
from strategies.book_settings import BookSettings

from tests.strategies.harness.inprocess import InProcessGrid
from tests.strategies.test_valuing import NODE_OF, PID_OF, initial_arrays, local_training, make_handler, utility as _utility_fixture

utility = _utility_fixture


def test_the_positive_rule_weighs_by_value_and_leaves_out_who_did_not_help():
    accepted, factors = value_weight_outcome(weighting_rule("ads"), {"a": 0.2, "b": -0.1, "c": 0.4, "d": 0.0})
    assert accepted == {"a", "c"}
    assert factors == pytest.approx({"a": 0.2 / 0.3, "b": 0.0, "c": 0.4 / 0.3, "d": 0.0})
    assert value_weight_outcome(weighting_rule("ads"), {"a": -0.2, "b": 0.0}) == (set(), {"a": 0.0, "b": 0.0})


def test_the_softmax_rule_is_scale_free_and_keeps_everyone():
    rule = weighting_rule("loo", "softmax", temperature=0.5)
    values = {"a": 0.02, "b": -0.04, "c": 0.01}
    accepted, factors = value_weight_outcome(rule, values)
    relative = np.array([0.5, -1.0, 0.25])
    expected = np.exp((relative - 0.5) / 0.5)
    assert accepted == {"a", "b", "c"}
    assert list(factors.values()) == pytest.approx((expected / expected.mean()).tolist())
    assert value_weight_outcome(rule, {k: 100 * v for k, v in values.items()})[1] == pytest.approx(factors)


@pytest.mark.parametrize("make, match", [
    (lambda: weighting_rule("ads", "softmax"), "temperature"),
    (lambda: weighting_rule("ads", "positive", 1.0), "temperature: only kind='softmax' reads it"),
    (lambda: weighting_rule("ads", "cubic"), "kind"),
    (lambda: value_weight_outcome({"rule": "drop-k"}, {"a": 1.0}), "weighting: expected a rule"),
    (lambda: value_weight_outcome(weighting_rule("ads"), {"a": math.nan}), "values: expected finite"),
    (lambda: ValueWeighting("tracin_outflow"), "score: expected one of"),
])
def test_bad_rules_name_the_parameter(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def run(tmp_path, utility, rounds: int = 3):
    grid = InProcessGrid(NODE_OF.values(), make_handler())
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, acceptance=ValueWeighting("ads"),
                               run_dir=str(tmp_path), sampler=PartitionSampler(5, seed=3),
                               valuation=ValuationSettings(methods=("ads",)))
    result = strategy.start(grid, initial_arrays(), num_rounds=rounds, timeout=10)
    return grid, result


def test_the_live_aggregate_is_the_mean_weighted_by_examples_times_factors(tmp_path, utility):
    grid, result = run(tmp_path, utility)
    ledger = load_run(tmp_path).ledger
    last = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN][-5:]
    start = arrays_to_numpy(last[0].content["arrays"])
    replies = {PID_OF[m.metadata.dst_node_id]: local_training(start, PID_OF[m.metadata.dst_node_id]) for m in last}
    round3 = ledger[ledger["round"] == 3]
    ads = round3[round3["method"] == "ads"].set_index("client_id")["value"]
    booked = round3[round3["method"] == "value_weight"].set_index("client_id")["value"]
    _, factors = value_weight_outcome(weighting_rule("ads"), ads.to_dict())
    assert booked.to_dict() == pytest.approx(factors)
    selected = round3[round3["method"] == "selected"].set_index("client_id")["value"]
    assert {c for c, v in selected.items() if v == 1.0} == {c for c, f in factors.items() if f > 0}
    assert 0 < (booked > 0).sum() < 5  # a round that both kept and left out replies
    kept = [int(c) for c, f in factors.items() if f > 0]
    expected = weighted_mean([replies[c][0] for c in kept], [replies[c][1] * factors[str(c)] if str(c) in factors
                                                             else replies[c][1] * factors[c] for c in kept])
    realized = arrays_to_numpy(result.arrays)
    for key, value in expected.items():
        np.testing.assert_allclose(realized[key], value, rtol=1e-6, atol=1e-7)
    report = audit_run(tmp_path, utility=utility)
    assert report.intact, report.problems + report.unverifiable


def test_an_aggregate_made_with_other_factors_than_the_rule_fails_the_audit(tmp_path, utility, monkeypatch):
    from strategies.hooks import value_weights

    def skewed(rule, values):
        accepted, factors = value_weight_outcome(rule, values)
        first = min(accepted, key=str)
        return accepted, {c: (3.0 * f if c == first else f) for c, f in factors.items()}

    monkeypatch.setattr(value_weights, "value_weight_outcome", skewed)  # the live aggregation only; the books keep the rule
    run(tmp_path, utility, rounds=2)
    report = audit_run(tmp_path, utility=utility)
    assert not report.intact
    assert any("utility_realized" in p or "not the aggregate" in p for p in report.problems), report.problems


def test_refused_where_the_books_could_not_follow(utility):
    with pytest.raises(ValueError, match="acceptance: ValueWeighting\\('ads'\\) multiplies FedAvg's weights"):
        ValuingStrategy(FedMedian(fraction_evaluate=0.0), utility, acceptance=ValueWeighting("ads"))
    with pytest.raises(ValueError, match="score: 'loo' needs the strategy's methods to include it"):
        ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, acceptance=ValueWeighting("loo"),
                        valuation=ValuationSettings(methods=("ads",)))
    with pytest.raises(ValueError, match="flows=False"):
        ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, acceptance=ValueWeighting("ads"),
                        books=BookSettings(flows=True))
