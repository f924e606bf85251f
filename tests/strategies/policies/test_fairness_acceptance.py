"""Fairness-aware aggregation around FedAvg (drop-K, I-JACK) on real ClientApps, in process.

λ = 0 reweighting must leave the run FedAvg's bit for bit; λ > 0 and drop-K must act on the
booked fairness influences exactly as the rules say, and the audit must recompute it all.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from flwr.serverapp.strategy import FedAvg, FedAvgM

from fedvalue.audit.round import recompute_books
from fedvalue.audit.checks import audit_run
from fedvalue.rounds.fairness_round import FairnessPlugin, RoundFairness, policy_outcome
from fedvalue.run.archive import read_round_record, round_record_paths
from fedvalue.scoring.fairness.objectives import GroupFairness, drop_k, ijack_factors
from fedvalue.analysis.run_summary import load_run
from strategies import AcceptAll, FairDropK, FairReweight, TopK, ValuingStrategy
from strategies.policies.sampling import PartitionSampler
from strategies.aggregation.reaggregate import replay_aggregator
from strategies.book_settings import BookSettings

from tests.strategies.harness.bare_and_wrapped import assert_untouched_and_sound, one_torch_thread, run  # noqa: F401
from tests.strategies.test_conformance import FEATURES, SETUP, model_factory


def fairness_objective() -> GroupFairness:
    rng = np.random.default_rng(9)
    x = rng.normal(size=(300, FEATURES)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int64) + (x[:, 2] > 1)).clip(0, 2)
    sensitive = (x[:, 1] > 0).astype(np.int64)
    return GroupFairness(model_factory(), x, y, sensitive, gap="dp")


def fedavg() -> FedAvg:
    return FedAvg(fraction_evaluate=0.0)


def rows(valuing: ValuingStrategy, method: str) -> pd.DataFrame:
    ledger = load_run(valuing.ledger.run_dir).ledger
    return ledger[ledger["method"] == method]


def test_ijack_with_lambda_zero_is_fedavg_bit_for_bit():
    bare = run(SETUP, fedavg, wrapped=False)
    wrapped = run(SETUP, fedavg, wrapped=True,
                  valuing_options={"books": BookSettings(fairness=fairness_objective()), "acceptance": FairReweight(0.0)})
    assert_untouched_and_sound(SETUP, bare, wrapped)


def booked_run(tmp_path, acceptance, name):
    options = {"books": BookSettings(fairness=fairness_objective()), "acceptance": acceptance,
               "run_dir": str(tmp_path / name),
               "sampler": PartitionSampler(SETUP.num_clients, seed=0)}
    return run(SETUP, fedavg, wrapped=True, valuing_options=options).valuing


def test_ijack_and_drop_k_act_on_the_booked_influences_and_the_audit_recomputes_them(tmp_path):
    fairness = fairness_objective()
    reweighted = booked_run(tmp_path, FairReweight(50.0), "ijack")
    influence = rows(reweighted, "fairness_influence")
    weights = rows(reweighted, "fair_weight")
    assert len(influence) == SETUP.num_clients * SETUP.rounds
    for t, group in influence.groupby("round"):
        expected = ijack_factors(dict(zip(group["client_id"], group["value"])), 50.0)
        booked = dict(zip(weights[weights["round"] == t]["client_id"], weights[weights["round"] == t]["value"]))
        assert booked == pytest.approx(expected, rel=1e-12)
    assert not np.allclose(weights["value"], 1.0)  # λ = 50 really reweights
    report = audit_run(reweighted.ledger.run_dir, utility=SETUP.make_utility(), fairness=fairness)
    assert report.intact, (report.problems, report.unverifiable)
    assert any("recomputed every value of 3 rounds" in c for c in report.checks), report.checks
    # Without the fairness objective the fairness books cannot be checked: not verifiable, never intact.
    skipped = audit_run(reweighted.ledger.run_dir, utility=SETUP.make_utility())
    assert skipped.ok and not skipped.intact and skipped.verdict == "NOT verifiable"
    assert any("NOT recomputed without the run's fairness objective" in u for u in skipped.unverifiable)

    dropped = booked_run(tmp_path, FairDropK(2), "dropk")
    influence = rows(dropped, "fairness_influence")
    selected = rows(dropped, "selected")
    for t, group in influence.groupby("round"):
        out = drop_k(dict(zip(group["client_id"], group["value"])), 2)
        marks = dict(zip(selected[selected["round"] == t]["client_id"], selected[selected["round"] == t]["value"]))
        assert {c for c, v in marks.items() if v == 0.0} == out
    report = audit_run(dropped.ledger.run_dir, utility=SETUP.make_utility(), fairness=fairness)
    assert report.intact, (report.problems, report.unverifiable)


def test_valuing_on_fairness_alone_gives_the_fairness_books_of_a_run_that_books_both(tmp_path):
    # U = −gap as the run's only utility: its ADS and LOO are the ads_fairness and
    # loo_fairness rows booked beside accuracy (same rounds, same game, same estimator).
    both = booked_run(tmp_path, AcceptAll(), "both")
    alone = run(SETUP, fedavg, wrapped=True,
                valuing_options={"utility": fairness_objective(), "run_dir": str(tmp_path / "alone"),
                                 "sampler": PartitionSampler(SETUP.num_clients, seed=0)}).valuing
    for method in ("ads", "loo"):
        expected = rows(both, f"{method}_fairness")[["round", "client_id", "value"]].reset_index(drop=True)
        got = rows(alone, method)[["round", "client_id", "value"]].reset_index(drop=True)
        assert len(got) == SETUP.num_clients * SETUP.rounds
        pd.testing.assert_frame_equal(got, expected)
    assert not (rows(both, "ads")["value"].to_numpy() == rows(both, "ads_fairness")["value"].to_numpy()).all()


def test_the_audit_catches_a_changed_influence(tmp_path):
    valuing = booked_run(tmp_path, FairDropK(1), "changed")
    path = valuing.ledger.ledger_path
    lines = path.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if ",fairness_influence," in line)
    fields = lines[index].split(",")
    fields[3] = repr(float(fields[3]) + 0.5)
    lines[index] = ",".join(fields)
    path.write_text("".join(lines))
    report = audit_run(valuing.ledger.run_dir, utility=SETUP.make_utility(), fairness=fairness_objective())
    assert not report.ok
    assert any("fairness_influence" in p for p in report.problems), report.problems


def test_fairness_policies_refuse_to_run_without_a_fairness_objective():
    with pytest.raises(ValueError, match=r"acceptance: the policy FairDropK\(k=1\) reads .fairness., which no book of this run "
                                         r"offers; pass books=BookSettings\(fairness=GroupFairness"):
        ValuingStrategy(fedavg(), SETUP.make_utility(), acceptance=FairDropK(1))
    with pytest.raises(ValueError, match="FairReweight changes the aggregation weights"):
        ValuingStrategy(
            fedavg(), SETUP.make_utility(), acceptance=FairReweight(1.0),
            books=BookSettings(flows=True, fairness=fairness_objective())
        )
    with pytest.raises(ValueError, match="lam: expected a finite number ≥ 0"):
        FairReweight(-1.0)
    with pytest.raises(ValueError, match="k: expected a non-negative integer"):
        FairDropK(-2)
    with pytest.raises(ValueError, match="rule: expected one of"):
        policy_outcome({"rule": "drop-all"}, {})


def test_fairness_books_leave_the_accuracy_books_unchanged(tmp_path):
    """Adding fairness books adds rows; every row the run books without them stays the same."""
    plain = run(SETUP, fedavg, wrapped=True, valuing_options={
        "run_dir": str(tmp_path / "plain"), "sampler": PartitionSampler(SETUP.num_clients, seed=0),
        "acceptance": TopK(SETUP.num_clients, score="ads")}).valuing
    fair = run(SETUP, fedavg, wrapped=True, valuing_options={
        "run_dir": str(tmp_path / "fair"), "sampler": PartitionSampler(SETUP.num_clients, seed=0),
        "acceptance": FairDropK(0), "books": BookSettings(fairness=fairness_objective())}).valuing
    a = load_run(plain.ledger.run_dir).ledger
    b = load_run(fair.ledger.run_dir).ledger
    b = b[~b["method"].isin(["ads_fairness", "loo_fairness", "fairness_influence"])]
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))


def same_fairness(a: RoundFairness, b: RoundFairness) -> bool:
    """Bit-for-bit the same round fairness books (valuation, influences, weights, factors, curvature)."""
    if (a.valuation is None) != (b.valuation is None) or a.influences != b.influences or a.weights != b.weights:
        return False
    if a.factors != b.factors or a.curvature != b.curvature:
        return False
    return a.valuation is None or all(
        np.array_equal(a.valuation.results[m].values, b.valuation.results[m].values)
        and np.array_equal(a.valuation.results[m].stderr, b.valuation.results[m].stderr) for m in a.valuation.results)


@pytest.mark.parametrize("acceptance", [FairReweight(50.0), FairDropK(1)], ids=["ijack", "drop-k"])
def test_the_live_hook_and_the_audit_compute_each_round_s_fairness_by_the_same_plugin(tmp_path, monkeypatch,
                                                                                       acceptance):
    # Every FairnessPlugin.value/decide call, live and in the audit, with what it returned.
    calls: list[tuple[str, FairnessPlugin, object]] = []
    value, decide = FairnessPlugin.value, FairnessPlugin.decide

    def spy_value(self, *args, **keywords):
        calls.append(("value", self, fair := value(self, *args, **keywords)))
        return fair

    def spy_decide(self, fair):
        calls.append(("decide", self, outcome := decide(self, fair)))
        return outcome

    monkeypatch.setattr(FairnessPlugin, "value", spy_value)
    monkeypatch.setattr(FairnessPlugin, "decide", spy_decide)
    valuing = booked_run(tmp_path, acceptance, "live")
    live, calls[:] = list(calls), []
    assert [kind for kind, _, _ in live] == ["value", "decide"] * SETUP.rounds
    records = {t: read_round_record(path) for t, path in round_record_paths(valuing.ledger.run_dir).items()}
    assert sorted(records) == list(range(1, SETUP.rounds + 1))
    for t, record in records.items():
        *_, problems = recompute_books(record, SETUP.make_utility(), fairness=fairness_objective())
        assert problems == [], problems
        (_, audit_plugin, audit_value), (_, _, (chosen, audit_books)) = calls
        (_, live_plugin, live_value), (_, _, (_, live_books)) = live[2 * (t - 1): 2 * t]
        assert (audit_plugin.rule, audit_plugin.damping) == (live_plugin.rule, live_plugin.damping) == (
            acceptance.fairness_rule, None)
        assert same_fairness(audit_value, live_value) and same_fairness(audit_books, live_books)
        assert chosen == set(record.accepted)  # the accepted set the live policy chose is the rule's
        assert (live_books.factors is not None) == isinstance(acceptance, FairReweight)
        calls.clear()

    # A record whose accepted set is not the rule's choice is caught.
    record = records[1]
    tampered = dataclasses.replace(record, accepted=[c for c in record.accepted if c != record.accepted[0]])
    *_, problems = recompute_books(tampered, SETUP.make_utility(), fairness=fairness_objective())
    assert any(f"the {acceptance.fairness_rule['rule']} rule accepts" in p and "the record accepted" in p
               for p in problems), problems


def test_a_strategy_s_own_aggregation_values_the_fairness_game_live_and_in_the_recompute(tmp_path):
    # FedAvgM's momentum moves A_t away from the weighted mean: the plug-in values the fairness
    # game with the strategy's own Agg live, and the recompute hands it the replayed one (the
    # audit itself still leaves such rounds unverified; this is the recompute it would run).
    def momentum() -> FedAvgM:
        return FedAvgM(fraction_evaluate=0.0, server_momentum=0.9)

    options = {"books": BookSettings(fairness=fairness_objective()), "acceptance": AcceptAll(),
               "run_dir": str(tmp_path / "momentum"), "sampler": PartitionSampler(SETUP.num_clients, seed=0)}
    valuing = run(SETUP, momentum, wrapped=True, valuing_options=options).valuing
    ledger = load_run(valuing.ledger.run_dir).ledger
    booked = {(int(r["round"]), str(r["client_id"]), r["method"]): r["value"] for r in ledger.to_dict("records")
              if str(r["method"]).endswith("_fairness")}
    replay = replay_aggregator(momentum)
    for t, path in round_record_paths(valuing.ledger.run_dir).items():
        books, *_ = recompute_books(read_round_record(path), SETUP.make_utility(),
                                    fairness=fairness_objective(), replay=replay)
        recomputed = {(t, str(r.client_id), str(r.method)): r.value for r in books.ledger_rows
                      if str(r.method).endswith("_fairness")}
        assert recomputed and recomputed == pytest.approx({k: v for k, v in booked.items() if k[0] == t}, rel=1e-9)
