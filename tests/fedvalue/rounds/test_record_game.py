"""The round game of a record, the one the live valuation and the audit both build: its players
are the clients whose first entry is ok, in reply order, weighted by that entry; every coalition's
value is U of the weighted mean of its members' replies (closed form), and an aggregator of the
inner strategy replaces the mean."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedvalue.rounds.record_game import record_game, valid_clients, value_record
from fedvalue.run.settings import RoundSettings
from fedvalue.run.archive import RoundRecord
from fedvalue.schema import ClientEntry
from fedvalue.valuation.round_game import round_rng
from fedvalue.valuation.settings import AdsSettings

TARGET = np.array([1.0, -2.0, 0.5])
START = {"w": np.zeros(3)}
REPLIES = {"a": {"w": np.array([1.0, 0.0, 0.0])}, "b": {"w": np.array([0.0, -2.0, 1.0])},
           "c": {"w": np.array([4.0, 4.0, 4.0])}, "e": {"w": np.array([0.5, -1.0, 0.0])}}


def utility(arrays) -> float:
    return -float(np.sum((arrays["w"] - TARGET) ** 2))


def a_record() -> RoundRecord:
    # e replied before a's duplicate; c was rejected; d failed; a's second reply is a failed duplicate.
    entries = [ClientEntry("e", "ok", 2.0, 2), ClientEntry("a", "ok", 1.0, 1), ClientEntry("c", "rejected", 5.0, 5),
               ClientEntry("d", "failed", None, None, "crashed"), ClientEntry("b", "ok", 3.0, 3),
               ClientEntry("a", "failed", 7.0, 7, "duplicate")]
    return RoundRecord(round=4, start_arrays=START, entries=entries, replies=dict(REPLIES), accepted=[])


def test_the_players_are_the_ok_clients_in_reply_order():
    assert valid_clients(a_record()) == ["a", "b", "e"]  # the replies' order, not the entries'


def test_every_coalition_is_valued_as_the_weighted_mean_of_its_members():
    record = a_record()
    game = record_game(record, utility)
    players, weights = ["a", "b", "e"], {"a": 1.0, "b": 3.0, "e": 2.0}
    for size in range(1, 4):
        for members in itertools.combinations(players, size):
            mean = sum(weights[c] * REPLIES[c]["w"] for c in members) / sum(weights[c] for c in members)
            mask = sum(1 << players.index(c) for c in members)
            assert game.value(mask) == pytest.approx(utility({"w": mean}), rel=1e-12)
    assert game.value(0) == utility(START)


def test_an_aggregator_replaces_the_mean_and_the_valuation_is_the_rounds_own():
    record = a_record()
    seen = []

    def first_member(coalition):  # an inner strategy that keeps its first member's reply
        seen.append(tuple(coalition))
        return REPLIES[coalition[0]]

    game = record_game(record, utility, first_member)
    assert game.value(0b110) == utility(REPLIES["b"]) and ("b", "e") in seen
    record.settings = RoundSettings(methods=("ads", "loo"), valuation=AdsSettings(method="exact"))
    exact = value_record(record, utility, round_rng(0, 4))
    again = value_record(record, utility, round_rng(0, 4))
    assert list(exact.results["ads"].values.index) == ["a", "b", "e"]
    assert exact.results["ads"].values.equals(again.results["ads"].values)
    # efficiency of the round game: Σφ = v(I_t) − v(∅)
    assert exact.results["ads"].values.sum() == pytest.approx(exact.utility_after - exact.utility_before, abs=1e-12)
