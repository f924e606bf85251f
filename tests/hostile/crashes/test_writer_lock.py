"""Two writers of one run: the second is refused with the holder's PID, changes nothing, and
once the first is killed the run resumes to the uninterrupted ledger.

Real processes: the first writer (:mod:`tests.hostile.crashes.driver`) stops itself (SIGSTOP)
right after round 1's commit mark, holding the run directory's lock mid-commit; then this
process, as a second writer, tries ``fedvalue run --resume DIR``, ``fedvalue run SIMULATION
--out DIR`` (with and without ``--overwrite``) and a resume through the Python interface.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedvalue.run import kill_points
from fedvalue.run.writer import RunBooks
from fedvalue.run.rundir import RunDir
from fedvalue.run.seals import Signer, generate_keypair
from fedvalue.run.writer_lock import RunLocked, lock_run_dir
from fedvalue.schema import LOCK_FILE
from simulations.cli.main import main

PROJECT = Path(__file__).resolve().parents[3]


def _environment(**extra: str) -> dict[str, str]:
    environment = {**os.environ, "PYTHONPATH": str(PROJECT), "FLWR_LOG_LEVEL": "WARNING", **extra}
    for name in (kill_points.KILL_AT, kill_points.STOP_AT, kill_points.TRACE):
        if name not in extra:
            environment.pop(name, None)
    return environment


def _driver(run_dir: Path, key: Path, *options: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.hostile.crashes.driver", str(run_dir), "--key", str(key),
                             *options], cwd=PROJECT, env=_environment(**extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_stopped(process: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        state = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        time.sleep(0.1)
    raise AssertionError("the first writer never reached its stop point")


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("keys")
    generate_keypair(base / "k.pem", base / "k.pub")
    return base / "k.pem"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, keys) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    process = _driver(run_dir, keys)
    assert process.wait(timeout=600) == 0, process.communicate()
    return run_dir


def test_a_second_writer_is_refused_with_the_holders_pid_and_the_first_resumes_once_killed(tmp_path, keys,
                                                                                        reference, capsys):
    run_dir = tmp_path / "run"
    first = _driver(run_dir, keys, **{kill_points.STOP_AT: "rounds:1"})
    try:
        _wait_stopped(first)
        assert (run_dir / LOCK_FILE).read_text().strip() == str(first.pid)
        before = _snapshot(run_dir)
        held = f"is being written by another fedvalue process (PID {first.pid}"
        for argv in (["run", "--resume", str(run_dir), "--sign-key", str(keys), "--quiet"],
                     ["run", "noisy-clients", "--out", str(run_dir), "--quiet"],
                     ["run", "noisy-clients", "--out", str(run_dir), "--overwrite", "--quiet"]):
            assert main(argv) == 2  # this process is the second writer
            err = capsys.readouterr().err
            assert err.startswith("fedvalue: error: run_dir: ") and held in err, err
            assert err.count("\n") == 1, err  # one line, no traceback
        with pytest.raises(RunLocked, match=re.escape(held)):  # the Python interface
            RunBooks(run_dir, config=None, resume=True, signer=Signer.from_file(keys))
        assert _snapshot(run_dir) == before  # nobody wrote a byte beside the holder
    finally:
        os.kill(first.pid, signal.SIGKILL)  # a stopped process dies of SIGKILL too
        first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    resumed = _driver(run_dir, keys, "--resume")  # the kernel let go of the killed writer's lock
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    for name in ("ledger.csv", "first_order.csv", "records/round-000001.npz", "records/round-000002.npz"):
        assert (run_dir / name).read_bytes() == (reference / name).read_bytes(), name
    assert not (run_dir / LOCK_FILE).exists()  # the run ended: its writer let go


def test_the_lock_is_reentrant_in_one_process_and_refuses_a_link(tmp_path):
    run = RunDir(tmp_path, create=True)
    first, second = lock_run_dir(run), lock_run_dir(run)  # the command line holds it, then the books
    assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
    first.release()
    probe = subprocess.run([sys.executable, "-c", "import sys; from fedvalue.run.rundir import RunDir; "
                            "from fedvalue.run.writer_lock import lock_run_dir; lock_run_dir(RunDir(sys.argv[1]))",
                            str(tmp_path)], cwd=PROJECT, env=_environment(), capture_output=True, text=True,
                           timeout=300)
    assert probe.returncode == 1 and f"RunLocked: run_dir: {tmp_path} is being written" in probe.stderr
    assert f"(PID {os.getpid()}," in probe.stderr
    second.release()  # the last hold: released, and the file removed (a run that ended leaves none)
    assert not (tmp_path / LOCK_FILE).exists()
    probe = subprocess.run(probe.args, cwd=PROJECT, env=_environment(), capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr
    (tmp_path / LOCK_FILE).unlink(missing_ok=True)
    (tmp_path / LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="writer.lock: expected a regular file fedvalue can lock .* a symbolic link"):
        lock_run_dir(run)
    assert not (tmp_path / "elsewhere").exists()
    assert issubclass(RunLocked, ValueError)
