"""The defended second-order book, ``ads_fixed_second_order_defended``: φ^D_k = c_k φ_k with c_k = 0 for a reply the
round's free-rider tests flag, n_max(C) / n_C in a near-duplicate cluster C and 1 alone
(:mod:`fedvalue.rounds.defences.second_order`).

On a smooth non-quadratic utility, from hand-built round records (the book as the run and the audit call it): K exact
replicas are paid, together, one copy's plain value; a cluster is paid what one client claiming its largest claim and
replying its claim-weighted mean update is (against the closed form u·(g + ½ H s)), and a split whose shards cluster
n_max / n_D of the whole; a zero update, a replay of the last global step and colluders whose perturbations cancel
are paid 0; every other client exactly its plain value; replicas spread just past τ (the adaptive replicas) are not
clustered and are paid as plain replicas are (the known gap). Through a run (in-process grid, FedAvg, torch
training, no Ray): the rows beside the defences' own, the audit recomputing them and failing a changed one, no trace
of them unless both books are on, and the payout refusing them without the opt-in, naming the book and why."""

from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest
from flwr.app import ConfigRecord, MessageType, MetricRecord, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.attacks.adaptive import AdaptiveReplica, simplex_perturbations
from fedvalue.analysis.payout import payout_table
from fedvalue.analysis.run_summary import load_run
from fedvalue.audit.checks import audit_run
from fedvalue.rounds.book_kind import RoundContext
from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.rounds.kinds.defences import PREVIOUS_GLOBAL
from fedvalue.rounds.kinds.fixed_second_order import fixed_second_order_book
from fedvalue.run.archive import RoundRecord, round_record_paths
from fedvalue.run.settings import RoundSettings
from fedvalue.schema import ClientEntry
from strategies import BookSettings
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from tests.fedvalue.forgery import forge_ledger_rows
from tests.hostile.manipulation.test_identities_paid_their_sum import LogDistanceUtility
from tests.strategies.test_fixed_second_order import booked_rows, valued_run
from tests.strategies.test_valuing import (
    PID_OF,
    local_training,
    make_handler,
    utility,  # noqa: F401 (a fixture)
)

PLAIN, DEFENDED = "ads_fixed_second_order", "ads_fixed_second_order_defended"
BOTH = BookSettings(defences=DefenceSettings(), fixed_second_order=True)
#: Wide enough that independent random updates are never within τ of each other or of a line.
DIM = 24


def booked(start, replies: dict, claims: dict, smooth, previous=None) -> tuple[dict, dict]:
    """(client -> plain value, client -> defended value) of the book on a round record of ``replies``."""
    entries = [ClientEntry(c, "ok", float(claims[c]), int(claims[c])) for c in replies]
    record = RoundRecord(round=2, start_arrays=start, entries=entries, replies=dict(replies), accepted=list(replies),
                         settings=RoundSettings(methods=("ads",), defences=DefenceSettings().as_meta(),
                                                fixed_second_order=True),
                         references={} if previous is None else {PREVIOUS_GLOBAL: previous})
    book = fixed_second_order_book(RoundContext(record, None, smooth))
    rows = [row for entry in entries for row in book.entry_rows(entry)]
    assert [row.method for row in rows] == [PLAIN, DEFENDED] * len(entries)
    assert {row.stderr for row in rows} == {0.0}
    return ({r.client_id: r.value for r in rows if r.method == PLAIN},
            {r.client_id: r.value for r in rows if r.method == DEFENDED})


def honest_round(rng: np.random.Generator, clients: int = 4):
    """A_{t−1}, A_{t−2} (a random last step), ``clients`` honest replies in random directions and their claims."""
    start = {"x": rng.normal(size=DIM)}
    previous = {"x": start["x"] - rng.normal(size=DIM)}
    replies = {f"h{i}": {"x": start["x"] + rng.normal(size=DIM)} for i in range(clients)}
    claims = {c: int(n) for c, n in zip(replies, rng.integers(10, 60, size=clients))}
    return start, previous, replies, claims


def weighted_step_value(start, replies: dict, claims: dict, smooth, update: np.ndarray, claim: float) -> float:
    """u·(g + ½ H s) with u = (claim / N) ``update``, s = Σ_k (n_k / N) Δ_k: what one client replying ``update`` with
    ``claim`` is paid in the round of ``replies`` (the proposition's closed form, from U's gradient and Hessian)."""
    total = float(sum(claims.values()))
    step = sum((claims[c] / total) * (replies[c]["x"] - start["x"]) for c in replies)
    w = smooth.gradient(start)["x"] + 0.5 * smooth.hessian_vector_product(start, {"x": step})["x"]
    return float((claim / total) * update @ w)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 5))
def test_k_exact_replicas_are_paid_one_copys_value_and_the_others_their_plain_value(seed, copies):
    rng = np.random.default_rng(seed)
    start, previous, replies, claims = honest_round(rng)
    update = rng.normal(size=DIM)
    for j in range(copies):
        replies[f"r{j}"], claims[f"r{j}"] = {"x": start["x"] + update}, 40
    smooth = LogDistanceUtility(rng.normal(size=DIM))
    plain, defended = booked(start, replies, claims, smooth, previous)
    scale = max(abs(v) for v in plain.values())
    one_copy = weighted_step_value(start, replies, claims, smooth, update, 40)
    assert plain["r0"] == pytest.approx(one_copy, abs=1e-9 * scale)
    assert sum(defended[f"r{j}"] for j in range(copies)) == pytest.approx(plain["r0"], abs=1e-9 * scale)
    assert sum(plain[f"r{j}"] for j in range(copies)) == pytest.approx(copies * plain["r0"], abs=1e-9 * scale)
    for c in ("h0", "h1", "h2", "h3"):
        assert defended[c] == plain[c]  # bit for bit: c_k = 1.0


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_a_zero_update_a_replay_and_colluders_are_paid_nothing_and_the_others_their_plain_value(seed):
    rng = np.random.default_rng(seed)
    start, previous, replies, claims = honest_round(rng)
    last_step = start["x"] - previous["x"]
    median = float(np.median([np.linalg.norm(r["x"] - start["x"]) for r in replies.values()]))
    noise = rng.normal(size=DIM)
    replies["zero"] = {"x": start["x"] + 0.02 * median * noise / np.linalg.norm(noise)}  # within ε₀ = 0.1
    replies["replay"] = {"x": start["x"] + rng.uniform(0.5, 1.5) * last_step}
    # Three colluders: the last step moved off its line by a simplex that cancels in their mean (each 0.3 of it).
    ring = simplex_perturbations(last_step, 3, 0.3 * np.linalg.norm(last_step) / np.sqrt(1 / 3), rng)
    for j, move in enumerate(ring):
        replies[f"ring{j}"] = {"x": start["x"] + last_step + move}
    claims.update({"zero": 30, "replay": 50, "ring0": 25, "ring1": 25, "ring2": 25})
    smooth = LogDistanceUtility(rng.normal(size=DIM))
    plain, defended = booked(start, replies, claims, smooth, previous)
    for c in ("zero", "replay", "ring0", "ring1", "ring2"):
        assert defended[c] == 0.0, c
    scale = max(abs(v) for v in plain.values())
    assert abs(plain["replay"]) > 1e-6 * scale  # the plain book pays the replay what it does to U
    assert abs(plain["ring0"] + plain["ring1"] + plain["ring2"]) > 1e-6 * scale
    for c in ("h0", "h1", "h2", "h3"):
        assert defended[c] == plain[c]


def test_a_cluster_is_paid_as_one_claim_and_a_split_whose_shards_cluster_its_largest_shares_part():
    rng = np.random.default_rng(3)
    start, previous, replies, claims = honest_round(rng)
    update, shard_claims = rng.normal(size=DIM), {"s0": 10, "s1": 25, "s2": 15}
    # Shards within 0.01 of the whole's update whose claim-weighted updates add up to n_D Δ_D (the last one solves).
    moves = {c: 0.01 * np.linalg.norm(update) * rng.normal(size=DIM) / np.sqrt(DIM) for c in ("s0", "s1")}
    moves["s2"] = -(10 * moves["s0"] + 25 * moves["s1"]) / 15
    shards = {c: {"x": start["x"] + update + moves[c]} for c in shard_claims}
    smooth = LogDistanceUtility(rng.normal(size=DIM))
    plain, defended = booked(start, {**replies, **shards}, {**claims, **shard_claims}, smooth, previous)
    scale = max(abs(v) for v in plain.values())
    # The cluster: one client claiming its largest claim (25) and replying its claim-weighted mean update.
    mean = sum(shard_claims[c] * (shards[c]["x"] - start["x"]) for c in shards) / 50
    paid = sum(defended[c] for c in shards)
    assert paid == pytest.approx(weighted_step_value(start, {**replies, **shards}, {**claims, **shard_claims},
                                                     smooth, mean, 25), abs=1e-9 * scale)
    for c in shards:  # each member by its own plain value's share
        assert defended[c] == pytest.approx(0.5 * plain[c], abs=1e-12 * scale)
    # The whole replying alone in the same round (same step, same total claim): the split is paid 25/50 of it.
    whole_plain, _ = booked(start, {**replies, "whole": {"x": start["x"] + update}}, {**claims, "whole": 50}, smooth,
                            previous)
    assert paid == pytest.approx(0.5 * whole_plain["whole"], abs=1e-9 * scale)
    assert abs(paid - whole_plain["whole"]) > 0.1 * abs(whole_plain["whole"])
    for c in replies:
        assert defended[c] == plain[c] == pytest.approx(whole_plain[c], abs=1e-9 * scale)


@pytest.mark.parametrize("copies", [2, 4])
@pytest.mark.parametrize("margin", [0.05, 0.5])
def test_adaptive_replicas_escape_the_clusters_and_are_paid_as_plain_replicas(margin, copies):
    """The known gap: identities τ(1 + margin) apart are no cluster, and their perturbations cancel, so they are paid
    K copies' value where exact replicas are paid one (docs/faults-and-audit.md, the defended second-order book)."""
    rng = np.random.default_rng(11)
    start, previous, replies, claims = honest_round(rng)
    update = rng.normal(size=DIM)
    distance = AdaptiveReplica(0, copies, margin=margin).distance(float(np.linalg.norm(update)))
    spread = simplex_perturbations(update, copies, distance, rng)
    ids = [f"r{j}" for j in range(copies)]
    smooth = LogDistanceUtility(rng.normal(size=DIM))
    adaptive = {c: {"x": start["x"] + update + move} for c, move in zip(ids, spread)}
    exact = {c: {"x": start["x"] + update} for c in ids}
    all_claims = {**claims, **dict.fromkeys(ids, 40)}
    adaptive_plain, adaptive_defended = booked(start, {**replies, **adaptive}, all_claims, smooth, previous)
    exact_plain, exact_defended = booked(start, {**replies, **exact}, all_claims, smooth, previous)
    scale = max(abs(v) for v in exact_plain.values())
    assert all(adaptive_defended[c] == adaptive_plain[c] for c in ids)  # no cluster: every factor 1
    assert sum(adaptive_defended[c] for c in ids) == pytest.approx(sum(exact_plain[c] for c in ids), abs=1e-9 * scale)
    assert sum(adaptive_defended[c] for c in ids) == pytest.approx(copies * sum(exact_defended[c] for c in ids),
                                                                   abs=1e-9 * scale)


#: The run's replica (of client 3's training and claim) and its free-rider (the last global step again).
REPLICA, ORIGINAL, FREE_RIDER = 4, 3, 5


def replica_and_replay_handler():
    """Clients 0-3 train as in test_valuing; 4 replies client 3's trained model (bit for bit, its claim); 5 claims 60
    examples and replies what it was sent in round 1 (a zero update), A_{t−1} + (A_{t−1} − A_{t−2}) after."""
    honest, sent = make_handler(), []

    def handler(message, node_id):
        pid = PID_OF[node_id]
        if message.metadata.message_type == MessageType.QUERY or pid not in (REPLICA, FREE_RIDER):
            return honest(message, node_id)
        received = arrays_to_numpy(message.content["arrays"])
        if pid == REPLICA:
            arrays, n, loss = local_training(received, ORIGINAL)
        else:
            sent.append(received)
            arrays = received if len(sent) == 1 else {k: v + (v - sent[-2][k]) for k, v in received.items()}
            n, loss = 60, 1.0
        return RecordDict({"arrays": numpy_to_arrays(arrays), "metrics": MetricRecord({"num-examples": n,
                                                                                       "train-loss": loss}),
                           "client": ConfigRecord({"partition-id": pid})})
    return handler


def test_the_run_books_the_defended_rows_beside_the_defences_own(tmp_path, utility):  # noqa: F811
    run_dir = valued_run(tmp_path / "run", utility, replica_and_replay_handler(), range(6), num_rounds=2, books=BOTH)
    for t in (1, 2):
        plain, defended = booked_rows(run_dir, t), booked_rows(run_dir, t, DEFENDED)
        flagged, clusters = booked_rows(run_dir, t, "defence_free_rider"), booked_rows(run_dir, t, "defence_cluster")
        assert {c: v for c, (v, _) in flagged.items()} == {**dict.fromkeys(map(str, range(5)), 0.0), "5": 1.0}
        assert {c: v for c, (v, _) in clusters.items()} == {"0": 1.0, "1": 1.0, "2": 1.0, "3": 2.0, "4": 2.0,
                                                            "5": 0.0}
        assert defended["5"] == (0.0, 0.0)
        assert plain["3"] == plain["4"]
        assert defended["3"][0] + defended["4"][0] == pytest.approx(plain["3"][0], rel=1e-12)
        for c in ("0", "1", "2"):
            assert defended[c] == plain[c]
    assert abs(booked_rows(run_dir, 2)["5"][0]) > 0  # the plain book pays the replay


def test_the_audit_recomputes_the_defended_rows_and_fails_a_changed_one(tmp_path, utility):  # noqa: F811
    run_dir = valued_run(tmp_path / "run", utility, replica_and_replay_handler(), range(6), num_rounds=2, books=BOTH)
    report = audit_run(run_dir, utility=utility)
    assert report.intact, report.problems
    with open(run_dir / "ledger.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    changed = next(row for row in rows if row["round"] == "2" and row["method"] == DEFENDED
                   and row["client_id"] == str(REPLICA))
    changed["value"] = repr(float(changed["value"]) * 2)  # the replica paid as a second copy
    forge_ledger_rows(run_dir, rows)  # a forger without a key: the chain, seals and manifest match the edit
    report = audit_run(run_dir, utility=utility)
    assert not report.intact
    assert any(p.startswith(f"recompute: round 2 {DEFENDED} of client {REPLICA}: value is booked")
               for p in report.problems), report.problems


def test_without_both_books_the_run_carries_no_trace_of_it(tmp_path, utility):  # noqa: F811
    for name, books in (("second-order", BookSettings(fixed_second_order=True)),
                        ("defences", BookSettings(defences=DefenceSettings()))):
        run_dir = valued_run(tmp_path / name, utility, make_handler(), range(4), num_rounds=1, books=books)
        methods = set(load_run(run_dir).ledger["method"])
        assert DEFENDED not in methods and (PLAIN in methods) == (name == "second-order")
        assert "second_order_defended" not in (run_dir / "run.json").read_text()
        assert all(b"second_order_defended" not in path.read_bytes() for path in round_record_paths(run_dir).values())
    assert json.loads((tmp_path / "second-order" / "run.json").read_text())["fixed_second_order"] is True


def test_the_payout_refuses_the_book_naming_it_and_why():
    ledger = pd.DataFrame({"round": [1, 1], "client_id": ["0", "1"], "method": [DEFENDED, DEFENDED],
                           "value": [0.2, 0.1], "status": ["ok", "ok"]})
    with pytest.raises(ValueError, match=rf"^method: {DEFENDED} is not paid by default: replicas of one participant's "
                                         r"update, each moved just past the clustering threshold .* paid as one claim "
                                         r"inflated to their summed claims, whatever the threshold "
                                         r"\(with the relative clusters, .* the defended second-order book\); pass "
                                         r"allow_undefended=True \(--allow-undefended\) to pay from it anyway\.$"):
        payout_table(ledger, 10.0, method=DEFENDED)
    paid = payout_table(ledger, 10.0, method=DEFENDED, allow_undefended=True)
    assert paid["undefended"].all() and paid["payment"].sum() == pytest.approx(10.0)
