"""book_round against hand-computed books of a small round: every status, selection marks,
harms of rejected replies and TracIn flows, on a utility with a closed form."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fedvalue.run.archive import RoundRecord
from fedvalue.rounds.booking import ClientEntry, book_round, claim_rows, rejected_harms
from fedvalue.schema import ClaimEntry, with_ground_truth
from fedvalue.valuation.round_game import fedavg_round_game, value_round, weighted_mean
from fedvalue.run.settings import RoundSettings

TARGET = np.array([1.0, -2.0, 0.5])


def utility(arrays) -> float:
    """U(w) = −‖w − target‖²: a closed form for every coalition."""
    return -float(np.sum((arrays["w"] - TARGET) ** 2))


START = {"w": np.zeros(3)}
REPLIES = {"a": {"w": np.array([1.0, 0.0, 0.0])}, "b": {"w": np.array([0.0, -2.0, 1.0])},
           "c": {"w": np.array([4.0, 4.0, 4.0])}}
ENTRIES = [ClientEntry("a", "ok", 1.0, 10), ClientEntry("b", "ok", 3.0, 30),
           ClientEntry("c", "rejected", 2.0, 20, "non-finite values"), ClientEntry("d", "failed", None, None, "crashed")]


def record(server_round, entries, methods, accepted, *, replies=REPLIES, gradients=None, selection=False,
           claims=()):
    """The round record book_round takes: replies of the ok and rejected entries only."""
    weighed = {e.client_id for e in entries if e.status in ("ok", "rejected")}
    return RoundRecord(round=server_round, start_arrays=START, entries=list(entries),
                       replies={c: a for c, a in replies.items() if c in weighed}, accepted=sorted(accepted),
                       gradients=gradients or {}, settings=RoundSettings(methods=tuple(methods), flows=gradients is not None,
                                                                    selection=selection), claims=list(claims))


def valuation():
    game = fedavg_round_game(["a", "b"], START, [REPLIES["a"], REPLIES["b"]], [1.0, 3.0], utility)
    return value_round(game, ("ads", "loo"))


def test_rows_follow_the_entries_with_values_harms_reasons_and_selection_marks():
    books = book_round(record(4, ENTRIES, ("ads", "loo"), {"a"}, selection=True), valuation(), utility,
                       realized=REPLIES["a"])
    rows = {(r.client_id, r.method): r for r in books.ledger_rows}
    assert [(r.client_id, r.method) for r in books.ledger_rows] == [
        (c, m) for c in "abcd" for m in ("ads", "loo", "selected")]
    # Two players: ADS is the average of the two marginals (closed form below).
    u0, ua, ub = utility(START), utility(REPLIES["a"]), utility(REPLIES["b"])
    uab = utility(weighted_mean([REPLIES["a"], REPLIES["b"]], [1.0, 3.0]))
    assert rows["a", "ads"].value == pytest.approx(((ua - u0) + (uab - ub)) / 2, abs=1e-12)
    assert rows["b", "loo"].value == pytest.approx(uab - ua, abs=1e-12)
    # The rejected reply is booked with the harm it would have done to the accepted aggregate.
    harm = utility(weighted_mean([REPLIES["a"], REPLIES["c"]], [1.0, 2.0])) - ua
    assert rows["c", "ads"].value == rows["c", "loo"].value == pytest.approx(harm, abs=1e-12)
    assert rows["c", "ads"].reason == "non-finite values" and rows["c", "selected"].value is None
    assert rows["d", "ads"].value is None and rows["d", "ads"].stderr is None
    assert rows["d", "loo"].reason == "crashed" and rows["a", "ads"].reason is None
    assert (rows["a", "selected"].value, rows["b", "selected"].value) == (1.0, 0.0)
    assert rows["b", "selected"].num_examples == 3 and rows["b", "ads"].num_examples == 30
    assert {r.noisy for r in books.ledger_rows} == {None}  # the run's ground truth is no part of its books
    row = books.round_row
    assert row.clients == "a b c d" and (row.num_clients, row.num_failed) == (4, 2)
    assert (row.utility_before, row.utility_after, row.utility_realized) == (u0, pytest.approx(uab), ua)
    assert abs(row.efficiency_gap) < 1e-12 and row.ads_method == "ads-exact"


def test_flows_book_trained_clients_then_idle_ones_and_leave_unknown_inflow_empty():
    gradients = {"a": {"w": np.array([1.0, 0.0, 0.0])}, "e": {"w": np.array([0.0, 1.0, 0.0])}}
    books = book_round(record(1, ENTRIES[:2], ("ads",), {"a", "b"}, gradients=gradients), valuation(), utility,
                       realized=weighted_mean([REPLIES["a"], REPLIES["b"]], [1.0, 3.0]))
    flows = {(r.client_id, r.method): r for r in books.ledger_rows if r.method.startswith("tracin")}
    s_a, s_b = 0.25 * REPLIES["a"]["w"], 0.75 * REPLIES["b"]["w"]  # p_u Δ_u, from A_{t−1} = 0
    # F(u→v) = −(p_u Δ_u)·g_v; e did not train, so it only receives.
    assert flows["e", "tracin_inflow"].value == pytest.approx(-(s_a + s_b) @ gradients["e"]["w"])
    assert flows["e", "tracin_inflow"].status == "idle" and flows["e", "tracin_outflow"].value == 0.0
    assert flows["a", "tracin_outflow"].value == pytest.approx(-s_a @ gradients["e"]["w"])
    assert flows["a", "tracin_self"].value == pytest.approx(-s_a @ gradients["a"]["w"])
    assert flows["b", "tracin_inflow"].value is None  # b sent no gradient: its inflow is unknown
    assert [r.client_id for r in books.ledger_rows][-3:] == ["e"] * 3  # idle clients last


def test_given_utilities_are_booked_as_given_and_an_empty_round_keeps_the_state():
    books = book_round(record(2, [ClientEntry("d", "failed", reason="timeout")], ("ads",), set()), None, utility,
                       realized=None)
    assert books.round_row.utility_before == books.round_row.utility_realized == utility(START)
    assert books.round_row.utility_after is None and books.ledger_rows[0].value is None
    given = book_round(record(2, ENTRIES[:2], ("ads",), {"a", "b"}), valuation(), None, realized=REPLIES["a"],
                       utility_before=-1.5, utility_realized=-0.5)
    assert (given.round_row.utility_before, given.round_row.utility_realized) == (-1.5, -0.5)


def test_a_harm_that_is_not_a_number_is_booked_empty():
    replies = {**REPLIES, "c": {"w": np.array([np.inf, 0.0, 0.0])}}
    harms = rejected_harms(ENTRIES, {"a"}, start_arrays=START, replies=replies, utility=utility)
    assert harms == {"c": None}
    assert not math.isnan(rejected_harms(ENTRIES, {"a"}, start_arrays=START, replies=REPLIES, utility=utility)["c"])


def test_the_record_decides_the_order_counts_and_claims_of_a_round_with_a_failure_in_the_middle():
    """Entries in reply order with the failed client between two replies, a duplicate id,
    and a claim flag: the books follow the record, claim rows last."""
    entries = [ClientEntry("a", "ok", 1.0, 10), ClientEntry("d", "failed", None, None, "crashed"),
               ClientEntry("b", "ok", 3.0, 30), ClientEntry("a", "failed", None, None, "duplicate reply for client a")]
    claim = ClaimEntry("b", "claim_capped", 90.0, 3.0, "ok")
    books = book_round(record(5, entries, ("ads",), {"a", "b"}, claims=[claim]), valuation(), utility,
                       realized=weighted_mean([REPLIES["a"], REPLIES["b"]], [1.0, 3.0]), unaggregatable=0)
    assert books.round_row.clients == "a d b a" and books.round_row.num_failed == 2
    assert books.round_row.num_unaggregatable == 0
    assert [(r.client_id, r.method, r.num_examples, r.reason) for r in books.ledger_rows] == [
        ("a", "ads", 10, None), ("d", "ads", None, "crashed"), ("b", "ads", 30, None),
        ("a", "ads", None, "duplicate reply for client a"), ("b", "claim_capped", 3, None)]
    assert books.ledger_rows[-1] == claim_rows(5, [claim])[0] and books.ledger_rows[-1].value == 90.0
    # The duplicate's failed row books no value; the first reply's does.
    assert books.ledger_rows[0].value is not None and books.ledger_rows[3].value is None


def test_no_book_knows_the_runs_noisy_clients_and_the_join_marks_every_kind_of_row():
    """Valuation, selection, flow and claim rows all leave ``noisy`` unknown; joining the run's
    ground truth marks each row by its client and changes nothing else."""
    gradients = {"a": {"w": np.array([1.0, 0.0, 0.0])}, "e": {"w": np.array([0.0, 1.0, 0.0])}}
    claim = ClaimEntry("b", "claim_capped", 90.0, 3.0, "ok")
    books = book_round(record(2, ENTRIES, ("ads", "loo"), {"a"}, gradients=gradients, selection=True, claims=[claim]),
                       valuation(), utility, realized=REPLIES["a"])
    methods = {r.method for r in books.ledger_rows}
    assert {"ads", "loo", "selected", "tracin_inflow", "claim_capped"} <= methods
    assert {r.noisy for r in books.ledger_rows} == {None}
    joined = with_ground_truth(books.ledger_rows, {"b", "e"})
    assert [r.noisy for r in joined] == [r.client_id in {"b", "e"} for r in books.ledger_rows]
    assert [dataclasses.replace(r, noisy=None) for r in joined] == books.ledger_rows
    assert with_ground_truth(books.ledger_rows, None) == books.ledger_rows


def test_a_new_kind_of_book_is_one_registration_away():
    """A kind registered in fedvalue.rounds.kinds.registry books its rows after each client's, and its
    closing rows after every client's, with no change to book_round."""
    from fedvalue.rounds.book_kind import RoundBook
    from fedvalue.rounds.kinds.registry import ROUND_BOOKS, register_round_book, unregister_round_book

    class Echo(RoundBook):
        def __init__(self, context):
            self.context = context

        def entry_rows(self, entry):
            return [self.context.entry_row(entry, "echo", 1.0, 0.0, entry.num_examples)]

        def closing_rows(self):
            return [self.context.row("all", "echo_total", float(len(self.context.record.entries)), 0.0, None, "ok")]

    kinds = list(ROUND_BOOKS)
    register_round_book("echo", Echo)
    try:
        with pytest.raises(ValueError, match="name: a round book kind 'echo' is registered already"):
            register_round_book("echo", Echo)
        books = book_round(record(6, ENTRIES, ("ads",), {"a", "b"}), valuation(), utility,
                           realized=weighted_mean([REPLIES["a"], REPLIES["b"]], [1.0, 3.0]))
    finally:
        unregister_round_book("echo")
    assert list(ROUND_BOOKS) == kinds
    with pytest.raises(ValueError, match=r"name: expected a registered round book kind, one of \[.*'claims'\]; got 'echo'"):
        unregister_round_book("echo")
    assert [(r.client_id, r.method) for r in books.ledger_rows] == [
        *[(c, m) for c in "abcd" for m in ("ads", "echo")], ("all", "echo_total")]
    assert books.ledger_rows[-1].value == 4.0 and books.parts["echo"].context.record.round == 6
    assert books.ledger_rows[5].reason == "non-finite values"  # c's echo row carries its reason
