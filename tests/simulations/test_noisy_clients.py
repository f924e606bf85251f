"""The noisy-clients simulation end to end on Ray (small), through the CLI."""

from __future__ import annotations

import pandas as pd
import pytest

from fedvalue.ledger import load_run
from simulations.cli import main

SMALL = ["--num-clients", "4", "--rounds", "2", "--clients-per-round", "2", "--local-epochs", "3",
         "--hidden", "16", "--quiet"]


def test_small_run_is_booked_and_deterministic(tmp_path, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    assert main(["run", "noisy-clients", "--out", str(first), "--seed", "3", *SMALL]) == 0
    assert main(["run", "noisy-clients", "--out", str(second), "--seed", "3", *SMALL]) == 0
    # Same seed, same books, byte for byte.
    assert (first / "ledger.csv").read_bytes() == (second / "ledger.csv").read_bytes()
    run = load_run(first)
    assert sorted(run.ledger["client_id"].unique()) == ["0", "1", "2", "3"]  # even schedule: each once
    assert set(run.ledger["method"]) == {"ads", "loo"} and set(run.ledger["status"]) == {"ok"}
    assert (run.rounds["efficiency_gap"].abs() < 1e-9).all()
    assert (run.rounds["utility_after"] == run.rounds["utility_realized"]).all()
    assert run.ledger["noisy"].sum() == 2 * 2  # 2 noisy clients × 2 methods
    assert run.config["seed"] == 3 and "flwr" in run.config["versions"]
    pd.testing.assert_frame_equal(pd.read_parquet(first / "ledger.parquet"), run.ledger, check_dtype=False)
    capsys.readouterr()
    assert main(["report", str(first)]) == 0
    report = capsys.readouterr().out
    assert "total_ads" in report and "mean total_ads: noisy" in report
    assert main(["audit", str(first)]) == 0  # the real run's chain, schema and efficiency hold


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
    (["--clients-per-round", "40"], "clients_per_round: expected at most num_clients=30; got 40"),
    (["--noisy-fraction", "1.5"], "noisy_fraction: expected a number in [0, 1]; got 1.5"),
    (["--strategy", "fedsgd"], "strategy: expected one of"),
    (["--dataset", "cifar"], "dataset"),
    (["--valuation-workers", "-1"], "valuation_workers: expected an integer ≥ 0; got -1"),
    (["--dataset", "mnist", "--mnist-path", "/nonexistent/mnist"], "mnist_path"),
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
