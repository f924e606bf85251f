"""TracIn flows booked through a random projection (BookSettings(flows_projection_dim=k)), with the real
ClientApp behind an in-process grid, real round records and the real audit.

References are independent of the code under test: each client's inference gradient by torch autograd at
the state the round started from, R_t column by column, and F̂(u→v) = −p_u (R_t Δ_u)·(R_t g_v) by explicit
pairwise loops over the vectors the record keeps.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAvg

from fedvalue.audit.checks import audit_run
from fedvalue.audit.round import settings_problems
from fedvalue.flows.projected_flows import FlowsProjection
from fedvalue.analysis.run_summary import load_run
from fedvalue.run.archive import load_npz, read_round, record_path, write_round_record
from strategies import PartitionSampler, TopK, ValuingStrategy
from strategies.arrays import numpy_to_arrays
from strategies.book_settings import BookSettings

from tests.fedvalue.forgery import rebook_last_round, rechain, reseal
from tests.fedvalue.flows.test_round_flows import python_dot
from tests.strategies.harness.inprocess import set_server_identity
from tests.strategies.hooks.test_flow_books import (NUM_CLIENTS, client_app_grid, flat, inference_gradient,
                                                   initial_state, load_client, utility)

ROUNDS, K, P = 3, 4, 10  # the model Linear(4, 2): p = 10 parameters


def run_with(run_dir, books: BookSettings, **options):
    set_server_identity()
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility(), run_dir=str(run_dir),
                               sampler=PartitionSampler(4, seed=1), seed=3, books=books, **options)
    strategy.start(client_app_grid(load_client), numpy_to_arrays(initial_state()), num_rounds=ROUNDS, timeout=10,
                   train_config=ConfigRecord({"lr": 0.1, "local-epochs": 2, "batch-size": 0, "seed": 0}))
    return run_dir


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    return run_with(tmp_path_factory.mktemp("plain"), BookSettings(flows=True))


@pytest.fixture(scope="module")
def projected_run(tmp_path_factory):
    return run_with(tmp_path_factory.mktemp("projected"), BookSettings(flows=True, flows_projection_dim=K))


def copy_of(run_dir, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    return target


def test_flows_are_booked_from_the_recorded_vectors_which_are_r_of_the_real_gradients_and_updates(projected_run):
    ledger = load_run(projected_run).ledger
    noted = json.loads((projected_run / "run.json").read_text())["flows_projection"]
    assert noted == FlowsProjection.of_run(K, 3).as_json()
    for t in range(1, ROUNDS + 1):
        record = read_round(projected_run, t)
        assert record.settings.flows_projection == noted and record.gradients == {}
        assert sorted(record.projected_gradients) == list(range(NUM_CLIENTS))  # idle clients too
        r = FlowsProjection.from_json(noted).for_round(P, t).project_many(np.eye(P)).T  # R_t, k × p
        start = record.start_arrays
        for v, kept in record.projected_gradients.items():
            np.testing.assert_allclose(kept, r @ inference_gradient(v, start, load_client)[1], rtol=1e-5, atol=1e-6)
        for u in record.accepted:
            np.testing.assert_allclose(record.projected_updates[u], r @ (flat(record.replies[u]) - flat(start)),
                                       rtol=1e-12, atol=1e-12)
        total = sum(record.weights[u] for u in record.accepted)
        expected = {v: {"tracin_inflow": 0.0, "tracin_outflow": 0.0, "tracin_self": 0.0} for v in range(NUM_CLIENTS)}
        for u in record.accepted:
            for v, g in record.projected_gradients.items():
                flow = -(record.weights[u] / total) * python_dot(record.projected_updates[u], g.astype(np.float64))
                if u == v:
                    expected[u]["tracin_self"] += flow
                else:
                    expected[u]["tracin_outflow"] += flow
                    expected[v]["tracin_inflow"] += flow
        booked = ledger[(ledger["round"] == t) & ledger["method"].str.startswith("tracin")]
        booked = booked.pivot(index="client_id", columns="method", values="value")
        assert len(booked) == NUM_CLIENTS
        for v, methods in expected.items():
            for method, value in methods.items():
                assert booked.loc[str(v), method] == pytest.approx(value, rel=1e-9, abs=1e-12)


def test_with_k_at_least_p_the_books_are_the_unprojected_runs_byte_for_byte(plain_run, tmp_path):
    identity = run_with(tmp_path / "identity", BookSettings(flows=True, flows_projection_dim=P))
    for name in ("ledger.csv", "first_order.csv"):
        assert (identity / name).read_bytes() == (plain_run / name).read_bytes(), name
    record = read_round(identity, 2)
    assert record.settings.flows_projection["dim"] == P and record.gradients == {}
    full = read_round(plain_run, 2)
    for v, g in full.gradients.items():  # R = I: the client's own float32 gradient, as sent
        np.testing.assert_array_equal(record.projected_gradients[v], flat(g).astype(np.float32))


def test_a_projected_record_keeps_k_numbers_a_client_instead_of_p(plain_run, projected_run):
    projected, _ = load_npz(record_path(projected_run, 1))
    full, _ = load_npz(record_path(plain_run, 1))
    assert not [m for m in projected if m.startswith("gradient/")]
    assert sum(full[m].size for m in full if m.startswith("gradient/")) == NUM_CLIENTS * P
    assert projected["projected-gradients"].shape == (NUM_CLIENTS, K)
    assert projected["projected-gradients"].dtype == np.float32
    assert projected["projected-updates"].shape == (4, K) and projected["projected-updates"].dtype == np.float64
    assert record_path(projected_run, 1).stat().st_size < record_path(plain_run, 1).stat().st_size


def test_the_audit_recomputes_a_projected_run_intact(projected_run):
    report = audit_run(projected_run, utility=utility())
    assert report.ok, report.problems
    assert any(f"recomputed every value of {ROUNDS} rounds" in c for c in report.checks)


def test_a_changed_projected_gradient_is_caught_by_recomputing_the_flows(projected_run, tmp_path):
    run_dir = copy_of(projected_run, tmp_path)
    record = read_round(run_dir, 2)
    idle = next(c for c in record.projected_gradients if c not in record.statuses)
    record.projected_gradients[idle] = record.projected_gradients[idle] * np.float32(1.5)
    write_round_record(run_dir, record)
    reseal(run_dir)  # a forger rewrites the seals too
    report = audit_run(run_dir, utility=utility())
    assert not report.ok
    assert any(p.startswith(f"recompute: round 2 tracin_inflow of client {idle}") for p in report.problems), \
        report.problems


def test_a_projected_update_that_is_not_r_of_its_reply_is_caught_even_with_the_books_rebooked(projected_run, tmp_path):
    run_dir = copy_of(projected_run, tmp_path)
    record = read_round(run_dir, ROUNDS)
    client = record.accepted[0]
    record.projected_updates[client] = record.projected_updates[client] * 2.0
    rebook_last_round(run_dir, record, utility(), ())  # the flows now agree with the forged vector
    rechain(run_dir)
    report = audit_run(run_dir, utility=utility())
    assert not report.ok
    assert any(f"round {ROUNDS}: the projected update of client {client} is not R_t" in p
               for p in report.problems), report.problems
    assert not any("tracin" in p for p in report.problems)  # the rebooked flows themselves recompute


def test_top_k_by_outflow_ranks_the_projected_outflows_and_audits_intact(tmp_path):
    run_dir = run_with(tmp_path / "topk", BookSettings(flows=True, flows_projection_dim=K),
                       acceptance=TopK(2, "tracin_outflow"))
    for t in range(1, ROUNDS + 1):
        record = read_round(run_dir, t)
        ok = [e.client_id for e in record.entries if e.status == "ok"]
        total = sum(record.weights[u] for u in ok)
        outflow = {u: sum(-(record.weights[u] / total) * python_dot(record.projected_updates[u], g.astype(np.float64))
                          for v, g in record.projected_gradients.items() if v != u) for u in ok}
        assert set(record.accepted) == set(sorted(ok, key=lambda u: -outflow[u])[:2])
    report = audit_run(run_dir, utility=utility())
    assert report.ok, report.problems


def test_a_record_noting_another_projection_than_run_json_is_not_taken_on(projected_run):
    record = read_round(projected_run, 1)
    config = json.loads((projected_run / "run.json").read_text())
    assert settings_problems(record, config) == []
    other = {**config, "flows_projection": FlowsProjection.of_run(K, 4).as_json()}
    assert any("its flows projection is" in p for p in settings_problems(record, other))


@pytest.mark.parametrize("acceptance", [None, "top-k"])
def test_a_record_that_drops_an_ok_replys_projected_update_is_caught(projected_run, tmp_path, acceptance):
    """Every ok reply is projected by the writer, so a record without one of them (an aggregated client's, or one
    that Top-K by outflow left out of the aggregate) has a vector kept out of the flows: named, NOT intact."""
    if acceptance is None:
        run_dir = copy_of(projected_run, tmp_path)
    else:
        run_dir = run_with(tmp_path / "topk", BookSettings(flows=True, flows_projection_dim=K),
                           acceptance=TopK(2, "tracin_outflow"))
    record = read_round(run_dir, ROUNDS)
    ok = [e.client_id for e in record.entries if e.status == "ok"]
    dropped = next(c for c in ok if (c in record.accepted) == (acceptance is None))
    del record.projected_updates[dropped]
    write_round_record(run_dir, record)
    reseal(run_dir)
    report = audit_run(run_dir, utility=utility())
    assert not report.ok
    assert any(p.startswith(f"recompute: round {ROUNDS}: its record keeps no projected update of clients whose reply "
                            f"was ok: "
                            f"[{dropped!r}]") for p in report.problems), report.problems
