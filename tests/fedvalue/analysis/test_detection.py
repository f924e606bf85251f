"""Noisy-client detection: curves, AUC and precision@k against known answers."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score

from fedvalue.analysis.detection import (
    RANDOM,
    accumulated_scores,
    detection_curve,
    detection_metrics,
    expected_hits,
    precision_at_k,
    rank_clients,
    rank_rounds,
    roc_auc,
    round_detection_curves,
    summarize_metrics,
)


def make_ledger(rounds, *, methods=("ads",), seed=None, failed=()):
    """rounds: list of {client_id: value or (value per method...)}; noisy ids start with 'n'."""
    rows = []
    for t, clients in enumerate(rounds, start=1):
        for client_id, value in clients.items():
            values = value if isinstance(value, tuple) else (value,) * len(methods)
            for method, v in zip(methods, values):
                status = "failed" if (t, client_id) in failed else "ok"
                rows.append({"round": t, "client_id": client_id, "method": method,
                             "value": math.nan if status == "failed" else float(v), "status": status,
                             "noisy": client_id.startswith("n")})
    frame = pd.DataFrame(rows)
    frame["noisy"] = frame["noisy"].astype("boolean")
    if seed is not None:
        frame.insert(0, "seed", seed)
    return frame


def curve_values(frame, method="ads"):
    return frame[frame["method"] == method].sort_values("j")["mean"].to_numpy()


# ----------------------------------------------------------------------------- curve


def test_perfect_ranking_reaches_one_at_number_of_noisy():
    ledger = make_ledger([{"n1": -2.0, "n2": -1.0, "c1": 0.5, "c2": 1.0, "c3": 2.0, "c4": 3.0}])
    recall = detection_curve(ledger, "ads")
    np.testing.assert_allclose(curve_values(recall), [0.5, 1, 1, 1, 1, 1])
    precision = detection_curve(ledger, "ads", metric="precision")
    np.testing.assert_allclose(curve_values(precision), [1, 1, 2 / 3, 1 / 2, 2 / 5, 1 / 3])
    assert recall["n_runs"].eq(1).all() and recall["ci_low"].isna().all()


def test_reversed_ranking_finds_noisy_last():
    ledger = make_ledger([{"n1": 5.0, "n2": 4.0, "c1": 0.5, "c2": 1.0, "c3": 2.0, "c4": 3.0}])
    np.testing.assert_allclose(curve_values(detection_curve(ledger, "ads")), [0, 0, 0, 0, 0.5, 1])


def test_constant_scores_with_averaged_ties_give_the_hypergeometric_mean():
    # E[H(j)] = j·K/n for a uniformly random order: recall j/n, precision K/n.
    ledger = make_ledger([{"n1": 0.0, "n2": 0.0, "c1": 0.0, "c2": 0.0, "c3": 0.0}])
    np.testing.assert_allclose(curve_values(detection_curve(ledger, "ads")), np.arange(1, 6) / 5)
    np.testing.assert_allclose(curve_values(detection_curve(ledger, "ads", metric="precision")), [0.4] * 5)
    # Client-id tie breaking is deterministic instead: c1, c2, c3, n1, n2.
    np.testing.assert_allclose(curve_values(detection_curve(ledger, "ads", ties="client_id")),
                               [0, 0, 0, 0.5, 1])


def test_random_baseline_matches_hypergeometric_mean_over_many_seeds():
    clients = {"n1": 1.0, "n2": 2.0, "c1": 3.0, "c2": 4.0, "c3": 5.0, "c4": 6.0}
    ledger = pd.concat([make_ledger([clients, clients], seed=s) for s in range(300)], ignore_index=True)
    curve = detection_curve(ledger, RANDOM, seed=7)
    assert curve["n_runs"].eq(300).all() and curve["n_rounds"].eq(600).all()
    expected = np.arange(1, 7) / 6
    mean = curve_values(curve, RANDOM)
    half_width = (curve["ci_high"] - curve["ci_low"]).to_numpy() / 2
    assert np.all(np.abs(mean - expected) <= 2 * half_width + 1e-12)  # ~4 standard errors
    np.testing.assert_allclose(mean[-1], 1.0)
    again = detection_curve(ledger, RANDOM, seed=7)
    pd.testing.assert_frame_equal(curve, again)
    assert not curve_values(detection_curve(ledger, RANDOM, seed=8), RANDOM).tolist() == mean.tolist()


def test_partial_tie_block_counts_its_expected_share():
    # Sorted: a(0) | n1, b, c tied at 1 | n2(2). H(2) = 0 + 1·(1/3).
    hits = expected_hits([1.0, 0.0, 1.0, 1.0, 2.0], [True, False, False, False, True])
    np.testing.assert_allclose(hits, [0, 1 / 3, 2 / 3, 1, 2])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=6))
def test_averaged_ties_equal_brute_force_over_all_orderings(items):
    values = np.array([v for v, _ in items], float)
    labels = np.array([lab for _, lab in items])
    total, count = np.zeros(len(items)), 0
    for perm in itertools.permutations(range(len(items))):
        if np.all(np.diff(values[list(perm)]) >= 0):
            total += np.cumsum(labels[list(perm)])
            count += 1
    np.testing.assert_allclose(expected_hits(values, labels), total / count, atol=1e-12)


def test_curve_averages_rounds_then_runs_with_interval_over_runs():
    perfect = {"n1": 0.0, "c1": 1.0, "c2": 2.0}
    reversed_ = {"n1": 3.0, "c1": 1.0, "c2": 2.0}
    clean = {"c1": 0.0, "c2": 1.0, "c3": 2.0}  # no noisy client: not counted
    run0 = make_ledger([perfect, reversed_, clean], seed=0)  # per-run mean [1/2, 1/2, 1]
    run1 = make_ledger([perfect, perfect], seed=1)  # [1, 1, 1]
    curve = detection_curve(pd.concat([run0, run1]), "ads")
    np.testing.assert_allclose(curve_values(curve), [0.75, 0.75, 1.0])
    z = NormalDist().inv_cdf(0.975)
    half = z * np.std([0.5, 1.0], ddof=1) / math.sqrt(2)
    np.testing.assert_allclose(curve["ci_low"].to_numpy()[:2], 0.75 - half)
    np.testing.assert_allclose(curve["ci_high"].to_numpy()[:2], 0.75 + half)
    assert curve["n_rounds"].tolist() == [4, 4, 4]
    pooled = detection_curve(pd.concat([run0, run1]), "ads", ci_over="round")
    np.testing.assert_allclose(curve_values(pooled), [0.75, 0.75, 1.0])  # (1 + 0 + 1 + 1) / 4


def test_rounds_of_different_sizes_keep_their_last_value_and_failed_clients_are_not_ranked():
    ledger = make_ledger([{"c1": 0.0, "n1": 1.0, "c2": 2.0, "c3": 9.0},
                          {"n1": 0.0, "c1": 1.0, "c2": 2.0, "c3": -5.0}], failed={(2, "c3")})
    per_round = round_detection_curves(ledger, "ads", metric="precision")
    assert per_round.groupby("round")["n"].first().tolist() == [4, 3]
    curve = detection_curve(ledger, "ads", metric="precision")
    # Round 1: [0, 1/2, 1/3, 1/4]; round 2: [1, 1/2, 1/3] then 1/3 at j = 4.
    np.testing.assert_allclose(curve_values(curve), [0.5, 0.5, 1 / 3, (1 / 4 + 1 / 3) / 2])
    assert curve["n_rounds"].tolist() == [2, 2, 2, 1]


def test_rejected_and_idle_rows_as_the_ledger_writer_books_them_are_accepted_and_not_ranked():
    """Every status the writer produces (fedvalue.schema) is accepted; only 'ok' rows are ranked."""
    from fedvalue.schema import CLIENT_STATUSES

    ledger = make_ledger([{"c1": 0.0, "n1": 1.0, "c2": 2.0, "c3": 9.0},
                          {"n1": 0.0, "c1": 1.0, "c2": 2.0, "c3": -5.0}], failed={(2, "c3")})
    rejected = ledger.assign(status=ledger["status"].replace("failed", "rejected"))
    idle = pd.DataFrame([{"round": 2, "client_id": "c9", "method": "ads", "value": 0.5, "status": "idle",
                          "noisy": False}]).astype({"noisy": "boolean"})
    assert set(pd.concat([rejected, idle])["status"]) | {"failed"} == set(CLIENT_STATUSES)
    expected = detection_curve(ledger, "ads", metric="precision")
    pd.testing.assert_frame_equal(detection_curve(pd.concat([rejected, idle], ignore_index=True), "ads",
                                                  metric="precision"), expected)


def test_several_methods_share_one_frame():
    ledger = make_ledger([{"n1": (0.0, 5.0), "c1": (1.0, 1.0), "c2": (2.0, 2.0)}], methods=("ads", "loo"))
    curve = detection_curve(ledger, ["ads", "loo", RANDOM])
    assert list(dict.fromkeys(curve["method"])) == ["ads", "loo", RANDOM]
    np.testing.assert_allclose(curve_values(curve, "ads"), [1, 1, 1])
    np.testing.assert_allclose(curve_values(curve, "loo"), [0, 0, 1])


# ----------------------------------------------------------------------------- AUC, precision@k


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.booleans()), min_size=2, max_size=30)
       .filter(lambda xs: 0 < sum(lab for _, lab in xs) < len(xs)))
def test_auc_equals_sklearn_with_ties(items):
    scores = np.array([s for s, _ in items], float) / 2
    noisy = np.array([lab for _, lab in items])
    assert roc_auc(scores, noisy) == pytest.approx(roc_auc_score(noisy, -scores), abs=1e-12)


def test_auc_hand_cases():
    assert roc_auc([0.0, 1.0, 2.0], [True, False, False]) == 1.0
    assert roc_auc([3.0, 1.0, 2.0], [True, False, False]) == 0.0
    assert roc_auc([1.0, 1.0, 2.0], [True, False, False]) == 0.75  # one tie counts 1/2
    with pytest.raises(ValueError, match="noisy"):
        roc_auc([1.0, 2.0], [False, False])


def test_precision_at_k_hand_cases():
    scores = [0.0, 1.0, 2.0, 3.0, 4.0]
    assert precision_at_k(scores, [True, True, False, False, False]) == 1.0
    assert precision_at_k(scores, [True, False, True, False, False]) == 0.5
    assert precision_at_k(scores, [False, False, False, True, True]) == 0.0
    assert precision_at_k(scores, [True, False, True, False, False], k=3) == pytest.approx(2 / 3)
    # A tie across the cut: one of {b, c} is taken, half the time the noisy one.
    assert precision_at_k([0.0, 1.0, 1.0], [True, True, False]) == 0.75
    assert precision_at_k([0.0, 1.0, 1.0], [True, True, False], ties="client_id",
                          client_ids=["a", "c", "b"]) == 0.5
    with pytest.raises(ValueError, match="^k:"):
        precision_at_k(scores, [True] * 5, k=6)


def test_detection_metrics_use_accumulated_scores_per_run():
    # n1 is low in total (−1 + 0.5) although not lowest in round 2.
    run0 = make_ledger([{"n1": -1.0, "c1": 0.2, "c2": 0.3}, {"n1": 0.5, "c1": 0.1, "c3": 0.4}], seed=0)
    run1 = make_ledger([{"n1": 1.0, "c1": 0.2, "n2": 0.3}], seed=1)
    ledger = pd.concat([run0, run1], ignore_index=True)
    scores = accumulated_scores(ledger, "ads")
    assert scores.loc[(scores["seed"] == 0) & (scores["client_id"] == "n1"), "score"].item() == pytest.approx(-0.5)
    assert scores.loc[(scores["seed"] == 0) & (scores["client_id"] == "c1"), "rounds"].item() == 2
    per_run = detection_metrics(ledger, ["ads", RANDOM], seed=3)
    ads = per_run[per_run["method"] == "ads"].set_index("seed")
    assert ads.loc[0, "auc"] == 1.0 and ads.loc[0, "precision_at_k"] == 1.0
    assert ads.loc[1, "auc"] == 0.0 and ads.loc[1, "precision_at_k"] == 0.5  # ranks: c1, n2 | n1
    assert ads.loc[0, "n_clients"] == 4 and ads.loc[1, "n_noisy"] == 2
    summary = summarize_metrics(per_run).set_index("method")
    assert summary.loc["ads", "auc_mean"] == 0.5 and summary.loc["ads", "n_runs"] == 2
    assert summary.loc["ads", "precision_at_k_mean"] == 0.75
    np.testing.assert_allclose(summary.loc["ads", "auc_ci_high"] - 0.5,
                               NormalDist().inv_cdf(0.975) * np.std([1, 0], ddof=1) / math.sqrt(2))
    pd.testing.assert_frame_equal(per_run, detection_metrics(ledger, ["ads", RANDOM], seed=3))


def test_rankings_lowest_first_with_client_id_ties():
    ledger = make_ledger([{"10": 0.0, "2": 0.0, "n1": -1.0}, {"2": 1.0, "n1": -3.0}])
    rounds = rank_rounds(ledger, "ads")
    first = rounds[rounds["round"] == 1]
    assert first["client_id"].tolist() == ["n1", "2", "10"]  # numeric ids numerically
    assert first["rank"].tolist() == [1, 2, 3] and first["mid_rank"].tolist() == [1.0, 2.5, 2.5]
    overall = rank_clients(ledger, "ads")
    assert overall["client_id"].tolist() == ["n1", "10", "2"]
    assert overall["score"].tolist() == [-4.0, 0.0, 1.0] and overall["rounds"].tolist() == [2, 1, 2]
    randomized = rank_rounds(ledger, RANDOM, seed=1)
    pd.testing.assert_frame_equal(randomized, rank_rounds(ledger, RANDOM, seed=1))
    assert sorted(randomized.loc[randomized["round"] == 1, "rank"]) == [1, 2, 3]


# ----------------------------------------------------------------------------- bad input


def test_bad_ledgers_name_the_problem():
    ledger = make_ledger([{"n1": 0.0, "c1": 1.0}])
    with pytest.raises(ValueError, match=r"^ledger: expected columns .*missing \['noisy'\]"):
        detection_curve(ledger.drop(columns="noisy"), "ads")
    with pytest.raises(TypeError, match="^ledger:"):
        detection_curve(ledger.to_dict("records"), "ads")
    with pytest.raises(ValueError, match=r"^methods: .*got 'shapley'"):
        detection_curve(ledger, ["ads", "shapley"])
    with pytest.raises(ValueError, match=r"^method: .*got 'shapley'"):
        rank_rounds(ledger, "shapley")
    with pytest.raises(ValueError, match="no rounds|at least one round with a noisy client"):
        detection_curve(make_ledger([{"c1": 0.0, "c2": 1.0}]), "ads")
    with pytest.raises(ValueError, match="^metric:"):
        detection_curve(ledger, "ads", metric="f1")
    with pytest.raises(ValueError, match="^ties:"):
        detection_curve(ledger, "ads", ties="random")
    with pytest.raises(ValueError, match="^confidence:"):
        detection_curve(ledger, "ads", confidence=95)
    unknown = ledger.assign(noisy=pd.array([pd.NA, pd.NA], dtype="boolean"))
    with pytest.raises(ValueError, match=r"^ledger\['noisy'\]"):
        detection_curve(unknown, "ads")
    nan_ok = ledger.assign(value=[math.nan, 1.0])
    with pytest.raises(ValueError, match=r"^ledger\['value'\]"):
        detection_curve(nan_ok, "ads")
    with pytest.raises(ValueError, match=r"^ledger\['status'\]"):
        detection_curve(ledger.assign(status=["ok", "skipped"]), "ads")
    with pytest.raises(ValueError, match="both noisy and clean"):
        detection_metrics(make_ledger([{"c1": 0.0, "c2": 1.0}]), "ads")
