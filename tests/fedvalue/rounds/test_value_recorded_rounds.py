"""Every saved round valued again under another utility (:func:`fedvalue.ledger.value_recorded_rounds`), against
the round game worked out by hand: two clients, FedAvg's weighted mean renormalized over each coalition, a linear
utility, so exact ADS is the two-player Shapley value of four numbers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedvalue.ledger import value_recorded_rounds
from fedvalue.run.archive import RoundRecord, write_round_record
from fedvalue.run.settings import RoundSettings
from fedvalue.schema import ClientEntry
from fedvalue.valuation.settings import AdsSettings

START = {"w": np.array([1.0, -2.0])}
REPLIES = {"a": {"w": np.array([3.0, -2.0])}, "b": {"w": np.array([1.0, 4.0])}}
WEIGHTS = {"a": 1.0, "b": 3.0}


def record(server_round: int, aggregation: str = "weighted-mean") -> RoundRecord:
    return RoundRecord(round=server_round, start_arrays=START,
                       entries=[ClientEntry(c, "ok", WEIGHTS[c], int(WEIGHTS[c])) for c in REPLIES],
                       replies=REPLIES, accepted=list(REPLIES),
                       settings=RoundSettings(methods=("ads", "loo"), valuation=AdsSettings(method="exact"), seed=7,
                                              strategy="FedAvg", aggregation=aggregation))


def by_hand(utility) -> dict[str, float]:
    """v(∅) = U(A), v({a}) = U(w_a), v({b}) = U(w_b), v({a, b}) = U((1 w_a + 3 w_b) / 4); Shapley of two players."""
    empty, a, b = utility(START), utility(REPLIES["a"]), utility(REPLIES["b"])
    both = utility({"w": (WEIGHTS["a"] * REPLIES["a"]["w"] + WEIGHTS["b"] * REPLIES["b"]["w"]) / 4.0})
    return {"a": ((a - empty) + (both - b)) / 2, "b": ((b - empty) + (both - a)) / 2}


@pytest.mark.parametrize("direction", [(1.0, 0.0), (0.5, -2.0)])
def test_each_round_is_the_hand_worked_game_under_the_new_utility(tmp_path, direction):
    for t in (1, 2):
        write_round_record(tmp_path, record(t))
    utility = lambda arrays: float(np.dot(direction, arrays["w"]))  # noqa: E731 - a linear U, by hand
    valued = value_recorded_rounds(tmp_path, utility)
    assert sorted(valued) == [1, 2]
    for valuation in valued.values():
        assert valuation.results["ads"].values.to_dict() == pytest.approx(by_hand(utility), abs=1e-12)
        assert valuation.utility_before == pytest.approx(utility(START))


def test_a_round_aggregated_by_its_strategy_needs_that_aggregation(tmp_path):
    write_round_record(tmp_path, record(1, aggregation="strategy"))
    with pytest.raises(ValueError, match=r"^aggregate: round 1 of .* was aggregated by its strategy's own code"):
        value_recorded_rounds(tmp_path, lambda arrays: 0.0)


def test_a_round_without_a_valid_reply_is_left_out(tmp_path):
    empty = dataclasses.replace(record(1), entries=[ClientEntry("a", "failed", None, None, "crashed")], replies={},
                                accepted=[])
    write_round_record(tmp_path, empty)
    write_round_record(tmp_path, record(2))
    assert sorted(value_recorded_rounds(tmp_path, lambda arrays: float(arrays["w"].sum()))) == [2]


class LinearUtility:
    """U(x) = c·x with its gradient c and Hessian 0: a differentiable U the expansions take."""

    differentiable = True
    c = np.array([0.5, -2.0])

    def __call__(self, arrays) -> float:
        return float(self.c @ arrays["w"])

    def gradient(self, arrays) -> dict:
        return {"w": self.c.copy()}

    def hessian_vector_product(self, arrays, vector) -> dict:
        return {"w": np.zeros(2)}


def test_another_coalition_rule_and_estimator_value_the_same_rounds(tmp_path):
    """rule="fixed-weight": v({k}) = U(A + p_k Δ_k), p = (1/4, 3/4), worked by hand; the estimator asked for is the one
    booked (the linear game is its own second-order expansion, so it gives the same numbers)."""
    write_round_record(tmp_path, record(1))
    utility = LinearUtility()
    fixed = {c: utility({"w": START["w"] + WEIGHTS[c] / 4.0 * (REPLIES[c]["w"] - START["w"])}) - utility(START)
             for c in REPLIES}  # additive: each client's Shapley value is its own step's
    for estimator, method in ((None, "ads-exact"), (AdsSettings(method="second-order"), "ads-second-order")):
        (valuation,) = value_recorded_rounds(tmp_path, utility, rule="fixed-weight", estimator=estimator).values()
        assert valuation.results["ads"].method == method
        assert valuation.results["ads"].values.to_dict() == pytest.approx(fixed, abs=1e-12)
    assert value_recorded_rounds(tmp_path, utility)[1].results["ads"].values.to_dict() != pytest.approx(fixed)
