"""The attack study with the defences' relative clusters (``fedvalue run attacks --duplicate-median-fraction κ``),
none of it through Ray: refused before Ray starts, naming the option, outside (0, 1) or without the defences; the
study's plan hands κ to the defences of every run; off, run.json and the defences are as before. The bench's adaptive
sweep (``python -m bench.attack_study --margins ... --duplicate-median-fraction κ [--fixed-second-order]``) puts
each relative part beside its fixed-τ control, runs each unfinished part once (its children faked here) and tables
them as ``--relative`` does; bad input is one line naming the option, before any part runs."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pandas as pd
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


# --- The bench's adaptive sweep against the relative clusters (its children faked: nothing here starts Ray) ---------

KAPPA = ["--duplicate-median-fraction", "0.25"]
SECOND_ORDER = ["--utility", "neg_loss", "--fixed-second-order"]


def test_the_sweep_puts_each_relative_part_beside_its_control_and_the_second_order_parts_under_fedavg():
    from bench.attack_study import QUICK, SEEDS, part_config, sweep_attacks, sweep_parts

    controls = sweep_parts([0.05, 0.5], QUICK, SEEDS["quick"])
    assert [name for name, _ in controls] == ["iid-fedavg-adaptive", "dirichlet-fedavg-adaptive",
                                              "iid-fedmedian-adaptive", "dirichlet-fedmedian-adaptive"]
    for (name, options), seeds in zip(controls, (20, 20, 5, 5)):
        partition, strategy = name.split("-")[:2]
        assert options == ["--attacks", sweep_attacks([0.05, 0.5]), *QUICK, "--norm-cap", "1.25", "--partitions",
                           partition, "--strategies", strategy, "--seeds", str(seeds)]
    parts = dict(sweep_parts([0.05, 0.5], QUICK, SEEDS["quick"], 0.25, second_order=True))
    assert list(parts) == ["iid-fedavg-adaptive", "iid-fedavg-adaptive-relative", "iid-fedavg-adaptive-second-order",
                           "iid-fedavg-adaptive-second-order-relative", "dirichlet-fedavg-adaptive",
                           "dirichlet-fedavg-adaptive-relative", "dirichlet-fedavg-adaptive-second-order",
                           "dirichlet-fedavg-adaptive-second-order-relative", "iid-fedmedian-adaptive",
                           "iid-fedmedian-adaptive-relative", "dirichlet-fedmedian-adaptive",
                           "dirichlet-fedmedian-adaptive-relative"]
    for name, options in dict(controls).items():  # the controls are the sweep's own parts, as they were
        assert parts[name] == options and parts[f"{name}-relative"] == [*options, *KAPPA]
        if "-fedavg-" in name:
            assert parts[f"{name}-second-order"] == [*options, *SECOND_ORDER]
            assert parts[f"{name}-second-order-relative"] == [*options, *SECOND_ORDER, *KAPPA]
    for name, options in parts.items():  # each as fedvalue run attacks reads and checks it
        config = part_config(options)
        check(config)
        assert config.duplicate_median_fraction == (0.25 if name.endswith("-relative") else 0.0)
        assert config.fixed_second_order is ("second-order" in name)
        assert config.utility == ("neg_loss" if "second-order" in name else "accuracy")
        assert config.norm_cap == 1.25 and config.defences == 1


@pytest.mark.parametrize(("kappa", "second_order", "seeds", "said"), [
    (1.0, False, {"fedavg": 2}, "--duplicate-median-fraction: expected κ, a number in (0, 1)"),
    (-0.25, False, {"fedavg": 2}, "--duplicate-median-fraction: expected κ, a number in (0, 1)"),
    (0.0, True, {"fedavg": 2}, "--fixed-second-order: expected --duplicate-median-fraction κ too"),
    (0.25, True, {"fedmedian": 2}, "--fixed-second-order: expected FedAvg among the sweep's strategies (the "
                                   "fixed-weight coalition rule is FedAvg's); got fedmedian"),
])
def test_the_sweep_refuses_what_it_cannot_run_naming_the_option(kappa, second_order, seeds, said):
    from bench.attack_study import sweep_parts

    with pytest.raises(ValueError) as refused:
        sweep_parts([0.05], [], seeds, kappa, second_order)
    assert str(refused.value).startswith(said), refused.value


def faked_children(monkeypatch, part) -> None:
    """Each study part's child (``python -m simulations.cli run attacks ...``) replaced by ``part(target, options)``;
    any other command (the results header's git) runs as before."""
    import subprocess

    run = subprocess.run

    def child(command, **kwargs):
        if command[1:5] != ["-m", "simulations.cli", "run", "attacks"]:
            return run(command, **kwargs)
        return part(Path(command[command.index("--out") + 1]), command[5:command.index("--out")])
    monkeypatch.setattr(subprocess, "run", child)


@pytest.fixture
def no_children(monkeypatch):
    """A study part run here would start Ray: fail instead."""
    def refuse(target, options):
        raise AssertionError(f"a part was started: {target}")
    faked_children(monkeypatch, refuse)


@pytest.mark.parametrize(("options", "said"), [
    (["--margins", "0.05", "--duplicate-median-fraction", "1"],
     "--duplicate-median-fraction: expected κ, a number in (0, 1) (0.25 is the documented setting); got '1'"),
    (["--margins", "0.05", "--duplicate-median-fraction", "0"],
     "--duplicate-median-fraction: expected κ, a number in (0, 1) (0.25 is the documented setting); got '0'"),
    (["--margins", "0.05", "--duplicate-median-fraction", "quarter"],
     "--duplicate-median-fraction: expected κ, a number in (0, 1) (0.25 is the documented setting); got 'quarter'"),
    (["--duplicate-median-fraction", "0.25"],
     "--duplicate-median-fraction: expected --margins M,M,... too (κ runs the adaptive sweep's parts against the "
     "relative clusters); got --duplicate-median-fraction 0.25 without --margins"),
    (["--relative", "iid-fedavg", "--duplicate-median-fraction", "0.25"],
     "--duplicate-median-fraction: expected --margins M,M,... too"),
    (["--margins", "0.05", "--fixed-second-order"],
     "--fixed-second-order: expected --margins M,M,... and --duplicate-median-fraction κ too (it books the sweep's "
     "FedAvg parts, tabled beside the relative clusters'); got --fixed-second-order without "
     "--duplicate-median-fraction"),
    (["--fixed-second-order"], "--fixed-second-order: expected --margins M,M,... and --duplicate-median-fraction κ "
                               "too (it books the sweep's FedAvg parts, tabled beside the relative clusters'); got "
                               "--fixed-second-order without --margins and --duplicate-median-fraction"),
    (["--margins", "0.05,2", "--duplicate-median-fraction", "0.25"],
     "--margins: fedvalue run attacks refuses part iid-fedavg-adaptive: --attacks: adaptive-split-2@2: margin: "
     "expected at most K − 1 = 1"),
])
def test_bad_sweep_input_is_one_line_naming_the_option_and_runs_nothing(tmp_path, capsys, no_children, options,
                                                                       said):
    from bench import attack_study

    with pytest.raises(SystemExit) as stopped:
        attack_study.main(["--out", str(tmp_path / "study"), *options])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {said}" in err and "Traceback" not in err, err
    assert not list((tmp_path / "study").glob("*"))


def write_part(folder: Path, options: list[str]) -> None:
    """A finished part as a ``fedvalue run attacks`` child writes one, of made-up numbers (3 seeds): honest clients
    earn about 1, each identity 0.75 (every book), halved by the defended books and clustered (3 rows a run per
    identity) with κ; the second-order books' columns where the part books them."""
    from bench.attack_study import part_config
    from simulations.experiments.attacks.plan import plan_of
    from simulations.experiments.attacks.study import study_totals

    config = part_config(options)
    kappa, books = config.duplicate_median_fraction, study_totals(config)
    totals, runs = [], []
    for seed in range(3):
        for attack in config.attacks:
            plan = plan_of(attack, config.num_clients, config.attacker, config.colluders)
            for client in plan.participants:
                plain = 0.75 if client in plan.identities else 1 + client / 10 + seed / 100
                defended = plain / 2 if kappa and client in plan.identities else plain
                totals.append({"partition": config.partitions[0], "strategy": config.strategies[0], "seed": seed,
                               "attack": attack, "client_id": client}
                              | {book: defended if book.endswith("_defended") else plain for book in books}
                              | {"defence_free_rider": 0})
            runs.append({"partition": config.partitions[0], "strategy": config.strategies[0], "seed": seed,
                         "attack": attack, "identities": " ".join(map(str, plan.identities)),
                         "seats": " ".join(map(str, plan.seats)), "accuracy": 0.8 - seed / 100,
                         "clustered_rows": 3 * len(plan.identities) if kappa and attack != "none" else 0})
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(config.as_dict()))
    pd.DataFrame(totals).to_csv(folder / "totals.csv", index=False)
    pd.DataFrame(runs).to_csv(folder / "runs.csv", index=False)
    (folder / "gains.csv").write_text("written by the part's child\n")


def test_the_sweep_runs_each_unfinished_part_once_and_tables_them_as_relative_does(tmp_path, capsys, monkeypatch):
    """The sweep with κ and the second-order books, its children faked by :func:`write_part`: a finished part is
    not run again (nor anything on a second call), the relative and second-order tables and results files are
    --relative's on the same parts, and the sweep's other adaptive attacks read by kind and margin."""
    from bench import attack_study

    out, results = tmp_path / "study", tmp_path / "results"
    parts = dict(attack_study.sweep_parts([0.05], attack_study.QUICK, attack_study.SEEDS["quick"], 0.25, True))
    write_part(out / "iid-fedavg-adaptive", parts["iid-fedavg-adaptive"])  # finished in an earlier sitting
    started = []

    def child(target, options):
        started.append(target.name)
        write_part(target, options)
    faked_children(monkeypatch, child)
    argv = ["--out", str(out), "--margins", "0.05", *KAPPA, "--fixed-second-order", "--results", str(results)]
    attack_study.main(argv)
    assert started == [name for name in parts if name != "iid-fedavg-adaptive"]
    table = (out / "relative-table.md").read_text()
    assert capsys.readouterr().out.endswith(table + "\n")  # printed after the parts' lines
    accuracy, second = table.split("\n\n")
    assert accuracy.startswith("| data | strategy | attack | margin M past its defence's threshold | clusters |")
    assert "| iid | fedmedian | adaptive-replay | 0.05 | κ = 0.25 × median | 3 |" in accuracy
    assert "| dirichlet | fedavg | adaptive-cluster-4 | 0.05 | τ = 0.05 | 0 |" in accuracy
    assert "| second order | second order, defended |" in second.splitlines()[0]
    assert "fedmedian" not in second and "| iid | fedavg | adaptive-crafted | 0.05 | κ = 0.25 × median | 3 |" in second
    kept = attack_study.read_results(results)
    assert {"relative-gains", "relative-cost", "relative-second-order-gains", "relative-second-order-cost",
            "adaptive-gains", "adaptive-cost"} <= set(kept)
    assert set(kept["relative-gains"]["duplicate_median_fraction"]) == {0.0, 0.25}
    assert set(zip(kept["relative-gains"]["partition"], kept["relative-gains"]["strategy"])) == {
        (p, s) for p in ("iid", "dirichlet") for s in ("fedavg", "fedmedian")}
    # Resumable: every part finished, nothing runs again; --relative on the same parts tables the same.
    started.clear()
    attack_study.main(argv)
    assert not started and (out / "relative-table.md").read_text() == table
    attack_study.main(["--out", str(out), "--relative", ",".join(parts)])
    assert (out / "relative-table.md").read_text() == table


def test_a_part_of_other_settings_is_refused_before_any_part_runs(tmp_path, capsys, no_children):
    from bench import attack_study

    out = tmp_path / "study"
    parts = dict(attack_study.sweep_parts([0.05], attack_study.QUICK, attack_study.SEEDS["quick"], 0.25))
    write_part(out / "dirichlet-fedavg-adaptive-relative",
               [*parts["dirichlet-fedavg-adaptive"], "--duplicate-median-fraction", "0.1"])
    with pytest.raises(SystemExit) as stopped:
        attack_study.main(["--out", str(out), "--margins", "0.05", *KAPPA])
    assert stopped.value.code == 2
    said = capsys.readouterr().err
    assert (f"error: --duplicate-median-fraction: {out / 'dirichlet-fedavg-adaptive-relative'} was run with "
            "duplicate_median_fraction = 0.1; expected 0.25: give another --out") in said, said
