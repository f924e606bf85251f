"""The defences of the books against identity games, each against a reference computed by hand:
a duplicated update under k identities earns its cluster exactly what one copy earns; arrivals
by size give a split participant what it earns whole; the free-rider test flags zero updates,
replays of the last global step and colluders whose perturbations cancel, and no honest update."""

from __future__ import annotations

import numpy as np
import pytest

from fedvalue.rounds.booking import book_round
from fedvalue.rounds.defences.clusters import near_duplicate_clusters
from fedvalue.rounds.defences.free_riders import COLLUSION, REPLAY, ZERO_UPDATE, free_rider_flags, off_line_share
from fedvalue.rounds.defences.quotient import defend_round
from fedvalue.rounds.defences.random_order import exact_random_order_values, sampled_random_order_values
from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.rounds.kinds.defences import PREVIOUS_GLOBAL
from fedvalue.audit.references import reference_problems
from fedvalue.run.archive import RoundRecord, record_bytes, round_record_from_bytes
from fedvalue.schema import ClientEntry
from fedvalue.valuation.settings import AdsSettings
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.round_game import fedavg_round_game, value_round
from fedvalue.run.settings import RoundSettings

TARGET = np.array([1.0, -2.0, 0.5, 3.0])


def utility(arrays) -> float:
    """A smooth utility of the model: −‖w − w*‖²."""
    return -float(np.sum((arrays["w"].astype(np.float64) - TARGET) ** 2))


def table_game(values: dict[str, float], players: str) -> CoalitionGame:
    return CoalitionGame(lambda coalition: values["".join(sorted(coalition))], list(players))


OR_LIKE = {"": 0.0, "A": 1.0, "B": 1.0, "C": 2.0, "AB": 1.0, "AC": 2.0, "BC": 2.0, "ABC": 2.0}


def test_arrivals_by_size_by_hand_and_uniform_arrivals_are_shapley():
    game = table_game(OR_LIKE, "ABC")
    # Rates 1, 1, 2: orders ABC 1/12, ACB 1/6, BAC 1/12, BCA 1/6, CAB 1/4, CBA 1/4 (worked out by hand).
    np.testing.assert_allclose(exact_random_order_values(game, list("ABC"), [1, 1, 2]), [0.25, 0.25, 1.5], atol=1e-15)
    np.testing.assert_allclose(exact_random_order_values(game, list("ABC"), [3, 3, 3]), [1 / 3, 1 / 3, 4 / 3],
                               atol=1e-15)
    sampled, stderr = sampled_random_order_values(game, list("ABC"), [1, 1, 2], 4000, np.random.default_rng(0))
    np.testing.assert_allclose(sampled, [0.25, 0.25, 1.5], atol=4 * stderr.max() + 1e-12)


def test_a_split_participant_arrives_as_often_as_whole():
    """Any non-empty coalition is worth 1 (interchangeable updates). Whole, A (2 examples) and B
    (2) earn 1/2 each; A split into A1, A2 (1 each) earns 1/3 + 1/3 under uniform orders, and
    exactly 1/2 when arrivals follow size."""
    whole = CoalitionGame(lambda s: float(bool(s)), ["A", "B"])
    split = CoalitionGame(lambda s: float(bool(s)), ["A1", "A2", "B"])
    assert exact_random_order_values(whole, ["A", "B"], [2, 2])[0] == pytest.approx(0.5, abs=1e-15)
    shares = exact_random_order_values(split, ["A1", "A2", "B"], [1, 1, 2])
    assert shares[0] + shares[1] == pytest.approx(0.5, abs=1e-15)
    uniform = exact_random_order_values(split, ["A1", "A2", "B"], [1, 1, 1])
    assert uniform[0] + uniform[1] == pytest.approx(2 / 3, abs=1e-15)


def _round(replies: dict[str, np.ndarray], weights: dict[str, float]):
    start = {"w": np.zeros(4, dtype=np.float32)}
    arrays = {c: {"w": np.asarray(r, dtype=np.float32)} for c, r in replies.items()}
    ids = list(replies)
    game = fedavg_round_game(ids, start, [arrays[c] for c in ids], [weights[c] for c in ids], utility)
    return start, arrays, game


HONEST = {"a": [0.8, -1.5, 0.2, 2.0], "b": [1.2, -1.0, 0.9, 2.5], "c": [0.3, -2.5, 0.6, 3.5]}


@pytest.mark.parametrize("copies", [2, 4])
def test_a_duplicated_update_under_k_identities_earns_the_cluster_one_copy(copies):
    replies = {**HONEST, **{f"a{k}": HONEST["a"] for k in range(1, copies)}}
    weights = {c: 10.0 for c in replies}
    start, arrays, game = _round(replies, weights)
    settings = DefenceSettings(size_weighted=False)
    defended = defend_round(game, start, arrays, weights, methods=["ads", "loo"], ads_settings=AdsSettings(),
                            rng=np.random.default_rng(0), settings=settings, previous=None, utility=utility,
                            weighted_mean=True)
    assert defended.clusters[0] == ("a", *[f"a{k}" for k in range(1, copies)])
    # The reference: the round without the other copies, valued plainly.
    _, honest_arrays, honest_game = _round(HONEST, weights)
    honest = value_round(honest_game, ["ads", "loo"])
    for method in ("ads", "loo"):
        cluster = sum(defended.values[method][c] for c in defended.clusters[0])
        assert cluster == honest.results[method].values["a"]
        for other in ("b", "c"):
            assert defended.values[method][other] == honest.results[method].values[other]
    plain = value_round(game, ["ads"]).results["ads"].values
    assert sum(plain[c] for c in defended.clusters[0]) > honest.results["ads"].values["a"] + 1e-6  # the gain it stops


def test_free_riders_are_null_players_and_the_quotient_game_is_efficient():
    previous_step = np.array([0.4, -0.6, 0.2, 1.0])
    replies = {**HONEST, "zero": [0.0, 0.0, 0.0, 0.0], "replay": list(previous_step),
               "near": [0.81, -1.49, 0.2, 2.01]}
    weights = {"a": 10.0, "b": 20.0, "c": 10.0, "zero": 10.0, "replay": 15.0, "near": 10.0}
    start, arrays, game = _round(replies, weights)
    previous = {"w": (-previous_step).astype(np.float32)}  # A_{t−1} − A_{t−2} = the step
    defended = defend_round(game, start, arrays, weights, methods=["ads"], ads_settings=AdsSettings(),
                            rng=np.random.default_rng(0), settings=DefenceSettings(), previous=previous,
                            utility=utility, weighted_mean=True)
    assert {c: f.test for c, f in defended.flags.items()} == {"zero": ZERO_UPDATE, "replay": REPLAY}
    assert defended.clusters == [("a", "near"), ("b",), ("c",)]
    values = defended.values["ads"]
    assert values["zero"] == values["replay"] == 0.0 and values["a"] == values["near"]
    reps = game.mask_of(["a", "b", "c"])
    assert sum(values.values()) == pytest.approx(game.value(reps) - game.value(0), abs=1e-12)


def test_the_free_rider_test_by_hand():
    step = np.array([3.0, 0.0, 4.0, 0.0])
    across = np.array([0.0, 1.5, 0.0, 0.0])  # ⟂ step, 0.3 of its norm
    updates = {"honest": np.array([1.0, 2.0, -1.0, 3.0]), "honest2": np.array([-2.0, 1.0, 1.0, 2.0]),
               "zero": np.zeros(4), "old-model": -step, "boosted-replay": 2.5 * step,
               "c1": step + across, "c2": step - across}
    weights = {c: 1.0 for c in updates}
    assert off_line_share(updates["c1"], step) == pytest.approx(1.5 / np.sqrt(25 + 2.25))
    flags = free_rider_flags(updates, weights, step, zero_tolerance=0.1, replay_tolerance=0.05,
                             collusion_tolerance=0.5)
    assert {c: f.test for c, f in flags.items()} == {"zero": ZERO_UPDATE, "old-model": REPLAY,
                                                    "boosted-replay": REPLAY, "c1": COLLUSION, "c2": COLLUSION}
    # Without a previous round only the zero update is seen; unequal colluder weights do not cancel.
    assert set(free_rider_flags(updates, weights, None, zero_tolerance=0.1, replay_tolerance=0.05,
                                collusion_tolerance=0.5)) == {"zero"}
    lopsided = {**weights, "c1": 3.0}
    assert "c1" not in free_rider_flags(updates, lopsided, step, zero_tolerance=0.1, replay_tolerance=0.05,
                                        collusion_tolerance=0.5)


def test_near_duplicate_clusters_by_hand():
    updates = {"x": np.array([1.0, 0.0]), "y": np.array([1.04, 0.0]), "z": np.array([1.08, 0.0]),
               "w": np.array([0.0, 1.0]), "v": np.array([0.0, 1.2])}
    # x~y and y~z (4%, 3.8% apart) chain into one cluster; w and v are 20% apart.
    assert near_duplicate_clusters(updates, 0.05) == [("x", "y", "z"), ("w",), ("v",)]
    assert near_duplicate_clusters(updates, 0.25) == [("x", "y", "z"), ("w", "v")]


def _record(round_number: int, previous: dict | None, settings: RoundSettings) -> RoundRecord:
    replies = {"a": {"w": np.array(HONEST["a"], np.float32)}, "b": {"w": np.array(HONEST["b"], np.float32)},
               "a2": {"w": np.array(HONEST["a"], np.float32)}}
    entries = [ClientEntry(c, "ok", 10.0, 10) for c in replies]
    return RoundRecord(round=round_number, start_arrays={"w": np.zeros(4, np.float32)}, entries=entries,
                       replies=replies, accepted=list(replies), settings=settings,
                       references={} if previous is None else {PREVIOUS_GLOBAL: previous})


META = RoundSettings(methods=("ads", "loo"), valuation=AdsSettings(), seed=0, flows=False,
                     defences=DefenceSettings().as_meta())


def test_the_book_comes_back_from_the_saved_record_and_the_audit_checks_its_reference():
    record = _record(2, {"w": np.full(4, -0.5, np.float32)}, META)
    saved = round_record_from_bytes(record_bytes(record), "round 2")
    assert saved.references[PREVIOUS_GLOBAL]["w"].tolist() == [-0.5] * 4

    def rows(r):
        valuation = value_round(fedavg_round_game(["a", "b", "a2"], r.start_arrays, list(r.replies.values()),
                                                  [10.0] * 3, utility), ["ads", "loo"], seed=np.random.default_rng(0))
        booked = book_round(r, valuation, utility, realized=None)
        return {(row.method, row.client_id): row.value for row in booked.ledger_rows}

    live, again = rows(record), rows(saved)
    assert live == again
    assert live[("defence_cluster", "a")] == live[("defence_cluster", "a2")] == 2.0
    assert live[("ads_defended", "a")] == live[("ads_defended", "a2")]
    before = _record(1, None, META)
    before.start_arrays = {"w": np.full(4, -0.5, np.float32)}
    assert reference_problems(saved, before) == []
    forged = _record(1, None, META)
    forged.start_arrays = {"w": np.full(4, 0.25, np.float32)}
    assert "not the state round 1 started from" in reference_problems(saved, forged)[0]
    assert "keeps none" in reference_problems(_record(2, None, META), before)[0]
    assert "no round came before" in reference_problems(_record(1, {"w": np.zeros(4, np.float32)}, META), None)[0]


def test_settings_are_checked_and_read_back():
    assert DefenceSettings.from_meta(DefenceSettings(norm_cap=2.0).as_meta()) == DefenceSettings(norm_cap=2.0)
    with pytest.raises(ValueError, match="duplicate_tolerance: expected a finite number ≥ 0"):
        DefenceSettings(duplicate_tolerance=-1.0)
    with pytest.raises(ValueError, match="collusion_tolerance: expected at least replay_tolerance"):
        DefenceSettings(replay_tolerance=0.2, collusion_tolerance=0.1)
    with pytest.raises(ValueError, match="unknown settings"):
        DefenceSettings.from_meta({"sybil_proof": True})
