"""Online flagging: robust z-scores, patience, thresholds and the flagging rates, against known answers."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

from fedvalue.analysis.detection import RANDOM
from fedvalue.analysis.flagging import FlaggingRule, evaluate_flagging, flagging_rates, robust_z, summarize_flagging

from tests.fedvalue.analysis.test_detection import make_ledger


def test_robust_z_formula_and_fallbacks():
    values = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    np.testing.assert_allclose(robust_z(values), (values - 3.0) / (1.482602218505602 * 1.0))
    # MAD = 0: mean absolute deviation instead.
    np.testing.assert_allclose(robust_z([0.0, 0.0, 0.0, -1.0]), [0, 0, 0, -1 / (1.2533141373155001 * 0.25)])
    assert robust_z([2.0, 2.0, 2.0]).tolist() == [0.0, 0.0, 0.0]


def _round_rows(t, values, method="ads"):
    return [{"round": t, "client_id": c, "method": method, "value": v, "status": "ok"} for c, v in values.items()]


def test_consistently_lowest_client_is_flagged_after_patience_rounds_not_before():
    rule = FlaggingRule("ads", threshold=1.5, patience=3)
    typical = {"a": 0.10, "b": 0.11, "c": 0.12, "d": 0.13}
    assert rule.update(_round_rows(1, {**typical, "bad": -0.5})) == set()
    assert rule.update(_round_rows(2, {**typical, "bad": -0.4})) == set()
    # Round 3 does not sample 'bad': its streak is kept, not reset.
    assert rule.update(_round_rows(3, typical)) == set()
    assert rule.flagged == frozenset()
    assert rule.update(_round_rows(4, {**typical, "bad": -0.6})) == {"bad"}
    assert rule.flagged == {"bad"} and rule.flagged_at == {"bad": 4}
    assert rule.update(_round_rows(5, {**typical, "bad": -0.6})) == set()  # flags are permanent


def test_a_normal_round_resets_the_streak():
    rule = FlaggingRule("ads", threshold=1.5, patience=2)
    typical = {"a": 0.10, "b": 0.11, "c": 0.12, "d": 0.13}
    rule.update(_round_rows(1, {**typical, "bad": -0.5}))
    rule.update(_round_rows(2, {**typical, "bad": 0.115}))
    assert rule.update(_round_rows(3, {**typical, "bad": -0.5})) == set()
    assert rule.update(pd.DataFrame(_round_rows(4, {**typical, "bad": -0.5}))) == {"bad"}


def test_constant_ledger_flags_nobody_and_small_rounds_do_not_count():
    rule = FlaggingRule("ads", threshold=0.5, patience=1)
    for t in range(1, 6):
        assert rule.update(_round_rows(t, {c: 0.2 for c in "abcdef"})) == set()
    assert rule.flagged == frozenset()
    small = FlaggingRule("ads", threshold=0.5, patience=1, min_clients=3)
    assert small.update(_round_rows(1, {"a": 0.0, "b": 9.0})) == set()


def test_threshold_rule_uses_accumulated_value():
    rule = FlaggingRule("loo", kind="threshold", threshold=0.0, patience=2)
    assert rule.update(_round_rows(1, {"a": -0.1, "b": 0.3}, "loo")) == set()
    assert rule.update(_round_rows(2, {"a": 0.05, "b": -0.2}, "loo")) == {"a"}  # Φ_a = −0.05, Φ_b = 0.1
    assert rule.totals == pytest.approx({"a": -0.05, "b": 0.1})
    assert rule.update(_round_rows(3, {"b": -0.2}, "loo")) == set()  # Φ_b = −0.1: first round below
    assert rule.update(_round_rows(4, {"b": -0.01}, "loo")) == {"b"}


def test_evaluate_flagging_counts_false_positives_and_detections():
    typical = {"c1": 0.10, "c2": 0.11, "c3": 0.12, "c4": 0.13, "c5": 0.14}
    clean_run = make_ledger([dict(typical)] * 3, seed=0)
    noisy_run = make_ledger([{**typical, "n1": -0.5}, {**typical, "n1": -0.4}, {**typical, "n1": -0.3}], seed=1)
    ledger = pd.concat([clean_run, noisy_run], ignore_index=True)
    rule = FlaggingRule("ads", threshold=2.0, patience=2)
    per_run = evaluate_flagging(rule, ledger).set_index("seed")
    assert per_run.loc[0, "false_positive_rate"] == 0.0 and per_run.loc[0, "clean_run"]
    assert math.isnan(per_run.loc[0, "detection_rate"])
    assert per_run.loc[1, "detection_rate"] == 1.0 and per_run.loc[1, "mean_flag_round"] == 2.0
    assert per_run.loc[1, "false_positive_rate"] == 0.0
    summary = summarize_flagging(per_run.reset_index())
    assert summary == {"false_positive_rate": 0.0, "false_positive_rate_noisy_runs": 0.0, "detection_rate": 1.0,
                       "n_clean_runs": 1, "n_noisy_runs": 1}
    assert rule.flagged == frozenset()  # the template is untouched


def test_flagging_rates_measure_false_positives_on_clean_runs_and_detection_on_noisy_runs():
    # Two clean runs: in run 0 client c6 is an outlier of its round (a false positive for a
    # strict rule), in run 1 nobody is. One noisy run: n1 is far below, n2 is typical.
    typical = {"c1": 0.10, "c2": 0.11, "c3": 0.12, "c4": 0.13, "c5": 0.14}
    clean = pd.concat([make_ledger([{**typical, "c6": -0.5}], seed=0), make_ledger([typical], seed=1)],
                      ignore_index=True)
    noisy = make_ledger([{**typical, "n1": -0.5, "n2": 0.12}], seed=2)
    strict = FlaggingRule("ads", threshold=2.0, patience=1)
    never = FlaggingRule("ads", threshold=2.0, patience=2)  # one valued round each: cannot fire
    rates = flagging_rates([strict, never], [noisy, clean]).set_index("patience")
    assert rates.loc[1, "n_clean_runs"] == 2 and rates.loc[1, "n_noisy_runs"] == 1
    assert rates.loc[1, "false_positive_rate"] == pytest.approx((1 / 6 + 0) / 2)
    # interval over the two clean runs: mean ± z·sd/√2
    half = NormalDist().inv_cdf(0.975) * np.std([1 / 6, 0.0], ddof=1) / math.sqrt(2)
    assert rates.loc[1, "false_positive_rate_ci_high"] == pytest.approx(1 / 12 + half)
    assert rates.loc[1, "detection_rate"] == 0.5 and rates.loc[1, "false_positive_rate_noisy_runs"] == 0.0
    assert rates.loc[1, "mean_flag_round"] == 1.0
    assert math.isnan(rates.loc[1, "detection_rate_ci_low"])  # one noisy run: no interval
    assert rates.loc[2, "false_positive_rate"] == 0.0 and rates.loc[2, "detection_rate"] == 0.0
    assert list(rates[["method", "kind", "threshold"]].iloc[0]) == ["ads", "robust_z", 2.0]
    only_noisy = flagging_rates(strict, noisy).iloc[0]
    assert only_noisy["n_clean_runs"] == 0 and math.isnan(only_noisy["false_positive_rate"])
    with pytest.raises(TypeError, match="rules: expected a FlaggingRule or a non-empty list"):
        flagging_rates([], noisy)
    with pytest.raises(ValueError, match="ledgers: expected at least one ledger"):
        flagging_rates(strict, [])


def test_bad_flagging_rules_and_rounds():
    with pytest.raises(ValueError, match="^kind:"):
        FlaggingRule("ads", kind="zscore")
    with pytest.raises(ValueError, match="^threshold:"):
        FlaggingRule("ads", threshold=-1.0)
    with pytest.raises(ValueError, match="^patience:"):
        FlaggingRule("ads", patience=0)
    with pytest.raises(ValueError, match="^method:"):
        FlaggingRule(RANDOM)
    rule = FlaggingRule("ads")
    with pytest.raises(ValueError, match=r"^round_frame: expected the rows of one round"):
        rule.update(_round_rows(1, {"a": 0.0}) + _round_rows(2, {"a": 0.0}))
    with pytest.raises(ValueError, match=r"^round_frame: expected columns"):
        rule.update([{"round": 1, "client_id": "a"}])
    with pytest.raises(ValueError, match=r"^method: expected 'ads'"):
        rule.update(_round_rows(1, {"a": 0.0}, "loo"))
    rule.update(_round_rows(2, {"a": 0.0, "b": 1.0, "c": 2.0}))
    with pytest.raises(ValueError, match=r"^round_frame\['round'\]"):
        rule.update(_round_rows(2, {"a": 0.0, "b": 1.0, "c": 2.0}))
    with pytest.raises(TypeError, match="^rule:"):
        evaluate_flagging("ads", make_ledger([{"n1": 0.0}]))
