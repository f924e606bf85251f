"""The hash-chained ledger and its audit: intact runs pass, any single tampered value fails."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedvalue.audit.checks import audit_run
from fedvalue.analysis.run_summary import load_run
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.schema import LedgerRow, RoundRow
from simulations.cli.main import main
from tests.fedvalue.forgery import rechain


def write_run(run_dir, rounds=3, clients=4, seed=0):
    """A real ledger: ADS rows that satisfy group efficiency, LOO rows, a failed client."""
    rng = np.random.default_rng(seed)
    writer = LedgerWriter(run_dir, config={"seed": seed, "simulation": "test"})
    before = 0.1
    for t in range(1, rounds + 1):
        values = rng.normal(0.02, 0.01, clients)
        after = before + float(values.sum())
        rows = []
        for c in range(clients):
            for method, value in (("ads", values[c]), ("loo", values[c] / 2)):
                rows.append({"round": t, "client_id": c, "method": method, "value": float(value), "stderr": 0.0,
                             "num_examples": 10 + c, "status": "ok", "noisy": c == 0})
        rows.append({"round": t, "client_id": clients, "method": "ads", "value": None, "stderr": None,
                     "num_examples": None, "status": "failed", "noisy": False})
        writer.write_round(RoundRow(round=t, clients=" ".join(map(str, range(clients + 1))), num_clients=clients + 1,
                                    num_failed=1, utility_before=before, utility_after=after,
                                    utility_realized=after, num_evaluations=2**clients, valuation_seconds=0.01,
                                    ads_method="ads-exact", efficiency_gap=0.0),
                           [LedgerRow.from_mapping(row) for row in rows])
        before = after
    writer.close(rounds)  # the final manifest: the run is complete
    return run_dir


def test_an_intact_run_passes_every_check(tmp_path):
    report = audit_run(write_run(tmp_path))
    assert report.ok, report.problems
    assert report.rounds == 3 and report.ledger_rows == 27
    assert any("hash chain intact" in c for c in report.checks)
    assert any("group efficiency" in c for c in report.checks)
    assert load_run(tmp_path).rounds["hash"].str.fullmatch("[0-9a-f]{64}").all()


def write_run_with_ground_truth(run_dir, noisy_clients=(0,)):
    """A run whose writer joins its noisy clients (named in run.json too) into rows that leave
    ``noisy`` unknown, as a round's books do."""
    writer = LedgerWriter(run_dir, config={"seed": 0, "noisy_clients": sorted(noisy_clients)},
                          noisy_clients=set(noisy_clients))
    for t in (1, 2):
        rows = [{"round": t, "client_id": c, "method": "ads", "value": 0.25, "stderr": 0.0, "num_examples": 10,
                 "status": "ok"} for c in range(3)]
        writer.write_round(RoundRow(round=t, clients="0 1 2", num_clients=3, num_failed=0, utility_before=0.0,
                                    utility_after=0.75, utility_realized=0.75, num_evaluations=8,
                                    valuation_seconds=0.01, ads_method="ads-exact", efficiency_gap=0.0),
                           [LedgerRow.from_mapping(row) for row in rows])
    writer.close(2)
    return run_dir


def test_the_noisy_column_is_checked_against_the_runs_noisy_clients(tmp_path):
    run_dir = write_run_with_ground_truth(tmp_path / "run")
    report = audit_run(run_dir)
    assert report.ok, report.problems
    assert any("noisy column marks exactly the run's 1 noisy clients" in c for c in report.checks)
    assert not audit_run(run_dir, noisy_clients={0, 2}).ok  # run.json names other noisy clients


def test_one_flipped_noisy_cell_fails_the_audit_naming_its_round_and_client(tmp_path):
    run_dir = write_run_with_ground_truth(tmp_path / "run")
    ledger = run_dir / "ledger.csv"
    lines = ledger.read_text().splitlines(keepends=True)
    flipped = next(k for k, line in enumerate(lines) if line.startswith("2,1,ads,"))
    assert ",false," in lines[flipped]
    lines[flipped] = lines[flipped].replace(",false,", ",true,")
    ledger.write_text("".join(lines))
    frame = pd.read_parquet(run_dir / "ledger.parquet")
    frame.loc[(frame["round"] == 2) & (frame["client_id"] == "1"), "noisy"] = True
    frame.to_parquet(run_dir / "ledger.parquet", index=False)
    rechain(run_dir)  # a forger without a key: the chain, seals and manifest match the edit
    report = audit_run(run_dir, noisy_clients={0})
    assert report.verdict == "NOT intact"
    assert report.problems == ["ledger.csv: round 2 client 1: noisy is booked 'true'; the run's noisy clients "
                               "give 'false'"]


@pytest.mark.parametrize("line_index", range(1, 28, 4))
def test_changing_any_single_value_in_the_ledger_is_detected(tmp_path, line_index):
    run_dir = write_run(tmp_path)
    lines = (run_dir / "ledger.csv").read_text().splitlines(keepends=True)
    cells = lines[line_index].split(",")
    cells[3] = repr(float(cells[3] or 0.0) + 1e-9)  # the value cell, by a hair
    lines[line_index] = ",".join(cells)
    (run_dir / "ledger.csv").write_text("".join(lines))
    report = audit_run(run_dir)
    assert not report.ok
    assert any("hash chain" in p for p in report.problems)


@pytest.mark.parametrize("tamper", ["status", "client", "round_row", "config", "drop_row", "parquet"])
def test_other_tampering_is_detected(tmp_path, tamper):
    run_dir = write_run(tmp_path)
    ledger = run_dir / "ledger.csv"
    lines = ledger.read_text().splitlines(keepends=True)
    if tamper == "status":
        lines[2] = lines[2].replace(",ok,", ",failed,")
        ledger.write_text("".join(lines))
    elif tamper == "client":
        lines[5] = "1,9" + lines[5][3:]
        ledger.write_text("".join(lines))
    elif tamper == "drop_row":
        ledger.write_text("".join(lines[:4] + lines[5:]))
    elif tamper == "round_row":
        rounds = (run_dir / "rounds.csv").read_text().replace("ads-exact", "ads-mc", 1)
        (run_dir / "rounds.csv").write_text(rounds)
    elif tamper == "config":
        (run_dir / "run.json").write_text((run_dir / "run.json").read_text().replace('"seed": 0', '"seed": 1'))
    else:
        frame = pd.read_parquet(run_dir / "ledger.parquet")
        frame.loc[0, "value"] += 0.5
        frame.to_parquet(run_dir / "ledger.parquet", index=False)
    assert not audit_run(run_dir).ok


def test_fedvalue_audit_exit_codes(tmp_path, capsys):
    run_dir = write_run(tmp_path)
    # No simulation rebuilds this run's utility: its values are not verifiable, and the audit fails closed.
    assert main(["audit", str(run_dir)]) == 1
    assert "NOT verifiable" in capsys.readouterr().out
    assert main(["audit", str(run_dir), "--no-recompute"]) == 0
    assert capsys.readouterr().out.strip().endswith(": intact")
    text = (run_dir / "ledger.csv").read_text()
    first_value = text.splitlines()[1].split(",")[3]
    (run_dir / "ledger.csv").write_text(text.replace(first_value, repr(float(first_value) * 2), 1))
    assert main(["audit", str(run_dir), "--no-recompute"]) == 1
    assert "FAILED: hash chain" in capsys.readouterr().out
    # A missing run directory is bad input (exit 2), not a failed audit (exit 1).
    assert main(["audit", str(tmp_path / "nowhere")]) == 2
    assert "run_dir" in capsys.readouterr().err


def test_fedvalue_audit_writes_its_report_as_json(tmp_path, capsys):
    """--json FILE: the verdict and every line the audit prints, as data, and what the recompute measured
    (nothing here: this run's utility is rebuilt by no simulation); a FILE it cannot or must not write is bad
    input, refused before the audit's work."""
    run_dir, kept = write_run(tmp_path / "run"), tmp_path / "audit.json"
    assert main(["audit", str(run_dir), "--no-recompute", "--json", str(kept)]) == 0
    report = json.loads(kept.read_text())
    assert report["verdict"] == "intact" and report["intact"] and report["rounds"] == 3 and report["measured"] == {}
    assert capsys.readouterr().out.strip().endswith(": intact") and not (tmp_path / "audit.json.partial").exists()
    assert any("hash chain intact" in check for check in report["checks"]) and report["head"] in report["identity"]
    assert main(["audit", str(run_dir), "--json", str(kept)]) == 1
    assert json.loads(kept.read_text())["verdict"] == "NOT verifiable"
    for wrong, said in ((tmp_path, "is a directory"), (tmp_path / "nowhere" / "a.json", "an existing directory"),
                        (run_dir / "audit.json", "outside the run directory")):
        assert main(["audit", str(run_dir), "--json", str(wrong)]) == 2
        error = capsys.readouterr().err
        assert "--json: expected a file" in error and said in error, error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.json", "run"]


def test_a_parquet_copy_a_round_behind_is_stale_not_tampered(tmp_path):
    """A run resumed from round 2 and not yet closed holds the copy of rounds 1-2 (the copy is
    written at the close and at a resume): that passes with a note; a copy cut inside a round
    or with a changed value fails."""
    run_dir = write_run(tmp_path)
    (run_dir / "manifest.json").unlink()  # a killed run has no final manifest
    ledger = pd.read_parquet(run_dir / "ledger.parquet")
    first_two = ledger[ledger["round"] <= 2]
    first_two.to_parquet(run_dir / "ledger.parquet", index=False)
    report = audit_run(run_dir)
    assert report.ok, report.problems
    assert any("up to round 2" in c for c in report.checks)

    ledger.iloc[: len(first_two) + 1].to_parquet(run_dir / "ledger.parquet", index=False)
    assert any("ends inside a round" in p for p in audit_run(run_dir).problems)

    changed = first_two.copy()
    changed.loc[changed.index[0], "value"] = changed["value"].iloc[0] * 2
    changed.to_parquet(run_dir / "ledger.parquet", index=False)
    assert "ledger.parquet differs from ledger.csv" in audit_run(run_dir).problems


def test_group_efficiency_holds_only_rounds_valued_by_an_efficient_estimator(tmp_path):
    """A round valued by a first- or second-order expansion books Σ φ ≠ utility_after − utility_before (the
    expansion's remainder): the check leaves it out and says so; the same gap in an exact round is a finding."""
    def run(name, method):
        writer = LedgerWriter(tmp_path / name, config={"seed": 0})
        for t, (gap, estimator) in enumerate([(0.0, "ads-exact"), (0.05, method)], start=1):
            rows = [{"round": t, "client_id": c, "method": "ads", "value": 0.25, "stderr": 0.0, "num_examples": 10,
                     "status": "ok"} for c in range(3)]
            writer.write_round(RoundRow(round=t, clients="0 1 2", num_clients=3, num_failed=0, utility_before=0.0,
                                        utility_after=0.75 - gap, utility_realized=0.75 - gap, num_evaluations=2,
                                        valuation_seconds=0.01, ads_method=estimator, efficiency_gap=gap),
                               [LedgerRow.from_mapping(row) for row in rows])
        writer.close(2)
        return audit_run(tmp_path / name)

    expanded = run("expanded", "ads-second-order")
    assert expanded.ok, expanded.problems
    assert "group efficiency in 1 round (max gap 0.0e+00)" in expanded.checks
    assert any(c.startswith("group efficiency not held in 1 round valued by a first- or second-order expansion")
               for c in expanded.checks), expanded.checks
    exact = run("exact", "ads-exact")
    assert any(p.startswith("group efficiency: Σ ADS − (utility_after − utility_before) is 0.05 in round 2")
               for p in exact.problems), exact.problems
