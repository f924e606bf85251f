"""The noisy-clients study end to end on one real Ray engine (small), through the CLI."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fedvalue.audit.checks import audit_run
from fedvalue.analysis.run_summary import load_run
from simulations.cli.main import main
from simulations.experiments.noisy_clients.noisy_clients import run_noisy_clients
from simulations.experiments.noisy_clients.study import FLAGGING_RULES, NoisyClientsStudyConfig, _base, _parallel_clients, run_study
from simulations.runner import EngineSettings

SMALL = ["--num-clients", "6", "--rounds", "2", "--clients-per-round", "3", "--local-epochs", "2",
         "--hidden", "16", "--seeds", "2", "--seed", "5", "--ks", "2", "--quiet"]


def test_small_study_writes_tables_figure_and_replays_the_scored_runs(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["run", "noisy-clients-study", "--out", str(out), *SMALL]) == 0
    printed = capsys.readouterr().out
    assert "detection at j = 1" in printed and "final-round accuracy" in printed
    accuracy = pd.read_csv(out / "accuracy.csv")
    # per seed: the clean run, the scored run ("all") and 1 k × 3 rankings, 2 rounds each
    assert len(accuracy) == 2 * 2 * (1 + 1 + 1 * 3)
    assert set(accuracy["method"]) == {"clean", "all", "ads", "loo", "random"}
    assert (out / "figure4.png").stat().st_size > 10_000
    detection = pd.read_csv(out / "detection.csv")
    assert set(detection["method"]) == {"ads", "loo", "random"} and detection["mean"].between(0, 1).all()
    flagging = pd.read_csv(out / "flagging.csv")
    assert len(flagging) == len(FLAGGING_RULES) and set(flagging["method"]) == {"ads", "loo"}
    assert (flagging["n_clean_runs"] == 2).all() and (flagging["n_noisy_runs"] == 2).all()
    timings = json.loads((out / "timings.json").read_text())
    # one engine for the 10 runs: each of the 6 nodes is asked its partition id once, not once per run
    assert timings["messages"] == {"query": 6, "train": 2 * (1 + 1 + 1 * 3) * 2 * 3}
    assert 0 < timings["waiting"]["train"] < timings["rounds"] < timings["total"]
    for column in ("false_positive_rate", "false_positive_rate_noisy_runs", "detection_rate"):
        assert flagging[column].between(0, 1).all()
    for seed in (5, 6):
        scored = load_run(out / f"seed-{seed}" / "scored")
        assert set(scored.ledger["method"]) == {"ads", "loo"}
        clean = load_run(out / f"seed-{seed}" / "clean")
        # the same federation (clients, rounds, initial model) with the label noise off
        assert not clean.ledger["noisy"].astype(bool).any() and scored.ledger["noisy"].astype(bool).any()
        assert list(clean.ledger["client_id"]) == list(scored.ledger["client_id"])
        assert clean.rounds["utility_before"].iloc[0] == scored.rounds["utility_before"].iloc[0]
        assert audit_run(out / f"seed-{seed}" / "clean").ok
        assert not (out / f"seed-{seed}" / "scored" / "checkpoint").exists()  # a study is not resumed
        for k in (2,):  # 2 of each round's 3 kept: a ranking decides, not just its top
            for ranking in ("ads", "loo", "random"):
                run_dir = out / f"seed-{seed}" / f"top{k}-{ranking}"
                retrain = load_run(run_dir)
                selected = retrain.ledger[retrain.ledger["method"] == "selected"]
                # the scored run's clients are replayed, and exactly k of them are kept per round
                assert list(selected["client_id"]) == list(scored.ledger.loc[scored.ledger["method"] == "ads",
                                                                             "client_id"])
                assert (selected.groupby("round")["value"].sum() == k).all()
                assert audit_run(run_dir).ok
    assert main(["run", "noisy-clients-study", "--out", str(out), *SMALL]) == 2  # refuses to overwrite


def test_the_study_trains_on_every_core_unless_told(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert _parallel_clients(NoisyClientsStudyConfig()) == 2  # a single run keeps one core for the server
    assert _parallel_clients(NoisyClientsStudyConfig(engine=EngineSettings(max_parallel_clients=1))) == 1
    assert _parallel_clients(NoisyClientsStudyConfig(clients_per_round=1)) == 1
    assert _parallel_clients(NoisyClientsStudyConfig(engine=EngineSettings(ray_address="auto"))) is None


@pytest.mark.slow
def test_the_scored_run_of_a_study_is_the_single_runs_ledger_byte_for_byte(tmp_path):
    """The study's engine (every core for clients, one node directory, no checkpoints) books
    the same ledger as ``fedvalue run noisy-clients`` (one actor, its own directory)."""
    config = NoisyClientsStudyConfig(num_clients=6, rounds=2, clients_per_round=3, local_epochs=2, hidden=(16,),
                                     seeds=1, seed=3, ks=(1,), clean_runs=0)
    run_study(config, str(tmp_path / "study"))
    run_noisy_clients(_base(config, 3), str(tmp_path / "single"))
    study_ledger = (tmp_path / "study" / "seed-3" / "scored" / "ledger.csv").read_bytes()
    assert study_ledger == (tmp_path / "single" / "ledger.csv").read_bytes()
