"""The noisy-clients simulation end to end on Ray (small), through the CLI: the suite's shared small run read
back, reported and audited; two as small valued by adaptive MC-ADS and the second-order expansion, audited; with
`-m slow` a run SIGKILLed mid-way and resumed to the same bytes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from fedvalue.analysis.run_summary import load_run
from simulations.cli.main import main
from tests.conftest import TINY

SMALL = ["--num-clients", "8", "--rounds", "4", "--clients-per-round", "2", "--local-epochs", "3",
         "--hidden", "16", "--quiet"]
ROOT = Path(__file__).resolve().parents[4]


def committed_rounds(run_dir: Path) -> int:
    rounds = run_dir / "rounds.csv"
    return max(0, len(rounds.read_text().splitlines()) - 1) if rounds.exists() else 0


def run_and_kill(run_dir: Path, argv: list[str], after_rounds: int) -> int:
    """Start ``fedvalue run`` in its own process group and SIGKILL it once ``after_rounds`` committed."""
    command = [sys.executable, "-m", "simulations.cli", "run", "noisy-clients", "--out", str(run_dir), *argv]
    log = run_dir.with_name(run_dir.name + "-killed.log")
    with open(log, "wb") as output:
        process = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdout=output, stderr=output)
    deadline = time.monotonic() + 240
    try:
        while committed_rounds(run_dir) < after_rounds:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the run ended or stalled before round {after_rounds} (code "
                                     f"{process.poll()}); its output ends:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the driver and the Ray processes it started
        process.wait()
    return committed_rounds(run_dir)


@pytest.fixture(scope="module")
def booked_run(tmp_path_factory) -> Path:
    """One small real run (Ray, CLI) the killed run must book again, byte for byte."""
    run_dir = tmp_path_factory.mktemp("noisy") / "a"
    assert main(["run", "noisy-clients", "--out", str(run_dir), "--seed", "3", *SMALL]) == 0
    return run_dir


def test_a_small_run_books_every_client_it_sampled(signed_run):
    """The suite's shared small run (tests/conftest.py: 6 clients, 3 rounds of 2, seed 0)."""
    run_dir = signed_run[0]
    run = load_run(run_dir)
    assert sorted(run.ledger["client_id"].unique()) == [str(c) for c in range(6)]  # even schedule: each once
    assert set(run.ledger["method"]) == {"ads", "loo"} and set(run.ledger["status"]) == {"ok"}
    assert (run.rounds["efficiency_gap"].abs() < 1e-9).all()
    assert (run.rounds["utility_after"] == run.rounds["utility_realized"]).all()
    assert run.ledger["noisy"].sum() == 3 * 2  # 3 noisy clients × 2 methods
    assert run.config["seed"] == 0 and "flwr" in run.config["versions"]
    pd.testing.assert_frame_equal(pd.read_parquet(run_dir / "ledger.parquet"), run.ledger, check_dtype=False)


def test_a_small_run_is_reported_and_passes_its_audit(signed_run, capsys):
    run_dir = signed_run[0]
    assert main(["report", str(run_dir)]) == 0
    report = capsys.readouterr().out
    assert "total_ads" in report and "mean total_ads: noisy" in report
    assert main(["audit", str(run_dir)]) == 0  # the real run's chain, schema and efficiency hold


@pytest.mark.slow  # two real runs (54 s); the estimators are booked and audited in process in tests/fedvalue/valuation
def test_adaptive_and_second_order_runs_from_the_cli_book_their_methods_and_audit_intact(tmp_path, capsys):
    """``--ads-method adaptive`` (one round of all 6 clients, so that positions 2 and 3 are sampled, not exact)
    and ``--ads-method second-order --utility neg_loss`` (``TINY`` as it is), each as small as the suite's shared
    run: the rounds book ``ads-adaptive`` / ``ads-second-order``, run.json holds the adaptive settings for the
    adaptive run only, and ``fedvalue audit`` recomputes every value and finds each run intact."""
    runs = {
        "adaptive": (["--ads-method", "adaptive", "--rounds", "1", "--clients-per-round", "6"], "ads-adaptive"),
        "second-order": (["--ads-method", "second-order", "--utility", "neg_loss"], "ads-second-order"),
    }
    for name, (argv, booked) in runs.items():
        run_dir = tmp_path / name
        assert main(["run", "noisy-clients", "--out", str(run_dir), *TINY, *argv]) == 0, name
        run = load_run(run_dir)
        assert set(run.rounds["ads_method"]) == {booked}
        assert set(run.ledger["method"]) == {"ads", "loo"} and set(run.ledger["status"]) == {"ok"}
        assert ("adaptive_decision" in run.config) == (name == "adaptive")
        assert run.config["valuation"]["method"] == name
        capsys.readouterr()
        assert main(["audit", str(run_dir)]) == 0, capsys.readouterr().out
        out = capsys.readouterr().out
        assert "recomputed every value of" in out and out.rstrip().endswith(": intact"), out
    assert run.config["utility"] == "neg_loss"
    adaptive = load_run(tmp_path / "adaptive").config
    assert (adaptive["adaptive_decision"], adaptive["adaptive_cut"]) == ("threshold", 0.0)
    assert (adaptive["valuation"]["decision"], adaptive["valuation"]["cut"]) == ("threshold", 0.0)


def test_an_undefended_payout_is_refused_and_an_opted_in_one_leaves_the_run_intact(signed_run, tmp_path, capsys):
    """The payout's refusal and opt-in on the suite's shared real run (a copy; it books ads and loo, so the opt-in
    pays ads here: its rows say nothing undefended), audited with its key after."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(signed_run[0], run_dir)
    capsys.readouterr()
    assert main(["report", str(run_dir), "--payout", "100", "--method", "tracin_outflow"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("fedvalue: error: --method: tracin_outflow is not paid by "
                                                          "default: ") and captured.err.count("\n") == 1
    assert not (run_dir / "payout.csv").exists()
    assert main(["report", str(run_dir), "--payout", "100", "--method", "ads", "--allow-undefended"]) == 0
    table = pd.read_csv(run_dir / "payout.csv")
    assert list(table.columns)[-1] == "undefended" and table["undefended"].all()  # identities buy ADS too
    assert main(["audit", str(run_dir), "--public-key", str(signed_run[2])]) == 0  # payout.csv beside it: intact


def test_the_default_payout_pays_ads_and_the_audit_recomputes_it(signed_run, tmp_path, capsys):
    """On a copy of the suite's shared real run (no defences: it books ads and loo), ``--payout`` without
    ``--method`` is refused without the opt-in and with it pays ads and says so; the audit (its key, values not recomputed: the payout is read against the
    ledger) is intact with payout.csv recomputed, NOT intact (exit 1) when one payment changed, and says what a
    garbage payout.csv holds in one line, without a traceback."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(signed_run[0], run_dir)
    audit = ["audit", str(run_dir), "--public-key", str(signed_run[2]), "--no-recompute"]
    capsys.readouterr()
    assert main(["report", str(run_dir), "--payout", "100"]) == 2  # no book is paid without the opt-in
    assert "--payout: no book is paid by default" in capsys.readouterr().err
    assert main(["report", str(run_dir), "--payout", "100", "--allow-undefended"]) == 0
    assert ("ads totals, the default: the run booked no ads_defended, UNDEFENDED: paid by --allow-undefended)"
            in capsys.readouterr().out)
    table = pd.read_csv(run_dir / "payout.csv", dtype={"client_id": str})
    assert set(table["method"]) == {"ads"} and table["payment"].sum() == pytest.approx(100.0)
    assert main(audit) == 0
    out = capsys.readouterr().out
    assert "ok: payout.csv equals the payout the ledger gives (ads, share-of-positive, floor 0, budget 100; 6 " \
           "clients), exactly" in out and out.rstrip().endswith(": intact")

    text = (run_dir / "payout.csv").read_text()
    client, payment = next((row[0], row[4]) for row in (line.split(",") for line in text.splitlines()[1:])
                           if float(row[4]) > 0)
    lines = text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{client},"))
    lines[at] = lines[at].replace(f",{payment},", f",{float(payment) + 1.0!r},", 1)
    (run_dir / "payout.csv").write_text("".join(lines))
    assert main(audit) == 1
    out = capsys.readouterr().out
    assert f"FAILED: payout.csv: client {client}: payment is {float(payment) + 1.0!r}; the ledger gives " \
           f"{payment}\n" in out and out.rstrip().endswith(": NOT intact")

    (run_dir / "payout.csv").write_text("client,payment\n0,1e999\n")
    assert main(audit) == 1
    captured = capsys.readouterr()
    assert "FAILED: payout.csv: columns ['client', 'payment'], expected ['client_id', 'method', " in captured.out
    assert "Traceback" not in captured.out + captured.err and captured.out.rstrip().endswith(": NOT intact")


@pytest.mark.slow  # the default suite: a real run failing after round 1 resumed (tests/simulations/runner/
# test_run_dir_paths.py) and a process SIGKILLed at every write step (tests/hostile/crashes/test_kill_points.py)
def test_a_killed_run_resumes_to_the_same_ledger_bytes(booked_run, tmp_path, capsys):
    second = tmp_path / "b"
    # Killed mid-way (a real SIGKILL of the driver and its Ray processes) and resumed.
    done = run_and_kill(second, ["--seed", "3", *SMALL], after_rounds=2)
    assert 2 <= done < 4
    killed = load_run(second)  # every completed round is readable as it stands
    assert list(killed.rounds["round"]) == list(range(1, done + 1))
    capsys.readouterr()
    assert main(["audit", str(second)]) == 1  # nothing failed, but an incomplete run is not verifiable
    out = capsys.readouterr().out
    assert "FAILED" not in out and "is incomplete" in out
    # A resumed run keeps its settings (checked once the directory verified).
    assert main(["run", "noisy-clients", "--resume", str(second), "--rounds", "6"]) == 2
    assert "rounds: the run in" in capsys.readouterr().err
    assert main(["run", "--resume", str(second), "--quiet"]) == 0  # the simulation and settings from run.json
    # Same seed, same books, byte for byte, interrupted or not.
    assert (booked_run / "ledger.csv").read_bytes() == (second / "ledger.csv").read_bytes()
    pd.testing.assert_frame_equal(pd.read_parquet(second / "ledger.parquet"), load_run(second).ledger,
                                  check_dtype=False)  # the Parquet copy caught up too
    assert main(["audit", str(second)]) == 0
    capsys.readouterr()
    # A finished run has nothing to resume, whatever the settings given (the directory is verified first).
    assert main(["run", "noisy-clients", "--resume", str(second), "--quiet"]) == 2
    assert "already completed 4 rounds" in capsys.readouterr().err
    assert main(["run", "noisy-clients", "--resume", str(second), "--rounds", "6"]) == 2
    assert "already completed 4 rounds" in capsys.readouterr().err


@pytest.mark.slow
def test_coalitions_scored_on_ray_actors_give_the_same_ledger(tmp_path):
    """64 coalitions per round go to 2 Ray actors inside the running simulation."""
    wide = ["--num-clients", "6", "--rounds", "2", "--clients-per-round", "6", "--local-epochs", "3",
            "--hidden", "16", "--quiet"]
    assert main(["run", "noisy-clients", "--out", str(tmp_path / "a"), *wide]) == 0
    assert main(["run", "noisy-clients", "--out", str(tmp_path / "b"), "--valuation-workers", "2", *wide]) == 0
    assert (tmp_path / "a" / "ledger.csv").read_bytes() == (tmp_path / "b" / "ledger.csv").read_bytes()


@pytest.mark.parametrize("argv, fragment", [
    (["--rounds", "0"], "rounds: expected a positive integer; got 0"),
    (["--clients-per-round", "40"], "--clients-per-round: expected at most --num-clients 30; got 40"),
    (["--noisy-fraction", "1.5"], "--noisy-fraction: expected a number in [0, 1]; got 1.5"),
    (["--strategy", "fedsgd"], "strategy: expected one of"),
    (["--dataset", "cifar"], "dataset"),
    (["--valuation-workers", "-1"], "--valuation-workers: expected a non-negative integer; got -1"),
    (["--dataset", "mnist", "--data-path", "/nonexistent/mnist"], "--data-path"),
    (["--dataset", "digits", "--data-path", "/tmp"], "--data-path: only read for the datasets"),
    (["--model", "resnet"], "--model: expected one of ['mlp', 'cnn']"),
    (["--examples-per-client", "-1"], "--examples-per-client"),
    (["--examples-per-client", "70"], "--examples-per-client: a class-balanced sample of 2100 examples needs"),
    (["--valuation-budget", "many"], "--valuation-budget: expected coalition evaluations per round"),
    (["--valuation-budget", "10", "--ads-method", "exact"], "--valuation-budget: 10 evaluations per round do not fit"),
])
def test_bad_input_is_a_clear_error_without_traceback(tmp_path, capsys, argv, fragment):
    assert main(["run", "noisy-clients", "--out", str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_output_directory_holding_a_run_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "ledger.csv").write_text("round\n")
    assert main(["run", "noisy-clients", "--out", str(out)]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_report_of_a_missing_run(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "run_dir: expected a fedvalue run directory" in capsys.readouterr().err


def test_run_help_lists_simulations_and_parameters(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "noisy-clients" in out and "--clients-per-round" in out and "--flip-probability" in out


def started_until_round_1(run_dir: Path) -> subprocess.Popen:
    """``fedvalue run`` of the small job in a process of its own, once its round 1 committed."""
    command = [sys.executable, "-m", "simulations.cli", "run", "noisy-clients", "--out", str(run_dir), *SMALL]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while committed_rounds(run_dir) < 1 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return process


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_run_and_it_resumes(tmp_path, signum, capsys):
    """Ctrl-C sent to the CLI's process once round 1 committed: the round in flight commits and
    the process exits 130. SIGTERM: Ray's own handler ends the process at once (non-zero).
    Either way the run is incomplete, not failed, and resumes to the end."""
    run_dir = tmp_path / "run"
    process = started_until_round_1(run_dir)
    process.send_signal(signum)
    output = process.communicate(timeout=240)[0].decode()
    if signum == signal.SIGINT:
        assert process.returncode == 130, output
        assert "stopping after the round in flight commits" in output and "interrupted" in output
    else:
        assert process.returncode != 0, output
    done = committed_rounds(run_dir)
    assert 1 <= done < 4
    assert main(["audit", str(run_dir)]) == 1
    assert "FAILED" not in capsys.readouterr().out
    assert main(["run", "noisy-clients", "--resume", str(run_dir), "--quiet"]) == 0
    assert main(["audit", str(run_dir)]) == 0


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_with_its_reason_and_the_run_resumes(tmp_path, capsys):
    """Two SIGINTs once round 1 committed: the second stops the run at once (exit 130) and says
    so, naming where the committed rounds are and how to continue; they resume to the end."""
    run_dir = tmp_path / "run"
    process = started_until_round_1(run_dir)
    process.send_signal(signal.SIGINT)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=240)[0].decode()
    assert process.returncode == 130, output
    assert "interrupted: stopped at once by a second Ctrl-C" in output, output[-3000:]
    assert f"continue with fedvalue run --resume {run_dir}" in output
    assert 1 <= committed_rounds(run_dir) < 4
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert main(["audit", str(run_dir)]) == 0
