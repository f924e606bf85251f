"""Fairness influence with curvature and the exact-drop rule on real ClientApps, in process:
the clients' loss gradients and Fisher diagonals reach the record, the curvature rows and the
rules act on what is booked, and the audit books it again (a changed row fails it)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array
from flwr.serverapp.strategy import FedAvg

from clients.app import partition_id_of
from clients.training import loss_gradient_and_fisher, set_model_arrays
from fedvalue.run.archive import read_round_record, round_record_paths
from fedvalue.audit.checks import audit_run
from fedvalue.scoring.fairness.curvature import curvature_influences
from fedvalue.scoring.fairness.objectives import drop_k, fedavg_weight_derivatives
from fedvalue.analysis.run_summary import load_run
from fedvalue.schema import Method, Status
from strategies import FairDropK, ValuingStrategy
from strategies.protocol import CURVATURE_KEY
from strategies.policies.sampling import PartitionSampler
from fedvalue.valuation.settings import ValuationSettings
from strategies.book_settings import BookSettings

from tests.strategies.harness.bare_and_wrapped import one_torch_thread, run  # noqa: F401
from tests.strategies.harness.inprocess import set_server_identity
from tests.strategies.test_conformance import SETUP, load_client, model_factory
from tests.strategies.policies.test_fairness_acceptance import fairness_objective, rows

DAMPING = 0.5


def fedavg() -> FedAvg:
    return FedAvg(fraction_evaluate=0.0)


def booked_run(tmp_path, acceptance, name):
    options = {"books": BookSettings(fairness=fairness_objective(), fair_curvature=DAMPING), "acceptance": acceptance,
               "run_dir": str(tmp_path / name), "sampler": PartitionSampler(SETUP.num_clients, seed=0)}
    return run(SETUP, fedavg, wrapped=True, valuing_options=options).valuing


def by_id(frame) -> dict:
    return {str(c): float(v) for c, v in zip(frame["client_id"], frame["value"])}


def marks_by_round(valuing, scores_of):
    selected = rows(valuing, "selected")
    for t, group in selected.groupby("round"):
        dropped = {c for c, v in zip(group["client_id"], group["value"]) if v == 0.0}
        yield t, dropped, scores_of(t)


@pytest.fixture(scope="module")
def curvature_run(tmp_path_factory):
    set_server_identity()  # the per-test fixture has not run yet for a module fixture
    return booked_run(tmp_path_factory.mktemp("curvature"), FairDropK(1, score="curvature"), "curvature")


def test_clients_answer_with_their_loss_gradient_and_fisher_diagonal_and_the_rule_acts_on_them(curvature_run):
    fairness = fairness_objective()
    records = {t: read_round_record(p) for t, p in round_record_paths(curvature_run.ledger.run_dir).items()}
    assert sorted(records) == list(range(1, SETUP.rounds + 1))
    booked = rows(curvature_run, "fairness_influence_curvature")
    derivative = rows(curvature_run, "fairness_weight_derivative")
    for t, record in records.items():
        assert sorted(record.loss_gradients) == sorted(record.replies)
        for client, gradient in record.loss_gradients.items():  # what the client computes at A_{t−1}
            data = load_client(int(client))
            expected = loss_gradient_and_fisher(set_model_arrays(model_factory(), record.start_arrays),
                                                data.x_train, data.y_train)
            for key in gradient:
                np.testing.assert_allclose(gradient[key], expected[0][key], rtol=1e-12, atol=1e-15)
                np.testing.assert_allclose(record.fisher_diagonals[client][key], expected[1][key], rtol=1e-12, atol=1e-15)
        influences = curvature_influences(fairness.gradient(record.start_arrays), record.loss_gradients,
                                          record.fisher_diagonals, damping=DAMPING)
        this = booked[booked["round"] == t]
        assert by_id(this) == pytest.approx({str(c): v for c, v in influences.items()}, rel=1e-12)
        expected = fedavg_weight_derivatives(influences, record.weights)
        this = derivative[derivative["round"] == t]
        assert by_id(this) == pytest.approx({str(c): v for c, v in expected.items()}, rel=1e-12, abs=1e-15)

    def scores(t):
        this = derivative[derivative["round"] == t]
        return dict(zip(this["client_id"], this["value"]))
    drops = 0
    for t, dropped, score in marks_by_round(curvature_run, scores):
        assert dropped == drop_k(score, 1)
        drops += len(dropped)
    assert drops > 0  # the rule really dropped clients
    ledger = load_run(curvature_run.ledger.run_dir).ledger  # the ledger's named vocabulary
    assert {"ads_fairness", "fairness_influence_curvature", "selected"} <= set(ledger["method"]) <= set(Method)
    assert set(ledger["status"]) <= set(Status)
    report = audit_run(curvature_run.ledger.run_dir, utility=SETUP.make_utility(), fairness=fairness)
    assert report.intact, (report.problems, report.unverifiable)


def test_the_exact_drop_rule_drops_the_client_whose_removal_lowers_the_gap_most(tmp_path):
    valuing = booked_run(tmp_path, FairDropK(1, score="exact"), "exact")
    loo = rows(valuing, "loo_fairness")

    def scores(t):
        this = loo[loo["round"] == t]
        return {c: -v for c, v in zip(this["client_id"], this["value"])}
    drops = 0
    for t, dropped, score in marks_by_round(valuing, scores):
        assert dropped == drop_k(score, 1)
        drops += len(dropped)
    assert drops > 0
    report = audit_run(valuing.ledger.run_dir, utility=SETUP.make_utility(), fairness=fairness_objective())
    assert report.intact, (report.problems, report.unverifiable)


@pytest.mark.parametrize("method", ["fairness_influence_curvature", "fairness_weight_derivative"])
def test_the_audit_catches_a_changed_curvature_row(curvature_run, method, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(curvature_run.ledger.run_dir, copy)
    path = copy / "ledger.csv"
    lines = path.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if f",{method}," in line)
    fields = lines[index].split(",")
    fields[3] = repr(float(fields[3]) + 1e-3)
    lines[index] = ",".join(fields)
    path.write_text("".join(lines))
    report = audit_run(copy, utility=SETUP.make_utility(), fairness=fairness_objective())
    assert not report.ok
    assert any(method in p for p in report.problems), report.problems


def test_curvature_options_are_refused_when_they_cannot_be_honoured():
    with pytest.raises(ValueError, match="fair_curvature: the acceptance policy FairDropK"):
        ValuingStrategy(
            fedavg(), SETUP.make_utility(), acceptance=FairDropK(1, score="curvature"),
            books=BookSettings(fairness=fairness_objective())
        )
    with pytest.raises(ValueError, match="fair_curvature: fairness influence with curvature needs"):
        ValuingStrategy(fedavg(), SETUP.make_utility(), books=BookSettings(fair_curvature=1.0))
    with pytest.raises(ValueError, match="score: 'exact' acts on LOO"):
        ValuingStrategy(
            fedavg(), SETUP.make_utility(), acceptance=FairDropK(1, score="exact"),
            valuation=ValuationSettings(methods=("ads",)), books=BookSettings(fairness=fairness_objective())
        )
    with pytest.raises(ValueError, match="score: expected one of"):
        FairDropK(1, score="hessian")


def negative_fisher_from_client_0(msg, context, call_next):
    """A client mod: client 0 sends a Fisher diagonal with a negative entry (not a sum of squares)."""
    reply = call_next(msg, context)
    if partition_id_of(context) == 0 and CURVATURE_KEY in reply.content.array_records:
        record = reply.content.array_records[CURVATURE_KEY]
        key = next(k for k in record if k.startswith("fisher/"))
        bad = record[key].numpy().copy()
        bad.flat[0] = -1.0
        record[key] = Array(bad)
    return reply


def test_a_client_sending_a_malformed_curvature_is_failed_with_its_reason_and_cannot_stop_the_round(tmp_path):
    options = {"books": BookSettings(fairness=fairness_objective(), fair_curvature=DAMPING),
               "acceptance": FairDropK(1, score="curvature"), "run_dir": str(tmp_path / "bad"),
               "sampler": PartitionSampler(SETUP.num_clients, seed=0)}
    valuing = run(SETUP, fedavg, wrapped=True, mods=[negative_fisher_from_client_0], valuing_options=options).valuing
    booked = rows(valuing, "fairness_influence_curvature")
    sender = booked["client_id"].astype(str) == "0"
    # Its reply is not usable: failed, with a reason naming the field; the others are valued.
    assert (booked.loc[sender, "status"] == "failed").all() and booked.loc[sender, "value"].isna().all()
    assert booked.loc[sender, "reason"].str.startswith("fair-curvature fisher").all()
    assert (~sender).sum() == SETUP.rounds * (SETUP.num_clients - 1) and booked.loc[~sender, "value"].notna().all()
    for record in (read_round_record(p) for p in round_record_paths(valuing.ledger.run_dir).values()):
        assert 0 not in record.loss_gradients and len(record.loss_gradients) == SETUP.num_clients - 1
    report = audit_run(valuing.ledger.run_dir, utility=SETUP.make_utility(), fairness=fairness_objective())
    assert report.intact, (report.problems, report.unverifiable)
