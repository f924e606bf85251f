"""FlowTotals: totals are sums of rounds, reciprocity on the totals ([RECIP] Def. 2.1), populations and order."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedvalue.flows.flow_totals import FlowTotals

from tests.fedvalue.flows.test_round_flows import brute_force_flows, random_round, reference_ratio



ROUNDS = [("abc", "ab"), ("bcd", "bd"), ("ad", "d")]  # c never trains


def book_rounds(seed: int = 17):
    rng = np.random.default_rng(seed)
    return [random_round(rng, list(clients), list(trained), p=4) for clients, trained in ROUNDS]


def test_book_totals_equal_the_sum_of_rounds_and_summary_follows_def_2_1():
    book = FlowTotals()
    expected = {c: {"inflow": 0.0, "outflow": 0.0, "self": 0.0, "rounds": 0, "rounds_trained": 0} for c in "abcd"}
    for updates, gradients in book_rounds():
        book.add_round(updates, gradients)
        for c, row in brute_force_flows(updates, gradients).iterrows():
            for column in ("inflow", "outflow", "self"):
                expected[c][column] += row[column]
            expected[c]["rounds"] += 1
            expected[c]["rounds_trained"] += c in updates
    totals = book.totals()
    assert list(totals.index) == ["a", "b", "c", "d"] and book.clients == ("a", "b", "c", "d")
    assert book.num_rounds == 3
    reference = pd.DataFrame(expected).T.loc[list(totals.index)]
    np.testing.assert_allclose(totals[["inflow", "outflow", "self"]].to_numpy(),
                               reference[["inflow", "outflow", "self"]].to_numpy(dtype=float), rtol=1e-12, atol=1e-12)
    assert totals["rounds"].tolist() == [2, 2, 2, 2]
    assert totals["rounds_trained"].tolist() == [1, 2, 0, 2]

    summary = book.summary()
    np.testing.assert_allclose(summary["balance"], totals["inflow"] - totals["outflow"], rtol=1e-15)
    ratios = [reference_ratio(i, o) for i, o in zip(totals["inflow"], totals["outflow"])]
    np.testing.assert_allclose(summary["ratio"], ratios, rtol=1e-12)
    # Client c never trained: outflow 0, so 0-reciprocal whatever its inflow.
    assert totals.loc["c", "outflow"] == 0.0 and summary.loc["c", "ratio"] == 0.0


def test_rounds_frame_lists_every_round_and_client():
    book = FlowTotals()
    round_results = [book.add_round(u, g, round=r) for r, (u, g) in zip((2, 5, 9), book_rounds())]
    frame = book.rounds_frame()
    assert list(frame.columns) == ["round", "client", "inflow", "outflow", "self", "trained"]
    assert frame["round"].tolist() == [2, 2, 2, 5, 5, 5, 9, 9]
    assert frame["client"].tolist() == list("abc") + list("bcd") + list("ad")
    expected = pd.concat([flows.to_frame() for flows in round_results])
    np.testing.assert_array_equal(frame[["inflow", "outflow", "self"]].to_numpy(),
                                  expected[["inflow", "outflow", "self"]].to_numpy())
    assert frame["trained"].tolist() == expected["trained"].tolist()
    # Default numbering continues after the last round.
    book.add_round({"a": [1.0, 0, 0, 0]}, {"a": [0.0, 1, 0, 0]})
    assert book.rounds_frame()["round"].iloc[-1] == 10
    assert len(book.reciprocity_over_rounds()) == 4
    assert FlowTotals().rounds_frame().empty


def test_book_without_kept_rounds_has_the_same_totals_and_refuses_rounds_frame():
    kept, lean = FlowTotals(), FlowTotals(keep_rounds=False)
    for updates, gradients in book_rounds():
        kept.add_round(updates, gradients)
        lean.add_round(updates, gradients)
    pd.testing.assert_frame_equal(kept.totals(), lean.totals())
    assert lean.total == kept.total
    with pytest.raises(ValueError, match="^keep_rounds"):
        lean.rounds_frame()
    with pytest.raises(ValueError, match="^keep_rounds"):
        lean.reciprocity_over_rounds()


def test_fixed_population_rejects_unknown_clients_and_reports_absent_ones():
    book = FlowTotals(clients=["a", "b", "c", "d", "e"])
    for updates, gradients in book_rounds():
        book.add_round(updates, gradients)
    before = book.totals()
    with pytest.raises(ValueError, match=r"^flows: unknown client\(s\) \['z'\]"):
        book.add_round({"a": [1.0, 0, 0, 0]}, {"a": [1.0, 0, 0, 0], "z": [0.0, 1, 0, 0]})
    # A rejected round leaves the book as it was.
    pd.testing.assert_frame_equal(book.totals(), before)
    assert book.num_rounds == 3 and len(book.rounds_frame()) == 8
    assert book.clients == ("a", "b", "c", "d", "e")
    assert before.loc["e"].tolist() == [0.0, 0.0, 0.0, 0, 0]
    with pytest.raises(ValueError, match="^clients"):
        FlowTotals(clients=["a", "a"])


def test_rounds_must_increase():
    book = FlowTotals()
    updates, gradients = book_rounds()[0]
    book.add_round(updates, gradients, round=3)
    for bad in (3, 2):
        with pytest.raises(ValueError, match="^round: expected a round after 3"):
            book.add_round(updates, gradients, round=bad)
    with pytest.raises(TypeError, match="^round"):
        book.add_round(updates, gradients, round=4.0)
    assert book.num_rounds == 1
    with pytest.raises(TypeError, match="^flows"):
        book.add(brute_force_flows(updates, gradients))  # a DataFrame is not a RoundFlows


