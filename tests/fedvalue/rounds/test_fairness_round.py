"""A round's fairness books: book_round's fairness rows against hand-computed ones, and the
rules the audit re-derives."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from fedvalue.valuation.settings import AdsSettings
from fedvalue.run.archive import RoundRecord
from fedvalue.rounds.booking import ClientEntry, book_round
from fedvalue.rounds.fairness_round import FairnessPlugin, RoundFairness, policy_outcome
from fedvalue.scoring.fairness.objectives import GroupFairness, client_fairness_influences
from fedvalue.valuation.round_game import fedavg_round_game, round_rng, value_round, weighted_mean
from fedvalue.run.settings import RoundSettings


@pytest.fixture(scope="module")
def objective():
    rng = np.random.default_rng(0)
    z = rng.integers(0, 2, 150)
    y = rng.integers(0, 2, 150)
    x = np.column_stack([rng.normal(y + 0.5 * z), z])
    torch.manual_seed(0)
    return GroupFairness(torch.nn.Linear(2, 2), x, y, z, gap="dp")


START = {"weight": np.array([[0.1, -0.2], [0.0, 0.3]]), "bias": np.array([0.0, 0.1])}


def shifted(a, b, c, d):
    return {"weight": START["weight"] + np.array([[a, b], [c, d]]), "bias": START["bias"] + np.array([a, -a])}


REPLIES = {"a": shifted(0.5, 0.1, -0.4, 0.0), "b": shifted(-0.3, 0.6, 0.2, -0.5),
           "c": shifted(0.2, -0.7, 0.1, 0.9), "r": shifted(1.0, 1.0, 1.0, 1.0)}
ENTRIES = [ClientEntry("a", "ok", 2.0, 2), ClientEntry("b", "ok", 5.0, 5), ClientEntry("c", "ok", 3.0, 3),
           ClientEntry("r", "rejected", 4.0, 4, "non-finite values"), ClientEntry("f", "failed", None, None, "crashed")]
OK = ["a", "b", "c"]


def bias_utility(arrays) -> float:
    return float(arrays["bias"][0])


def accuracy_valuation():
    return value_round(fedavg_round_game(OK, START, [REPLIES[c] for c in OK], [2.0, 5.0, 3.0], bias_utility),
                       ("ads", "loo"))


def round_record(accepted) -> RoundRecord:
    weighed = {e.client_id for e in ENTRIES if e.status in ("ok", "rejected")}
    return RoundRecord(round=1, start_arrays=START, entries=list(ENTRIES),
                       replies={c: a for c, a in REPLIES.items() if c in weighed}, accepted=sorted(accepted),
                       settings=RoundSettings(methods=("ads", "loo")))


def books_of(objective, rule=None, accepted=frozenset(OK)):
    fair = FairnessPlugin(objective).value(OK, START, [REPLIES[c] for c in OK], [2.0, 5.0, 3.0], methods=("ads", "loo"),
                                           settings=AdsSettings(method="exact"), seed=round_rng(0, 1))
    factors = None
    if rule is not None:
        accepted, factors = policy_outcome(rule, fair.influences)
        fair = RoundFairness(fair.valuation, fair.influences, fair.utility, factors)
    return fair, book_round(round_record(accepted), accuracy_valuation(), bias_utility, realized=None, inputs={"fairness": fair})


def test_fairness_rows_hold_values_influences_harms_and_reasons(objective):
    fair, books = books_of(objective)
    rows = {(r.client_id, r.method): r for r in books.ledger_rows}
    assert [m for c, m in rows if c == "a"] == ["ads", "loo", "ads_fairness", "loo_fairness", "fairness_influence"]
    values = {c: rows[c, "ads_fairness"].value for c in OK}
    # Group efficiency of the fairness game: Σ φ = U(A_t) − U(A_{t−1}) with U = −gap.
    realized = weighted_mean([REPLIES[c] for c in OK], [2.0, 5.0, 3.0])
    assert sum(values.values()) == pytest.approx(objective(realized) - objective(START), abs=1e-12)
    full = objective(realized)
    assert rows["b", "loo_fairness"].value == pytest.approx(
        full - objective(weighted_mean([REPLIES["a"], REPLIES["c"]], [2.0, 3.0])), abs=1e-12)
    influences = client_fairness_influences(objective.gradient(START), START, {c: REPLIES[c] for c in OK},
                                            {"a": 2.0, "b": 5.0, "c": 3.0})
    assert {c: rows[c, "fairness_influence"].value for c in OK} == pytest.approx(influences, rel=1e-12)
    # The rejected reply: the harm it would have done to the accepted aggregate, on fairness.
    harm = objective(weighted_mean([REPLIES[c] for c in OK + ["r"]], [2.0, 5.0, 3.0, 4.0])) - full
    assert rows["r", "ads_fairness"].value == pytest.approx(harm, abs=1e-12)
    assert rows["r", "fairness_influence"].value is None
    assert rows["r", "ads_fairness"].reason == "non-finite values"
    assert rows["f", "loo_fairness"].value is None and rows["f", "fairness_influence"].reason == "crashed"
    assert ("a", "fair_weight") not in rows


def test_ijack_books_its_factors_and_drop_k_its_choice(objective):
    fair, books = books_of(objective, {"rule": "ijack", "lam": 20.0})
    weights = {r.client_id: r.value for r in books.ledger_rows if r.method == "fair_weight"}
    raw = {c: max(0.0, 1.0 - 20.0 * fair.influences[c]) for c in OK}
    assert {c: weights[c] for c in OK} == pytest.approx({c: 3 * raw[c] / sum(raw.values()) for c in OK})
    assert weights["r"] is None and weights["f"] is None
    accepted, factors = policy_outcome({"rule": "drop-k", "k": 1}, fair.influences)
    worst = max(OK, key=fair.influences.get)
    assert factors is None
    assert accepted == ({c for c in OK if c != worst} if fair.influences[worst] > 0 else set(OK))


def test_books_without_fairness_are_the_books_with_it_minus_its_rows(objective):
    _, with_fairness = books_of(objective)
    plain = book_round(round_record(set(OK)), accuracy_valuation(), bias_utility, realized=None)
    kept = [r for r in with_fairness.ledger_rows
            if r.method not in ("ads_fairness", "loo_fairness", "fairness_influence")]
    assert kept == plain.ledger_rows
    assert replace(with_fairness.round_row, valuation_seconds=0.0) == replace(plain.round_row, valuation_seconds=0.0)
