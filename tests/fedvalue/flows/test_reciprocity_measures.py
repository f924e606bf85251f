"""Reciprocity figures ([RECIP] Def. 2.1, §2.2, §5) against hand-made answers and scipy."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedvalue.flows.reciprocity_measures import (
    ReciprocityReport,
    alpha_at,
    alpha_curve,
    reciprocity,
    reciprocity_over_rounds,
    reciprocity_ratio,
)


def test_ratio_hand_made_with_signs_and_zeros():
    inflow = [1.0, 2.0, -1.0, 3.0, 0.0, 0.0, 1.0, -4.0]
    outflow = [1.0, 1.0, -2.0, -3.0, 0.0, 2.0, 0.0, -1.0]
    # equal, 1/2, both negative 1/2, signs differ, 0/0 balanced, one zero, one zero, both negative 1/4
    expected = [1.0, 0.5, 0.5, 0.0, 1.0, 0.0, 0.0, 0.25]
    np.testing.assert_allclose(reciprocity_ratio(inflow, outflow), expected)


def test_ratio_tiny_same_sign_values_do_not_underflow_to_zero():
    # The product 1e-200 * 1e-200 underflows to 0; the ratio must still be 1/2.
    np.testing.assert_allclose(reciprocity_ratio([1e-200], [2e-200]), [0.5])


@pytest.mark.parametrize(
    ("p", "alpha"),
    [(0.0, 1.0), (0.25, 1.0), (0.26, 0.9), (0.5, 0.9), (0.75, 0.8), (0.76, 0.5), (1.0, 0.5)],
)
def test_alpha_at_known_values(p, alpha):
    assert alpha_at([0.5, 1.0, 0.8, 0.9], p) == alpha


def test_alpha_at_rounding_of_p_times_n():
    # 0.7 * 10 = 7.000000000000001 in floats: 7 of 10 individuals are a fraction 0.7.
    ratios = np.linspace(1.0, 0.1, 10)
    assert alpha_at(ratios, 0.7) == pytest.approx(ratios[6])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=30),
    st.floats(0.0, 1.0, allow_nan=False),
)
def test_alpha_is_the_largest_alpha_with_fraction_p(ratios, p):
    r = np.array(ratios)
    alpha = alpha_at(r, p)
    assert np.mean(r >= alpha) >= p - 1e-9
    larger = r[r > alpha]
    if p > 0 and len(larger):  # the next larger candidate covers too few
        assert np.mean(r >= larger.min()) < p - 1e-9


def test_alpha_curve_is_non_increasing():
    curve = alpha_curve(np.random.default_rng(0).uniform(size=50))
    assert list(curve.columns) == ["p", "alpha"]
    assert np.all(np.diff(curve["alpha"].to_numpy()) <= 0)
    assert curve["alpha"].iloc[0] == 1.0


def test_report_correlations_match_scipy_and_pandas():
    rng = np.random.default_rng(3)
    inflow = rng.normal(size=40)
    outflow = 0.5 * inflow + rng.normal(scale=0.5, size=40)
    outflow[:5] = outflow[5]  # ties for Spearman
    report = reciprocity(inflow, outflow)
    assert report.pearson == pytest.approx(stats.pearsonr(inflow, outflow)[0], abs=1e-12)
    assert report.spearman == pytest.approx(stats.spearmanr(inflow, outflow)[0], abs=1e-12)
    assert report.spearman == pytest.approx(pd.Series(inflow).corr(pd.Series(outflow), method="spearman"), abs=1e-12)


def test_report_figures_on_hand_made_flows():
    inflow = pd.Series([1.0, 2.0, -1.0, 3.0], index=["a", "b", "c", "d"])
    outflow = pd.Series([-3.0, 1.0, 1.0, -2.0], index=["d", "a", "b", "c"])  # aligned on the index
    report = reciprocity(inflow, outflow, p=0.5)
    np.testing.assert_allclose(report.ratio.loc[["a", "b", "c", "d"]], [1.0, 0.5, 0.5, 0.0])
    assert report.alpha == 0.5
    assert report.negative_inflow_share == 0.25
    assert report.negative_outflow_share == 0.5
    assert report.num_individuals == 4
    assert set(report.to_dict()) == {"p", "alpha", "pearson", "spearman", "negative_inflow_share",
                                     "negative_outflow_share", "mean_ratio", "median_ratio", "num_individuals"}
    assert report.to_frame().shape == (1, 9)
    per = report.per_individual()
    assert per.loc["d", "balance"] == pytest.approx(3.0 - (-3.0))
    assert isinstance(report, ReciprocityReport)


def test_constant_flows_give_nan_correlation():
    report = reciprocity([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])
    assert math.isnan(report.pearson) and math.isnan(report.spearman)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(inflow=[1.0, 2.0], outflow=[1.0]), "outflow"),
        (dict(inflow=[1.0, np.nan], outflow=[1.0, 2.0]), "inflow"),
        (dict(inflow=[1.0, 2.0], outflow=[1.0, np.inf]), "outflow"),
        (dict(inflow=[[1.0]], outflow=[1.0]), "inflow"),
        (dict(inflow=[1.0], outflow=[1.0], p=1.5), "p"),
        (dict(inflow=pd.Series([1.0], index=["a"]), outflow=pd.Series([1.0], index=["b"])), "outflow"),
    ],
)
def test_bad_inputs_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        reciprocity(**kwargs)


def test_alpha_at_rejects_ratios_outside_unit_interval():
    with pytest.raises(ValueError, match="^ratios:"):
        alpha_at([1.5])


def test_over_rounds_uses_cumulative_flows_and_seen_clients():
    rounds = pd.DataFrame({
        "round": [1, 1, 2, 2, 2],
        "client": ["a", "b", "a", "b", "c"],
        "inflow": [1.0, 1.0, 1.0, 3.0, 2.0],
        "outflow": [2.0, 1.0, 0.0, 1.0, 1.0],
    })
    frame = reciprocity_over_rounds(rounds, p=1.0)
    assert list(frame["round"]) == [1, 2]
    assert list(frame["num_individuals"]) == [2, 3]  # c appears in round 2 only
    # round 1: a 1/2, b 1 -> alpha(1) = 0.5; round 2: a 2/2, b 2/4, c 1/2 -> 0.5
    assert frame["alpha"].tolist() == [0.5, 0.5]
    assert frame.loc[1, "mean_ratio"] == pytest.approx((1.0 + 0.5 + 0.5) / 3)
    final = reciprocity([2.0, 4.0, 2.0], [2.0, 2.0, 1.0], p=1.0)
    assert frame.iloc[-1]["pearson"] == pytest.approx(final.pearson)


def test_over_rounds_bad_frame():
    with pytest.raises(ValueError, match="^rounds:"):
        reciprocity_over_rounds(pd.DataFrame({"round": [1]}))
    with pytest.raises(TypeError, match="^rounds:"):
        reciprocity_over_rounds([1, 2])
