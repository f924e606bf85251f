"""The command line on the real engine: ``fedvalue run`` killed by SIGKILL right after round
1's commit mark (where a run used to be stranded for ever) and after round 2's ledger rows,
then ``fedvalue run --resume``, gives the uninterrupted run's ledger byte for byte. Slow
(three small Ray runs and two resumes); the kill-point matrix of test_kill_points.py covers
every step in the default suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedvalue.run import kill_points

PROJECT = Path(__file__).resolve().parents[3]
TINY = ["--num-clients", "4", "--rounds", "3", "--clients-per-round", "2", "--local-epochs", "2", "--hidden", "8",
        "--seed", "5", "--quiet"]


def _cli(*argv: str, kill_at: str | None = None) -> int:
    environment = {**os.environ, "PYTHONPATH": str(PROJECT)}
    environment.pop(kill_points.KILL_AT, None)
    if kill_at is not None:
        environment[kill_points.KILL_AT] = kill_at
    process = subprocess.Popen([sys.executable, "-m", "simulations.cli", *argv], cwd=PROJECT, env=environment,
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = process.communicate(timeout=900)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # Ray's processes the killed driver left
        except ProcessLookupError:
            pass
    assert process.returncode in (0, -signal.SIGKILL), err[-3000:]
    return process.returncode


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", ["rounds:1", "ledger:2"])
def test_the_command_line_killed_mid_commit_resumes_to_the_same_ledger(tmp_path, kill_at):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    assert _cli("run", "noisy-clients", "--out", str(reference), *TINY) == 0
    assert _cli("run", "noisy-clients", "--out", str(killed), *TINY, kill_at=kill_at) == -signal.SIGKILL
    assert _cli("run", "--resume", str(killed), "--quiet") == 0
    for name in ("ledger.csv", "ledger.parquet", "records/round-000001.npz", "records/round-000003.npz"):
        assert (killed / name).read_bytes() == (reference / name).read_bytes(), name
    assert _cli("audit", str(killed)) == 0
