"""Results files: headed by the command that made them and the commit, read back without the header; and
``fedvalue run SIMULATION --results FOLDER`` offered exactly where a simulation lists results files, handing the
folder and the command line as typed to the simulation (no simulation is run)."""

from __future__ import annotations

import dataclasses
import subprocess

import pandas as pd
import pytest

from simulations.cli import main as cli
from simulations.cli import run as run_command
from simulations.cli.registry import SIMULATIONS
from simulations.runner import read_results, results_command, results_header, write_results


def test_a_results_file_is_headed_by_its_command_and_commit(tmp_path):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert results_header("fedvalue run x --results F") == f"# fedvalue run x --results F (commit {commit})\n"
    frame = pd.DataFrame({"rule": ["a", "b"], "value": [0.1, 1 / 3]})
    written = write_results(tmp_path / "new", {"one.csv": frame, "two.csv": frame.iloc[:1]}, "fedvalue run x")
    assert written == [tmp_path / "new" / "one.csv", tmp_path / "new" / "two.csv"]
    assert results_command(written[0]) == "fedvalue run x"
    pd.testing.assert_frame_equal(read_results(written[0]), frame)


def test_a_printed_table_is_kept_as_its_lines_under_the_same_header(tmp_path):
    printed = "panel   mc-ads\na        1.0173\nb        0.9987   "
    [path] = write_results(tmp_path, {"printed.txt": printed}, "fedvalue run x --results F")
    assert path.read_text() == results_header("fedvalue run x --results F") + printed + "\n"
    assert results_command(path) == "fedvalue run x --results F"


def test_a_file_without_the_header_is_no_results_file(tmp_path):
    (tmp_path / "plain.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="expected a results file headed"):
        results_command(tmp_path / "plain.csv")


def test_bench_heads_its_files_the_same_way():
    from bench import results_header as bench_header

    assert bench_header("python -m bench.x") == results_header("python -m bench.x")


def test_results_is_an_option_of_the_simulations_that_list_results_files(capsys):
    parser = cli.build_parser()
    with_results = sorted(name for name, simulation in SIMULATIONS.items() if simulation.results)
    assert with_results == ["augmentation", "fairness", "fairness-adult", "fairness-central", "noisy-clients-study",
                            "noisy-federation", "procurement", "reciprocity", "replication-market"]
    for name in with_results:
        assert parser.parse_args(["run", name, "--out", "d", "--results", "r"]).results == "r"
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "noisy-clients", "--out", "d", "--results", "r"])
    assert "unrecognized arguments: --results r" in capsys.readouterr().err


def test_the_simulation_gets_the_folder_and_the_command_as_typed(monkeypatch):
    seen = {}

    def capture(config, options):
        seen.update(config=config, options=options)
        return 0

    monkeypatch.setitem(SIMULATIONS, "fairness", dataclasses.replace(SIMULATIONS["fairness"], main=capture))
    argv = ["run", "fairness", "--out", "runs/f", "--seeds", "3", "--results", "docs/results"]
    assert cli.main(argv) == 0
    assert seen["options"].results == "docs/results" and seen["config"].seeds == 3
    assert seen["options"].command == "fedvalue run fairness --out runs/f --seeds 3 --results docs/results"
    assert run_command.SIMULATIONS is SIMULATIONS
