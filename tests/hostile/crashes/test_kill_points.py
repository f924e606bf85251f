"""A writer killed (SIGKILL) after any step of the commit sequence resumes to the ledger an
uninterrupted run writes, round 1 included; and what each kill leaves audits as incomplete,
never as NOT intact.

Every case is real processes (:mod:`tests.hostile.crashes.matrix` forks one per run and per
resume): the run is killed by a kill point (:mod:`fedvalue.run.kill_points`), the
directory as the kill left it is copied and audited, then ``--resume`` runs it to the end.
The reference is the same run uninterrupted. ledger.csv, first_order.csv, the records,
the Parquet copy and the final checkpoint must be byte-identical; rounds.csv equal but its
wall-time column (and the hashes that cover it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fedvalue.audit.checks import audit_run
from fedvalue.run import kill_points
from fedvalue.run.ledger_reader import read_rounds_csv
from fedvalue.run.seals import Verifier, generate_keypair
from simulations.cli.main import main
from tests.hostile.crashes import driver as kill_driver
PROJECT = Path(__file__).resolve().parents[3]
ROUNDS = kill_driver.ROUNDS
#: Every step the driver's run passes, in order: its open, each round's commit, each
#: round's first-order rows (written in the next round, the last after the last round), its
#: close (the Parquet copy, before the manifest).
STEPS = ([f"{step}:0" for step in kill_points.OPEN_STEPS]
         + [f"{step}:{t}" for t in range(1, ROUNDS + 1)
            for step in (*kill_points.ROUND_STEPS, kill_points.FIRST_ORDER_STEP)]
         + [f"{kill_points.CLOSE_STEP}:{ROUNDS}"])
#: Resumes killed too: a kill after round 1's commit mark, its resume killed mid-round 2; a
#: torn round 1, its resume killed after round 2's seal, that resume before the manifest.
CHAINED = ["rounds:1+checkpoint_state:2", "ledger_torn:1+seal:2+first_order:2"]
#: Files that must be byte-identical to the uninterrupted run's.
SAME_BYTES = ("ledger.csv", "first_order.csv", "ledger.parquet", "run.json", "records/round-000001.npz",
              "records/round-000002.npz", "checkpoint/round-000002.npz", "checkpoint/round-000002-state.npz")


def _matrix(work: Path, key: Path, cases: list[str]) -> dict[str, dict]:
    environment = {**os.environ, "PYTHONPATH": str(PROJECT), "FLWR_LOG_LEVEL": "WARNING"}
    for name in (kill_points.KILL_AT, kill_points.STOP_AT, kill_points.TRACE):
        environment.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "tests.hostile.crashes.matrix", str(work), str(key), *cases],
                          cwd=PROJECT, env=environment, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {result["case"]: result for result in results}


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[Path, Verifier]:
    base = tmp_path_factory.mktemp("keys")
    generate_keypair(base / "k.pem", base / "k.pub")
    return base / "k.pem", Verifier.from_file(base / "k.pub")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, keys) -> dict[str, dict]:
    """The reference run, its trace, and every step killed and resumed (one process per run)."""
    work = tmp_path_factory.mktemp("kills")
    results = _matrix(work, keys[0], STEPS + CHAINED)
    results["trace"] = (work / "trace.txt").read_text().split()
    return results


def test_the_kill_points_are_every_step_the_writer_passes(matrix):
    """The list the cases come from is the writer's own: a step added to the commit sequence
    without a kill point here fails this test."""
    assert matrix["reference"]["ended"] == ["exit 0"]
    assert matrix["trace"] == STEPS


def _rounds_without_wall_time(run_dir: Path) -> pd.DataFrame:
    return read_rounds_csv(run_dir / "rounds.csv").drop(columns=["valuation_seconds", "hash"])


def _check_case(result: dict, reference: Path, verifier: Verifier) -> None:
    kills = result["case"].split("+")
    assert result["ended"] == ["signal SIGKILL"] * len(kills) + ["exit 0"], result["resume_error"]
    base = Path(result["dir"])
    for number, kill in enumerate(kills, start=1):
        step, _, server_round = kill.partition(":")
        report = audit_run(base / f"killed-{number}", verifier=verifier, recompute=False)
        assert report.problems == [] and report.verdict == "NOT verifiable", (kill, report.problems)
        assert any(u.startswith("completeness: no final manifest") for u in report.unverifiable)
        if step in ("record", "ledger_torn", "ledger", "rounds_torn"):  # killed before the commit mark
            assert f"incomplete: round {server_round} was not committed" in " ".join(report.unverifiable), kill
    run = base / "run"
    for name in SAME_BYTES:
        assert (run / name).read_bytes() == (reference / name).read_bytes(), name
    pd.testing.assert_frame_equal(_rounds_without_wall_time(run), _rounds_without_wall_time(reference))
    report = audit_run(run, verifier=verifier, recompute=False)
    assert report.intact, (report.problems, report.unverifiable)


@pytest.mark.parametrize("case", STEPS)
def test_a_kill_at_each_step_resumes_to_the_uninterrupted_ledger(matrix, keys, case):
    _check_case(matrix[case], Path(matrix["reference"]["dir"]), keys[1])


@pytest.mark.parametrize("case", CHAINED)
def test_a_resume_killed_in_turn_still_resumes_to_the_uninterrupted_ledger(matrix, keys, case):
    _check_case(matrix[case], Path(matrix["reference"]["dir"]), keys[1])


def test_a_torn_tail_audits_incomplete_never_not_intact(matrix, capsys):
    """Killed after half of round 2's rows (the last one cut in its middle): `fedvalue audit`
    says the round was not committed, and the run NOT verifiable, not NOT intact."""
    killed = Path(matrix["ledger_torn:2"]["dir"]) / "killed-1"
    assert not (killed / "ledger.csv").read_text().endswith("\n")  # a real torn line
    assert main(["audit", str(killed), "--no-recompute"]) == 1
    out = capsys.readouterr().out
    assert "NOT VERIFIABLE: incomplete: round 2 was not committed" in out
    assert "FAILED" not in out and out.rstrip().endswith("NOT verifiable")
    killed = Path(matrix["rounds_torn:1"]["dir"]) / "killed-1"  # round 1's rounds.csv row cut in its middle
    assert main(["audit", str(killed), "--no-recompute"]) == 1
    out = capsys.readouterr().out
    assert "incomplete: round 1 was not committed (the run stopped while writing it: its record, " in out
    assert "FAILED" not in out
