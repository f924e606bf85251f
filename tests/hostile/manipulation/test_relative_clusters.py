"""The relative near-duplicate rule (fedvalue.rounds.defences.relative_clusters): its properties by
hypothesis, its small rounds by hand, the adaptive replicas of clients.attacks.adaptive among honest
updates of real local training, and the defended book under it, booked and audited from its record."""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from clients.attacks.adaptive import AdaptiveReplica
from clients.training import train_locally
from fedvalue.audit.round import recompute_books, round_problems
from fedvalue.rounds.booking import BookedRound
from fedvalue.rounds.defences.clusters import near_duplicate_clusters
from fedvalue.rounds.defences.quotient import flat_update
from fedvalue.rounds.defences.relative_clusters import (
    relative_duplicate_clusters,
    relative_threshold,
    scale_free_distances,
)
from fedvalue.rounds.defences.settings import DUPLICATE_MEDIAN_FRACTION, DUPLICATE_TOLERANCE, DefenceSettings
from fedvalue.run.archive import RoundRecord, record_bytes, round_record_from_bytes
from fedvalue.run.ledger_reader import read_tables
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.run.settings import RoundSettings
from fedvalue.schema import ClientEntry
from fedvalue.valuation.settings import AdsSettings
from simulations.datasets.loaders import DEFAULT_DATA_PATHS, load_dataset, sample_per_class
from simulations.datasets.models import make_linear_model
from simulations.datasets.partitions import partition

TAU, KAPPA = DUPLICATE_TOLERANCE, DUPLICATE_MEDIAN_FRACTION


def _as_sets(clusters) -> set[frozenset]:
    return {frozenset(c) for c in clusters}


def _round(seed: int, n: int, d: int, copies: int) -> dict:
    """n updates around a common direction, then ``copies`` near-copies of some of them at relative
    distances from 0 to 0.5 (either side of any threshold the round can have)."""
    rng = np.random.default_rng(seed)
    common = rng.standard_normal(d)
    updates = {f"u{k}": rng.uniform(0.5, 2.0) * (common + rng.uniform(0.2, 2.0) * rng.standard_normal(d))
               for k in range(n)}
    for k in range(copies):
        original = updates[f"u{int(rng.integers(n))}"]
        noise = rng.standard_normal(d)
        updates[f"c{k}"] = original + rng.uniform(0.0, 0.5) * np.linalg.norm(original) * noise / np.linalg.norm(noise)
    return updates


ROUNDS = st.tuples(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(2, 30), st.integers(0, 6))


@given(ROUNDS, st.integers(-20, 20))
@settings(max_examples=60, deadline=None)
def test_a_common_rescaling_by_a_power_of_two_changes_nothing(shape, exponent):
    updates = _round(*shape)
    scaled = {c: np.ldexp(u, exponent) for c, u in updates.items()}  # exact in float64
    assert relative_threshold(scaled, TAU, KAPPA) == relative_threshold(updates, TAU, KAPPA)
    assert relative_duplicate_clusters(scaled, TAU, KAPPA) == relative_duplicate_clusters(updates, TAU, KAPPA)


@given(ROUNDS, st.floats(1e-6, 1e6))
@settings(max_examples=60, deadline=None)
def test_any_common_rescaling_changes_nothing_but_ties_to_rounding(shape, factor):
    updates = _round(*shape)
    threshold = relative_threshold(updates, TAU, KAPPA)
    distances = scale_free_distances(updates)
    assume(not np.any(np.isclose(distances, threshold, rtol=1e-9, atol=0.0)))  # no pair on the line
    scaled = {c: factor * u for c, u in updates.items()}
    assert relative_threshold(scaled, TAU, KAPPA) == pytest.approx(threshold, rel=1e-12)
    assert relative_duplicate_clusters(scaled, TAU, KAPPA) == relative_duplicate_clusters(updates, TAU, KAPPA)


@given(ROUNDS, st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None)
def test_reply_order_changes_nothing_but_the_order_clusters_are_listed_in(shape, random):
    updates = _round(*shape)
    order = list(updates)
    random.shuffle(order)
    shuffled = {c: updates[c] for c in order}
    assert relative_threshold(shuffled, TAU, KAPPA) == relative_threshold(updates, TAU, KAPPA)
    assert _as_sets(relative_duplicate_clusters(shuffled, TAU, KAPPA)) == _as_sets(
        relative_duplicate_clusters(updates, TAU, KAPPA))


@given(ROUNDS, st.integers(0, 11), st.booleans())
@settings(max_examples=60, deadline=None)
def test_an_exact_copy_is_always_linked_to_its_original(shape, which, zero):
    updates = _round(*shape)
    original = f"u{which % shape[1]}"
    if zero:  # a zero update and its copy: linked to each other, to no non-zero update
        updates[original] = np.zeros_like(updates[original])
    updates["copy"] = updates[original].copy()
    cluster = next(c for c in relative_duplicate_clusters(updates, TAU, KAPPA) if original in c)
    assert "copy" in cluster
    if zero:
        assert cluster == (original, "copy")


@given(st.integers(0, 2**32 - 1), st.integers(3, 20), st.integers(50, 1000), st.floats(0.3, 3.0))
@settings(max_examples=100, deadline=None)
def test_honest_looking_gaussian_updates_are_never_linked(seed, n, d, noise):
    """Δ_i = g + σ ξ_i, ξ_i iid standard normal, σ√d = ``noise`` × ‖g‖: no two linked at κ = 0.25.

    Measured before this test (20,000 rounds each, n uniform in 3..20, d in 100..1,000 or in 10..1,000,
    the noise ratio in 0.3..3): 0 rounds with a link. With each client's update also scaled by its own
    factor in [0.5, 2] (norms that differ as sizes do), 3 rounds in 20,000 (0.015%; 5 or 6 clients,
    where the median is one of few pairs). In very few dimensions chance alone makes close pairs: with
    those factors and 20 clients, every round had a link at d = 2, 46% at d = 5, 1.2% at d = 10."""
    rng = np.random.default_rng(seed)
    common = rng.standard_normal(d)
    sigma = noise * np.linalg.norm(common) / np.sqrt(d)
    updates = {k: common + sigma * rng.standard_normal(d) for k in range(n)}
    assert relative_duplicate_clusters(updates, TAU, KAPPA) == [(k,) for k in range(n)]


def test_small_and_degenerate_rounds_by_hand():
    x, y = np.array([1.0, 0.0]), np.array([1.04, 0.0])
    # Two replies (one pair, no spread): τ alone, so 4% apart are linked and 10% apart are not.
    assert relative_threshold({"x": x, "y": y}, TAU, KAPPA) == TAU
    assert relative_duplicate_clusters({"x": x, "y": y}, TAU, KAPPA) == [("x", "y")]
    assert relative_duplicate_clusters({"x": x, "z": np.array([1.1, 0.0])}, TAU, KAPPA) == [("x",), ("z",)]
    assert relative_duplicate_clusters({"x": x}, TAU, KAPPA) == [("x",)] and relative_duplicate_clusters({}, TAU,
                                                                                                      KAPPA) == []
    # Zero updates: linked to each other only, and left out of the spread (two non-zero updates remain: τ).
    zeros = {"o1": np.zeros(2), "o2": np.zeros(2), "x": x, "w": np.array([0.0, 1.0])}
    assert relative_threshold(zeros, TAU, KAPPA) == TAU
    assert relative_duplicate_clusters(zeros, TAU, KAPPA) == [("o1", "o2"), ("x",), ("w",)]
    # All equal: median 0, threshold τ, one cluster.
    same = {k: np.array([0.3, -0.2]) for k in "abcd"}
    assert relative_threshold(same, TAU, KAPPA) == TAU
    assert relative_duplicate_clusters(same, TAU, KAPPA) == [tuple("abcd")]
    # Three replies: the median is the middle pair; r = 1, √2 (·1/1), 1 → t = 0.25.
    three = {"a": np.array([1.0, 0.0]), "b": np.array([0.0, 1.0]), "c": np.array([1.0, 1.0])}
    np.testing.assert_allclose(sorted(scale_free_distances(three)), [1.0, 1.0, np.sqrt(2)])
    assert relative_threshold(three, TAU, KAPPA) == KAPPA * 1.0
    # A replica pair 10% apart (2 × τ) among them: missed by τ, linked by the round's spread.
    spread = {**three, "a2": np.array([1.0, 0.1])}
    assert near_duplicate_clusters(spread, TAU) == [("a",), ("b",), ("c",), ("a2",)]
    assert relative_duplicate_clusters(spread, TAU, KAPPA) == [("a", "a2"), ("b",), ("c",)]


def test_settings_keep_the_records_of_default_settings_byte_for_byte_and_read_old_ones():
    before = ('{"duplicate_tolerance": 0.05, "zero_tolerance": 0.1, "replay_tolerance": 0.05, '
              '"collusion_tolerance": 0.5, "size_weighted": true, "norm_cap": null}')  # as_meta before the option
    assert json.dumps(DefenceSettings().as_meta()) == before
    assert DefenceSettings.from_meta(json.loads(before)) == DefenceSettings()  # an old record reads: fixed τ
    relative = DefenceSettings(duplicate_median_fraction=KAPPA)
    assert relative.as_meta()["duplicate_median_fraction"] == 0.25
    assert DefenceSettings.from_meta(relative.as_meta()) == relative
    for bad in (0.0, 1.0, -0.1, float("nan"), True):
        with pytest.raises(ValueError, match="duplicate_median_fraction: expected"):
            DefenceSettings(duplicate_median_fraction=bad)
    with pytest.raises(ValueError, match="duplicate_median_fraction: the relative rule never links below"):
        DefenceSettings(duplicate_tolerance=None, duplicate_median_fraction=KAPPA)


# --- Adaptive replicas among honest updates of real local training -------------------------------------------

MARGINS = (0.05, 0.2, 0.5, 1.0, 2.0, 5.0)
HONEST_CLIENTS, ROUNDS_TRAINED, IMAGES_PER_CLIENT = 12, 3, 250
#: The largest margin whose replicas the relative rule linked in every round measured (module fixture's rounds).
CAUGHT_UP_TO = {"iid": 1.0, "dirichlet": 2.0}


@pytest.fixture(scope="module")
def real_rounds():
    """Scheme -> rounds 1..3 of FedAvg over 12 honest clients and one participant (13 shards of
    Fashion-MNIST, 250 images each on average, IID or Dirichlet α = 0.5 with at least 32), softmax
    regression, one local epoch of SGD (batch 32, learning rate 0.1) in plain torch: each round's
    (start state, honest updates, the participant's honestly trained arrays)."""
    if not Path(DEFAULT_DATA_PATHS["fashion-mnist"]).is_dir():
        pytest.skip("needs Debian's dataset-fashion-mnist (.ci/run installs it)")
    data = load_dataset("fashion-mnist", split="train")
    found = {}
    for scheme in ("iid", "dirichlet"):
        rows = sample_per_class(data.y, IMAGES_PER_CLIENT * (HONEST_CLIENTS + 1), seed=0)
        x, y = data.x[rows], data.y[rows]
        shards = partition(y, HONEST_CLIENTS + 1, scheme=scheme, seed=0, alpha=0.5, min_partition_size=32)
        model = make_linear_model(784, 10, seed=0)
        start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}

        def trained(shard, client, server_round):
            model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in start.items()})
            train_locally(model, x[shard], y[shard], epochs=1, learning_rate=0.1, batch_size=32,
                          seed=[0, client, server_round])
            return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}

        rounds = []
        for server_round in range(1, ROUNDS_TRAINED + 1):
            honest = {f"h{k}": flat_update(trained(shards[k], k, server_round), start)
                      for k in range(HONEST_CLIENTS)}
            rounds.append((start, honest, trained(shards[HONEST_CLIENTS], HONEST_CLIENTS, server_round)))
            sizes = np.array([len(s) for s in shards[:HONEST_CLIENTS]], dtype=np.float64)
            step = sum((size / sizes.sum()) * honest[f"h{k}"] for k, size in enumerate(sizes))
            start, offset = dict(start), 0
            for key, value in start.items():  # FedAvg of the honest updates: the next round's start
                start[key] = (value.astype(np.float64) + step[offset:offset + value.size].reshape(value.shape)
                              ).astype(value.dtype)
                offset += value.size
        found[scheme] = rounds
    return found


def _replicas(start, participant, identities: int, margin: float, server_round: int) -> dict:
    """The participant's K identities as :class:`AdaptiveReplica` replies them (its own code, in process)."""
    replies = {}
    for j in range(identities):
        behaviour = AdaptiveReplica(j, identities, margin=margin, secret=11)
        behaviour.begin_round(server_round, [])
        arrays, _ = behaviour.transform_reply(start, participant, 250, np.random.default_rng(0))
        replies[f"a{j}"] = flat_update(arrays, start)
    return replies


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_adaptive_replicas_escape_the_fixed_threshold_and_are_linked_by_the_rounds_spread(real_rounds, scheme):
    """Replicas placed (1 + M) τ apart among 12 honest clients, rounds 1 to 3, K = 2 and 4 identities.

    Measured (this fixture's rounds): the fixed τ links no replicas at any M > 0. The relative rule
    links all K identities into one cluster in every round up to M = 1 on IID shards (pairs 0.10 apart;
    the threshold 0.13 in round 1, 0.18 to 0.24 in rounds 2 and 3: M = 2, 0.15 apart, is linked there,
    not in round 1; M = 5, 0.30 apart, in no round) and up to M = 2 on Dirichlet shards (threshold 0.30
    to 0.35: M = 5 is linked but for K = 4 in round 1, whose threshold is 0.299). No honest client is
    linked, to a replica or to another. Before this test, over 4 seeds, 8, 12 and 20 honest clients and
    rounds 1 to 5 (120 rounds with replicas a scheme and margin, 60 honest-only rounds a scheme): linked
    in every round up to M = 1 (IID) and M = 2 (Dirichlet); M = 2 on IID shards in every round after the
    first, M = 5 on Dirichlet shards in every round after the first; no honest client ever linked."""
    for server_round, (start, honest, participant) in enumerate(real_rounds[scheme], start=1):
        assert relative_duplicate_clusters(honest, TAU, KAPPA) == [(c,) for c in honest]  # honest only: no link
        for identities in (2, 4):
            for margin in MARGINS:
                replicas = _replicas(start, participant, identities, margin, server_round)
                for a, b in combinations(replicas.values(), 2):
                    ratio = np.linalg.norm(a - b) / min(np.linalg.norm(a), np.linalg.norm(b))
                    assert ratio == pytest.approx((1 + margin) * TAU, rel=1e-3)  # where the attack says
                updates = {**honest, **replicas}
                assert near_duplicate_clusters(updates, TAU) == [(c,) for c in updates]  # τ misses them
                clusters = relative_duplicate_clusters(updates, TAU, KAPPA)
                assert all(len(c) == 1 for c in clusters if any(m.startswith("h") for m in c))  # honest alone
                linked = tuple(replicas) in clusters
                if margin <= CAUGHT_UP_TO[scheme]:
                    assert linked, (server_round, identities, margin, relative_threshold(updates, TAU, KAPPA))
                if scheme == "iid" and margin == 5.0:
                    assert not linked  # what it leaves: replicas as far apart as honest IID clients' κ-share


# --- The defended book under the relative rule, booked and audited from its record ----------------------------

TARGET = np.array([1.0, -2.0, 0.5, 3.0, -1.0, 0.25])


def utility(arrays) -> float:
    """U(A) = −‖w − target‖²."""
    return -float(np.sum((arrays["w"].astype(np.float64) - TARGET) ** 2))


def _record(defences: DefenceSettings) -> RoundRecord:
    """Round 1: five honest clients and client 6, a replica of client 1 placed (1 + 1) τ from it."""
    rng = np.random.default_rng(4)
    honest = {c: 0.3 * TARGET + 0.4 * rng.standard_normal(TARGET.size) for c in range(1, 6)}
    nu = rng.standard_normal(TARGET.size)
    nu -= (nu @ honest[1]) / (honest[1] @ honest[1]) * honest[1]  # orthogonal, as AdaptiveReplica's
    honest[6] = honest[1] + 2 * TAU * np.linalg.norm(honest[1]) * nu / np.linalg.norm(nu)
    replies = {c: {"w": u.astype(np.float32)} for c, u in honest.items()}
    entries = [ClientEntry(c, "ok", 10.0, 10) for c in replies]
    return RoundRecord(round=1, start_arrays={"w": np.zeros(TARGET.size, np.float32)}, entries=entries,
                       replies=replies, accepted=list(replies),
                       settings=RoundSettings(methods=("ads", "loo"), valuation=AdsSettings(method="exact"), seed=3,
                                              strategy="FedAvg", defences=defences.as_meta()))


def _booked(record: RoundRecord, tmp_path) -> BookedRound:
    """The round's books as a run writes them and a reader reads them back, typed."""
    books = recompute_books(record, utility)[0]
    LedgerWriter(tmp_path, config={"seed": 3}).write_round(books.round_row, books.ledger_rows)
    tables = read_tables(tmp_path)
    return BookedRound(tables.round_rows()[0], tables.rows())


def test_the_defended_book_links_by_the_rounds_spread_and_the_audit_recomputes_it(tmp_path):
    relative = round_record_from_bytes(record_bytes(_record(DefenceSettings(duplicate_median_fraction=KAPPA))),
                                       "round 1")  # what the audit reads: the saved record
    assert relative.settings.defences["duplicate_median_fraction"] == KAPPA
    assert b"duplicate_median_fraction" not in record_bytes(_record(DefenceSettings()))
    booked = _booked(relative, tmp_path / "relative")
    rows = {(r.method, str(r.client_id)): r.value for r in booked.ledger_rows}  # ids read back as text
    assert rows[("defence_cluster", "1")] == rows[("defence_cluster", "6")] == 2.0
    assert all(rows[("defence_cluster", str(c))] == 1.0 for c in range(2, 6))
    assert rows[("ads_defended", "1")] == rows[("ads_defended", "6")]
    fixed = {(r.method, str(r.client_id)): r.value for r in _booked(_record(DefenceSettings()), tmp_path / "fixed")
             .ledger_rows}
    assert fixed[("defence_cluster", "6")] == 1.0  # the fixed τ lets the replica be a player
    assert round_problems(relative, utility, booked, 1e-9, next_start=None)[0] == []
    changed = list(booked.ledger_rows)
    k = next(i for i, r in enumerate(changed) if (r.method, str(r.client_id)) == ("ads_defended", "6"))
    changed[k] = replace(changed[k], value=changed[k].value + 1e-3)
    found = round_problems(relative, utility, BookedRound(booked.round_row, changed), 1e-9, next_start=None)[0]
    assert any(p.startswith("round 1 ads_defended of client 6: value is booked") for p in found), found
    # The same books under the fixed rule are not the relative rule's: the audit tells them apart.
    as_fixed = replace(relative, settings=replace(relative.settings, defences=DefenceSettings().as_meta()))
    assert any("defence_cluster of client 6" in p
               for p in round_problems(as_fixed, utility, booked, 1e-9, next_start=None)[0])
