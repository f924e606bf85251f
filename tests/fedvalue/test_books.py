"""book_round against hand-computed books of a small round: every status, selection marks,
harms of rejected replies and TracIn flows, on a utility with a closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedvalue.books import ClientEntry, book_round, rejected_harms
from fedvalue.rounds import fedavg_round_game, value_round, weighted_mean

TARGET = np.array([1.0, -2.0, 0.5])


def utility(arrays) -> float:
    """U(w) = −‖w − target‖²: a closed form for every coalition."""
    return -float(np.sum((arrays["w"] - TARGET) ** 2))


START = {"w": np.zeros(3)}
REPLIES = {"a": {"w": np.array([1.0, 0.0, 0.0])}, "b": {"w": np.array([0.0, -2.0, 1.0])},
           "c": {"w": np.array([4.0, 4.0, 4.0])}}
ENTRIES = [ClientEntry("a", "ok", 1.0, 10), ClientEntry("b", "ok", 3.0, 30),
           ClientEntry("c", "rejected", 2.0, 20, "non-finite values"), ClientEntry("d", "failed", None, None, "crashed")]


def valuation():
    game = fedavg_round_game(["a", "b"], START, [REPLIES["a"], REPLIES["b"]], [1.0, 3.0], utility)
    return value_round(game, ("ads", "loo"))


def test_rows_follow_the_entries_with_values_harms_reasons_and_selection_marks():
    books = book_round(4, ENTRIES, valuation(), methods=("ads", "loo"), start_arrays=START, replies=REPLIES,
                       accepted={"a"}, realized=REPLIES["a"], utility=utility, book_selection=True,
                       noisy_clients={"b"})
    rows = {(r["client_id"], r["method"]): r for r in books.ledger_rows}
    assert [(r["client_id"], r["method"]) for r in books.ledger_rows] == [
        (c, m) for c in "abcd" for m in ("ads", "loo", "selected")]
    # Two players: ADS is the average of the two marginals (closed form below).
    u0, ua, ub = utility(START), utility(REPLIES["a"]), utility(REPLIES["b"])
    uab = utility(weighted_mean([REPLIES["a"], REPLIES["b"]], [1.0, 3.0]))
    assert rows["a", "ads"]["value"] == pytest.approx(((ua - u0) + (uab - ub)) / 2, abs=1e-12)
    assert rows["b", "loo"]["value"] == pytest.approx(uab - ua, abs=1e-12)
    # The rejected reply is booked with the harm it would have done to the accepted aggregate.
    harm = utility(weighted_mean([REPLIES["a"], REPLIES["c"]], [1.0, 2.0])) - ua
    assert rows["c", "ads"]["value"] == rows["c", "loo"]["value"] == pytest.approx(harm, abs=1e-12)
    assert rows["c", "ads"]["reason"] == "non-finite values" and rows["c", "selected"]["value"] is None
    assert rows["d", "ads"]["value"] is None and rows["d", "ads"]["stderr"] is None
    assert rows["d", "loo"]["reason"] == "crashed" and rows["a", "ads"]["reason"] == ""
    assert (rows["a", "selected"]["value"], rows["b", "selected"]["value"]) == (1.0, 0.0)
    assert rows["b", "selected"]["num_examples"] == 3 and rows["b", "ads"]["num_examples"] == 30
    assert rows["b", "ads"]["noisy"] is True and rows["a", "ads"]["noisy"] is False
    row = books.round_row
    assert row["clients"] == "a b c d" and (row["num_clients"], row["num_failed"]) == (4, 2)
    assert (row["utility_before"], row["utility_after"], row["utility_realized"]) == (u0, pytest.approx(uab), ua)
    assert abs(row["efficiency_gap"]) < 1e-12 and row["ads_method"] == "ads-exact"


def test_flows_book_trained_clients_then_idle_ones_and_leave_unknown_inflow_empty():
    gradients = {"a": {"w": np.array([1.0, 0.0, 0.0])}, "e": {"w": np.array([0.0, 1.0, 0.0])}}
    books = book_round(1, ENTRIES[:2], valuation(), methods=("ads",), start_arrays=START, replies=REPLIES,
                       accepted={"a", "b"}, realized=weighted_mean([REPLIES["a"], REPLIES["b"]], [1.0, 3.0]),
                       utility=utility, gradients=gradients)
    flows = {(r["client_id"], r["method"]): r for r in books.ledger_rows if r["method"].startswith("tracin")}
    s_a, s_b = 0.25 * REPLIES["a"]["w"], 0.75 * REPLIES["b"]["w"]  # p_u Δ_u, from A_{t−1} = 0
    # F(u→v) = −(p_u Δ_u)·g_v; e did not train, so it only receives.
    assert flows["e", "tracin_inflow"]["value"] == pytest.approx(-(s_a + s_b) @ gradients["e"]["w"])
    assert flows["e", "tracin_inflow"]["status"] == "idle" and flows["e", "tracin_outflow"]["value"] == 0.0
    assert flows["a", "tracin_outflow"]["value"] == pytest.approx(-s_a @ gradients["e"]["w"])
    assert flows["a", "tracin_self"]["value"] == pytest.approx(-s_a @ gradients["a"]["w"])
    assert flows["b", "tracin_inflow"]["value"] is None  # b sent no gradient: its inflow is unknown
    assert [r["client_id"] for r in books.ledger_rows][-3:] == ["e"] * 3  # idle clients last


def test_given_utilities_are_booked_as_given_and_an_empty_round_keeps_the_state():
    books = book_round(2, [ClientEntry("d", "failed", reason="timeout")], None, methods=("ads",),
                       start_arrays=START, replies={}, accepted=set(), realized=None, utility=utility)
    assert books.round_row["utility_before"] == books.round_row["utility_realized"] == utility(START)
    assert books.round_row["utility_after"] is None and books.ledger_rows[0]["value"] is None
    given = book_round(2, ENTRIES[:2], valuation(), methods=("ads",), start_arrays=START, replies=REPLIES,
                       accepted={"a", "b"}, realized=REPLIES["a"], utility=None,
                       utility_before=-1.5, utility_realized=-0.5)
    assert (given.round_row["utility_before"], given.round_row["utility_realized"]) == (-1.5, -0.5)


def test_a_harm_that_is_not_a_number_is_booked_empty():
    replies = {**REPLIES, "c": {"w": np.array([np.inf, 0.0, 0.0])}}
    harms = rejected_harms(ENTRIES, {"a"}, start_arrays=START, replies=replies, utility=utility)
    assert harms == {"c": None}
    assert not math.isnan(rejected_harms(ENTRIES, {"a"}, start_arrays=START, replies=REPLIES, utility=utility)["c"])
