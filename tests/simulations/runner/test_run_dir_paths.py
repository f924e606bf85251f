"""A run directory named any way a user names it: relative, through ``~``, under a linked
parent. One small real run (Ray) through ``simulate()`` that fails after round 1, then the
CLI's ``--resume``, audit and report, each naming the directory differently."""

from __future__ import annotations

import pytest

from fedvalue.analysis.run_summary import load_run
from fedvalue.schema import RoundRow
from simulations.cli.main import main
from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig, run_noisy_clients


def test_a_relative_run_keeps_its_committed_round_resumes_through_tilde_and_audits_intact(
        tmp_path, monkeypatch, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(tmp_path / "link")
    monkeypatch.setenv("HOME", str(tmp_path))
    run_dir = real / "runs" / "x"
    config = NoisyClientsConfig(num_clients=6, rounds=2, clients_per_round=2, local_epochs=2, hidden=(8,))

    def fail_after_round_one(row: RoundRow) -> None:
        if row.round == 1:
            raise ValueError("a failure after round 1 committed")

    with pytest.raises(ValueError, match="after round 1 committed"):
        run_noisy_clients(config, "runs/x", on_round=fail_after_round_one)
    assert list(load_run("runs/x").rounds["round"]) == [1]  # the clean-up never removes committed rounds

    assert main(["run", "noisy-clients", "--resume", "~/link/runs/x", "--quiet"]) == 0
    capsys.readouterr()
    for named in ("runs/x", "~/link/runs/x", "../link/runs/x", str(run_dir)):  # the names resolve alike
        recompute = [] if named == "runs/x" else ["--no-recompute"]  # retraining once is enough
        assert main(["audit", named, *recompute]) == 0
        assert capsys.readouterr().out.strip().splitlines()[-1] == f"{run_dir}: 2 rounds, 8 ledger rows: intact"
    assert main(["report", "runs/x", "--html"]) == 0
    assert f"wrote {run_dir / 'report.html'}" in capsys.readouterr().out
    assert main(["run", "noisy-clients", "--resume", "runs/x", "--out", "~/link/runs/x", "--quiet"]) == 2
    assert "already completed 2 rounds" in capsys.readouterr().err  # the same directory, however named
