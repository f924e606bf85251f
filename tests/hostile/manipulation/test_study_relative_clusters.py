"""The attack study with the defences' relative clusters (``fedvalue run attacks --duplicate-median-fraction κ``),
none of it through Ray: refused before Ray starts, naming the option, outside (0, 1) or without the defences; the
study's plan hands κ to the defences of every run; off, run.json and the defences are as before."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

from fedvalue.rounds.defences.settings import DUPLICATE_MEDIAN_FRACTION, DefenceSettings
from simulations.cli.main import main
from simulations.experiments.attacks.attacks import AttacksConfig, check
from simulations.experiments.attacks.study import _strategy, study_run_config, study_runs, utility_of
from simulations.runner import saved_config
from strategies import NodeDirectory

STUDY = AttacksConfig(attacks=("none", "adaptive-cluster-2@0.5"), num_clients=4, seeds=2, partitions=("iid",),
                      defences=1, duplicate_median_fraction=DUPLICATE_MEDIAN_FRACTION)


@pytest.mark.parametrize(("options", "said"), [
    (["--duplicate-median-fraction", "1", "--defences", "1"],
     "--duplicate-median-fraction: expected 0 (off: the fixed threshold) or a number in (0, 1), e.g. 0.25; got 1.0."),
    (["--duplicate-median-fraction", "-0.1", "--defences", "1"],
     "--duplicate-median-fraction: expected 0 (off: the fixed threshold) or a number in (0, 1), e.g. 0.25; got -0.1."),
    (["--duplicate-median-fraction", "0.25"],
     "--duplicate-median-fraction: expected --defences 1 or 2 (it sets how the defences cluster identities); got "
     "--defences 0 with --duplicate-median-fraction 0.25."),
])
def test_kappa_is_refused_before_ray_naming_the_option(tmp_path, capsys, options, said):
    out = tmp_path / "study"
    assert main(["run", "attacks", "--attacks", "none,adaptive-cluster-2@0.5", *options, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedvalue: error: {said}"), err
    assert "Traceback" not in err and not out.exists()
    with pytest.raises(ValueError, match="^duplicate_median_fraction: expected defences=1 or 2"):
        check(dataclasses.replace(STUDY, defences=0))
    check(STUDY)


def test_the_plan_hands_kappa_to_every_runs_defences_and_leaves_no_trace_when_off(tmp_path):
    assert STUDY.is_study and STUDY.as_dict()["duplicate_median_fraction"] == DUPLICATE_MEDIAN_FRACTION
    for run in study_runs(STUDY):
        strategy = _strategy(STUDY, run, tmp_path, utility_of(STUDY, run), NodeDirectory(),
                             study_run_config(STUDY, run))
        assert strategy.book_settings.defences == DefenceSettings(duplicate_median_fraction=DUPLICATE_MEDIAN_FRACTION)
    off = dataclasses.replace(STUDY, duplicate_median_fraction=0.0)
    for run in study_runs(off):
        strategy = _strategy(off, run, tmp_path, utility_of(off, run), NodeDirectory(), study_run_config(off, run))
        assert strategy.book_settings.defences == DefenceSettings()
        assert "duplicate_median_fraction" not in study_run_config(off, run)
    assert "duplicate_median_fraction" not in AttacksConfig().as_dict()
    assert saved_config(AttacksConfig, STUDY.as_dict()) == STUDY
    assert saved_config(AttacksConfig, off.as_dict()) == off


def test_the_bench_tables_only_parts_run_with_kappa_naming_the_option(tmp_path, capsys):
    from bench import attack_study

    part = tmp_path / "iid-fedavg"
    part.mkdir()
    (part / "run.json").write_text(json.dumps(AttacksConfig(attacks=("none",), defences=1).as_dict()))
    (part / "totals.csv").write_text("partition,strategy\niid,fedavg\n")
    (part / "runs.csv").write_text("partition,strategy,seed,attack,clustered_rows\n")
    fifo = tmp_path / "fifo-part"
    shutil.copytree(part, fifo)
    (fifo / "runs.csv").unlink()
    os.mkfifo(fifo / "runs.csv")  # read, it would block: refused before anything is read
    for names, said in (("iid-fedavg", "was run with the fixed threshold"), ("elsewhere", "expected a finished study"),
                        ("fifo-part", "expected a finished study")):
        with pytest.raises(SystemExit) as stopped:
            attack_study.main(["--out", str(tmp_path), "--relative", names])
        assert stopped.value.code == 2
        assert said in capsys.readouterr().err
