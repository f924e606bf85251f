"""An engine that does not start, or clients that do not answer in time, end a run with one
``fedvalue: error:`` line naming the cause and the option, and leave no half-made run
directory. Real engine failures in a real ``fedvalue run`` process: Ray refusing to start
(its session directory cannot be made: ``RAY_TMPDIR`` under a file) and a partition query no
client can answer within ``--query-timeout``. An exported ``RAY_ADDRESS`` is no failure: a
local run starts its own Ray and says so once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[3]
TINY = ["--num-clients", "3", "--clients-per-round", "2", "--rounds", "1", "--local-epochs", "1", "--hidden", "8",
        "--quiet"]


def _run(out: Path, *options: str, **environment: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(PROJECT), **environment}
    if "RAY_ADDRESS" not in environment:
        env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "simulations.cli", "run", "noisy-clients", "--out", str(out),
                           *TINY, *options], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=900)


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedvalue: error: engine: "), done.stderr[-3000:]
    return lines[0]


def test_a_query_timeout_is_one_line_naming_the_option_and_leaves_no_directory(tmp_path):
    out = tmp_path / "run"
    line = _one_error_line(_run(out, "--query-timeout", "0.0001"))
    assert "no node reported its partition id to the server's query: 3 of 3 nodes did not answer within 0.0001 s" in line
    assert "need longer: raise --query-timeout." in line and f"No round was committed, so {out} was removed" in line
    assert not out.exists()


def test_ray_refusing_to_start_is_one_line_naming_the_cause_and_leaves_no_directory(tmp_path):
    out = tmp_path / "run"
    (tmp_path / "a-file").write_text("")
    line = _one_error_line(_run(out, RAY_TMPDIR=str(tmp_path / "a-file" / "ray")))
    assert f"Ray did not start (NotADirectoryError: [Errno 20] Not a directory: '{tmp_path / 'a-file' / 'ray'}')" in line
    assert "--ray-address" in line and f"No round was committed, so {out} was removed" in line
    assert not out.exists()


@pytest.mark.slow  # two whole runs; the default suite's run of this path: tests/simulations/runner/test_ray_clusters.py
def test_an_exported_ray_address_changes_nothing_a_local_run_needs(tmp_path):
    """The same run with RAY_ADDRESS exported (a cluster's login shell) and without: one warning
    line, the same ledger bytes."""
    plain, exported = tmp_path / "plain", tmp_path / "exported"
    assert _run(plain).returncode == 0
    done = _run(exported, RAY_ADDRESS="127.0.0.1:1")  # nothing listens there
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if "RAY_ADDRESS" in line]
    assert len(warned) == 1 and "RAY_ADDRESS=127.0.0.1:1 is set; this run starts a local Ray of its own" in warned[0]
    assert (exported / "ledger.csv").read_bytes() == (plain / "ledger.csv").read_bytes()
