"""The noisy-federation benchmark at its tiniest: one real run of every policy on one engine (Ray, real
Fashion-MNIST training) over a mixed federation (``tiny.TINY``: stale replayers, noisy updates, a
maverick), shared by this file's tests; each policy's decisions are checked against its rule replayed
on the books, every ledger audits intact, the paired test against random and the tables and figure are
written, stale replayers replay, and a second run continues instead of redoing."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedvalue.analysis.run_summary import load_run
from fedvalue.audit import rounding_envelope
from fedvalue.audit.checks import audit_run
from fedvalue.audit.round import recompute
from fedvalue.ledger import read_round
from fedvalue.rounds.kinds.value_weights import value_weight_outcome, weighting_rule
from fedvalue.run.ledger_reader import read_ledger_csv
from fedvalue.run.ledger_tables import csv_lines
from fedvalue.schema import LEDGER_COLUMNS, LedgerRow
from fedvalue.scoring.kernels import KERNEL_ENVIRONMENT
from simulations.experiments.noisy_federation.cells import (
    CURVE_FILE,
    Cell,
    plan,
    seed_federation,
)
from simulations.experiments.noisy_federation.config import check_config
from simulations.experiments.noisy_federation.noisy_federation import (
    audit_from_run,
    open_benchmark,
    run_benchmark,
)
from simulations.experiments.noisy_federation.policies import HonestOnlySampler
from strategies import GreedyFedSampler, PartitionSampler, ValueEliminationSampler
from tests.fedvalue.forgery import rechain
from tests.simulations.experiments.noisy_federation.tiny import TINY

ROOT = Path(__file__).resolve().parents[4]
CLIENTS = range(TINY.num_clients)


@pytest.fixture(scope="module")
def benchmark(tmp_path_factory) -> tuple[Path, dict]:
    """``TINY`` run once on one engine, shared by this file's tests: (its folder, its tables)."""
    out = tmp_path_factory.mktemp("noisy-federation")
    done = []
    tables = run_benchmark(TINY, out, on_cell=done.append)
    assert [c.policy for c in done] == ["clean", *TINY.policies]
    return out, tables


def cell(policy: str) -> Cell:
    return Cell("mlp", 0, 1.0, policy)


def books(out: Path, policy: str):
    return load_run(cell(policy).directory(out) / "run")


def trained(run, t: int) -> list[int]:
    return [int(c) for c in str(run.rounds.loc[run.rounds["round"] == t, "clients"].iloc[0]).split()]


def ledger_rows(run, t: int) -> list[LedgerRow]:
    frame = run.ledger[run.ledger["round"] == t]
    return [LedgerRow(int(r["round"]), int(r["client_id"]), r["method"], None if pd.isna(r["value"]) else r["value"],
                      r["stderr"], r["num_examples"], r["status"], r["noisy"], r["reason"])
            for r in frame.to_dict("records")]


def test_uniform_samplers_train_the_seeded_choice_and_the_oracle_only_honest_clients(benchmark):
    out, _ = benchmark
    fed = seed_federation(TINY, 0)
    uniform = PartitionSampler(4, seed=0)
    for policy in ("random", "topk-ads", "topk-loo", "value-weighted", "trimmed-mean", "median", "krum"):
        run = books(out, policy)
        assert [trained(run, t) for t in (1, 2, 3)] == [uniform.sample(t, CLIENTS) for t in (1, 2, 3)], policy
    oracle = books(out, "oracle")
    assert [trained(oracle, t) for t in (1, 2, 3)] == [HonestOnlySampler(4, fed.clean, seed=0).sample(t, CLIENTS)
                                                       for t in (1, 2, 3)]
    assert not {c for t in (1, 2, 3) for c in trained(oracle, t)} & fed.bad
    assert books(out, "random").ledger.empty  # it pays for no valuation and books none


def test_topk_accepts_the_k_best_by_its_score_and_value_weighting_books_the_rule_s_factors(benchmark):
    out, _ = benchmark
    for policy, score in (("topk-ads", "ads"), ("topk-loo", "loo")):
        ledger = books(out, policy).ledger
        for _, rows in ledger.groupby("round"):
            values = rows[rows["method"] == score].set_index("client_id")["value"]
            selected = rows[rows["method"] == "selected"].set_index("client_id")["value"]
            assert (selected == 1.0).sum() == 2
            assert set(selected[selected == 1.0].index) == set(values.sort_values(ascending=False, kind="mergesort")
                                                               .index[:2])
    for policy in ("value-weighted", "value-ucb"):
        ledger = books(out, policy).ledger
        for _, rows in ledger.groupby("round"):
            ads = rows[rows["method"] == "ads"].set_index("client_id")["value"].to_dict()
            weights = rows[rows["method"] == "value_weight"].set_index("client_id")["value"].to_dict()
            assert weights == pytest.approx(value_weight_outcome(weighting_rule("ads"), ads)[1])


def test_value_samplers_decide_as_their_rules_replayed_on_the_books(benchmark):
    out, _ = benchmark
    confidence = TINY.elimination_confidence
    for policy, make in (("greedyfed", lambda: GreedyFedSampler(4, seed=0)),
                         ("value-ucb", lambda: ValueEliminationSampler(4, confidence=confidence, selection="ucb", seed=0))):
        run, sampler = books(out, policy), make()
        decisions = pd.read_csv(cell(policy).directory(out) / "decisions.csv")
        for t in (1, 2, 3):
            assert trained(run, t) == sampler.sample(t, CLIENTS), (policy, t)
            sampler.observe(ledger_rows(run, t))
            if policy == "value-ucb":
                ruled_out = decisions[(decisions["round"] == t) & (decisions["decision"] == "ruled_out")]
                assert set(ruled_out["client"]) == set(sampler.flagged)


def test_power_of_choice_trains_the_highest_losses_its_candidates_report(benchmark):
    out, _ = benchmark
    run = books(out, "power-of-choice")
    decisions = pd.read_csv(cell("power-of-choice").directory(out) / "decisions.csv")
    for t in (1, 2, 3):
        losses = decisions[(decisions["round"] == t) & (decisions["decision"] == "local_loss")]
        assert len(losses) == TINY.poc_candidates
        top = losses.sort_values(["value", "client"], ascending=[False, True])["client"].iloc[:4]
        assert trained(run, t) == sorted(int(c) for c in top)


def test_every_ledger_audits_intact(benchmark):
    """Every cell's books audit intact with every value recomputed; value-ucb's cell is audited by
    the command line instead (test_fedvalue_audit_calls_a_cell_intact)."""
    out, _ = benchmark
    for each in plan(TINY):
        if each.policy == "value-ucb":
            continue
        run_dir = each.directory(out) / "run"
        saved = json.loads((run_dir / "run.json").read_text())
        report = audit_run(run_dir, **audit_from_run(saved))
        assert report.intact, (each, report.problems, report.unverifiable)
        assert any("recomputed every value" in c for c in report.checks), each


def test_fedvalue_audit_calls_a_cell_intact(benchmark):
    out, _ = benchmark
    result = subprocess.run([sys.executable, "-m", "simulations.cli", "audit",
                             str(cell("value-ucb").directory(out) / "run")],
                            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "recomputed every value of 3 rounds" in result.stdout and result.stdout.strip().endswith("intact")


#: A CPU's other MKL code path (conditional numerical reproducibility: float32 sums in another order) and
#: torch's portable kernels: the neg_loss utility rounds otherwise there (docs/faults-and-audit.md).
MKL_COMPATIBLE = {"MKL_CBWR": "COMPATIBLE"}
PORTABLE_TORCH = {"ATEN_CPU_CAPABILITY": "default"}


def audit_with(kernels: dict[str, str], run_dir: Path) -> subprocess.CompletedProcess:
    """``fedvalue audit run_dir`` in a process computing with ``kernels`` (this one's kernel settings dropped)."""
    environment = {k: v for k, v in os.environ.items() if k not in KERNEL_ENVIRONMENT}
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "simulations.cli", "audit", str(run_dir)], cwd=ROOT,
                          env={**environment, **kernels}, capture_output=True, text=True, timeout=600, check=False)


WITHIN_ROUNDING = "recompute only within float32 rounding of the utility on this machine"


@pytest.mark.parametrize("kernels", [pytest.param(MKL_COMPATIBLE, id="mkl-compatible-path"),
                                     pytest.param(PORTABLE_TORCH, id="torch-portable", marks=pytest.mark.slow)])
def test_a_loss_cell_audits_intact_where_the_kernels_round_otherwise(benchmark, kernels):
    """The value-weighted cell (MC-ADS, value weights from its values, A_t weighted by them), valued with
    neg_loss and audited where its sums round otherwise: its numbers differ past 1e-9, pass within their
    float32 rounding envelope measured there, and A_t is the run's own by its booked factors."""
    out, _ = benchmark
    audit = audit_with(kernels, cell("value-weighted").directory(out) / "run")
    assert audit.returncode == 0 and audit.stdout.strip().endswith(": intact"), audit.stdout[-3000:]
    assert WITHIN_ROUNDING in audit.stdout, audit.stdout[-3000:]


def _forge_values(run_dir: Path) -> tuple[str, str, float]:
    """Round 1's ADS value of one client moved up and another's down (group efficiency kept) by twice
    the larger of their rounding envelopes measured on this machine, re-chained and resealed (a forger
    without a key); (the two clients, the move)."""
    saved = json.loads((run_dir / "run.json").read_text())
    utility = audit_from_run(saved)["utility"]
    record = read_round(run_dir, 1)
    done = recompute(record, utility)
    envelope = rounding_envelope.measure(record, done.valuation, utility, state_of=done.state_of(record),
                                         realized=done.realized, recomputed=done.books.round_row, ok=done.ok)
    up, down = (str(c) for c in done.ok[:2])
    move = 2 * max(envelope.allowance(("ads", c, "value")) for c in (up, down))
    with open(run_dir / "ledger.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        if (row["round"], row["method"], row["client_id"]) in (("1", "ads", up), ("1", "ads", down)):
            row["value"] = repr(float(row["value"]) + (move if row["client_id"] == up else -move))
    (run_dir / "ledger.csv").write_text(",".join(LEDGER_COLUMNS) + "\n" + "".join(csv_lines(LEDGER_COLUMNS, rows)))
    read_ledger_csv(io.StringIO((run_dir / "ledger.csv").read_text(), newline="")).to_parquet(
        run_dir / "ledger.parquet", index=False)
    rechain(run_dir)
    return up, down, move


@pytest.mark.slow  # the fast sibling: tests/fedvalue/audit/test_rounding_envelope.py (the same check, one round)
def test_a_value_forged_past_its_rounding_envelope_fails_where_the_kernels_round_otherwise(benchmark, tmp_path):
    out, _ = benchmark
    forged = tmp_path / "forged"
    shutil.copytree(cell("topk-ads").directory(out) / "run", forged)
    up, down, move = _forge_values(forged)
    audit = audit_with(MKL_COMPATIBLE, forged)
    assert audit.returncode == 1 and audit.stdout.strip().endswith(": NOT intact"), audit.stdout[-3000:]
    failed = [line for line in audit.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 2, failed  # the two values, and nothing else: the chain and efficiency were kept
    for client in (up, down):
        assert any(f"round 1 ads of client {client}: value is booked" in line
                   and "float32 rounding of the utility moves it by at most" in line for line in failed), failed
    assert move < 1e-4  # what a forger may not do: a move this small, past rounding, is still found


def test_the_tables_and_the_figure(benchmark):
    out, tables = benchmark
    summary = tables["summary"]
    assert list(summary["policy"]) == ["clean", *TINY.policies]
    assert (summary["seeds"] == 1).all() and (out / "summary.csv").is_file() and (out / "accuracy-mlp.png").is_file()
    per_cell = tables["per_cell"].set_index("policy")
    assert per_cell.loc["oracle", "bad_trained_share"] == 0.0 and per_cell.loc["clean", "bad_trained_share"] == 0.0
    fed = seed_federation(TINY, 0)
    random = books(out, "random")
    slots = [c for t in (1, 2, 3) for c in trained(random, t)]
    assert per_cell.loc["random", "bad_trained_share"] == pytest.approx(np.mean([c in fed.bad for c in slots]))
    for measure in ("rounds_to_90", "rounds_to_95"):
        reached = per_cell[measure].dropna()
        assert reached.between(1, TINY.rounds).all()
    # Every run scores U(A_{t-1}) and U(A_t) for its books; a valuing policy pays for its coalitions on top.
    assert per_cell.loc["random", "valuation_seconds"] < per_cell.loc["greedyfed", "valuation_seconds"]
    curve = pd.read_csv(cell("random").directory(out) / CURVE_FILE)
    assert list(curve["round"]) == [0, 1, 2, 3] and curve["test_accuracy"].between(0, 1).all()


def test_a_second_run_continues_and_a_changed_setting_is_refused(benchmark):
    out, _ = benchmark
    stamps = {c: (c.directory(out) / CURVE_FILE).stat().st_mtime_ns for c in plan(TINY)}
    tables = run_benchmark(TINY, out)  # every cell done: no engine starts, the tables are rebuilt
    assert {c: (c.directory(out) / CURVE_FILE).stat().st_mtime_ns for c in plan(TINY)} == stamps
    assert len(tables["per_cell"]) == len(plan(TINY))
    with pytest.raises(ValueError, match="holds a benchmark run with other settings \\(rounds\\)"):
        open_benchmark(dataclasses.replace(TINY, rounds=4), out, overwrite=False)
    saved = json.loads((out / "benchmark.json").read_text())
    del saved["elimination_warm_start"]  # a setting the saved run predates had its default there
    (out / "benchmark.json").write_text(json.dumps(saved))
    open_benchmark(TINY, out, overwrite=False)
    with pytest.raises(ValueError, match="other settings \\(elimination_warm_start\\)"):
        (out / "benchmark.json").write_text(json.dumps(saved))
        open_benchmark(dataclasses.replace(TINY, elimination_warm_start=1), out, overwrite=False)
    open_benchmark(TINY, out, overwrite=False)


def test_a_mixed_federation_writes_the_paired_test_and_value_guard_values_by_its_own_round_game(benchmark):
    """Every cell of this mixed federation audits intact (test_every_ledger_audits_intact)."""
    out, tables = benchmark
    per_cell = tables["per_cell"]
    assert per_cell["maverick_accuracy"].between(0, 1).all()
    assert set(tables["paired"]["policy"]) == set(TINY.policies) - {"random"}
    rules = {c.policy: json.loads((c.directory(out) / "run" / "run.json").read_text())["coalition_rule"]
             for c in plan(TINY)}
    assert rules == {**{c.policy: "renormalized" for c in plan(TINY)},
                     "value-guard": "fixed-weight"}  # the policy's own round game; the others keep [ADS]'s
    guard = Cell("mlp", 0, 1.0, "value-guard", True).directory(out) / "run"
    settings = read_round(guard, 1).settings
    assert settings.coalition_rule == "fixed-weight" and settings.valuation.method == "second-order"


def test_stale_replayers_sent_the_model_of_their_previous_round(benchmark):
    out, _ = benchmark
    fed = seed_federation(TINY, 0)
    run_dir = Cell("mlp", 0, 1.0, "random", True).directory(out) / "run"
    received: dict[int, dict] = {}
    checked = 0
    for t in range(1, TINY.rounds + 1):
        record = read_round(run_dir, t)
        for client, reply in record.replies.items():
            if int(client) in fed.noisy:
                expected = received.get(int(client), record.start_arrays)
                assert all(np.array_equal(reply[k], expected[k]) for k in expected), (t, client)
                checked += 1
            received[int(client)] = record.start_arrays
    assert checked > 0


@pytest.mark.parametrize("change, match", [
    ({"policies": ("random", "fedsgd")}, "policies: expected distinct names"),
    ({"topk": 5}, "topk: expected at most clients_per_round=4"),
    ({"poc_candidates": 3}, "poc_candidates: expected d in \\[clients_per_round, num_clients\\]"),
    ({"krum_malicious": 1}, "krum_malicious: Krum needs clients_per_round > 2f \\+ 2"),
    ({"noisy_fraction": 0.6, "extra_bad_kind": "free-rider", "extra_bad_fraction": 0.4}, "a sum below 1"),
    ({"extra_bad_fraction": 0.0}, "give both"),
    ({"weighting_kind": "softmax"}, "weighting_temperature"),
    ({"final_window": 4}, "final_window: expected at most rounds=3"),
    ({"flip_probabilities": (0.0,)}, "flip_probabilities"),
])
def test_bad_settings_name_the_field(change, match):
    with pytest.raises(ValueError, match=match):
        check_config(dataclasses.replace(TINY, **change))
