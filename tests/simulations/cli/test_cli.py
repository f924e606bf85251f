"""The command line's mechanics: no abbreviated options, plain-text help, ``fedvalue run --resume
DIR`` alone, one name for the seed options, messages in the command line's words, the reason
printed when a run is stopped at once. None of these cases starts Ray."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from simulations.cli.main import build_parser, main
from simulations.cli.options import command_line_options, in_cli_words
from simulations.cli.registry import SIMULATIONS
from simulations.runner.engine import INTERRUPTED_EXIT_CODE


def parsers(parser: argparse.ArgumentParser, path=("fedvalue",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


def test_no_parser_takes_an_abbreviated_option_and_every_help_is_plain_text():
    seen = 0
    for path, parser in parsers(build_parser()):
        assert parser.allow_abbrev is False, path
        text = parser.format_help()
        for markup in ("``", ":func:", ":class:", ":mod:", ":data:", ":meth:"):
            assert markup not in text, (path, markup)
        seen += 1
    assert seen == 1 + 1 + len(SIMULATIONS) + 3  # fedvalue, run, each simulation, report, audit, keygen


@pytest.mark.parametrize("argv", [
    ["run", "noisy-clients", "--num-client", "100"],
    ["run", "noisy-clients", "--round", "2"],
    ["report", "x", "--plot"],
    ["audit", "x", "--no-recomp"],
])
def test_an_abbreviated_option_is_refused_not_guessed(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_every_multi_seed_simulation_names_its_seeds_seed_and_seeds():
    for name, simulation in SIMULATIONS.items():
        fields = {f.name for f in dataclasses.fields(simulation.config)}
        if name in ("procurement", "augmentation"):  # renamed on their own branch
            continue
        assert "first_seed" not in fields and "runs" not in fields, name
    parsed = build_parser().parse_args(["run", "noisy-clients-study", "--out", "x", "--seed", "4", "--seeds", "2"])
    assert parsed.seed == 4 and parsed.seeds == 2 and not hasattr(parsed, "first_seed")


def test_the_study_takes_seed_as_its_first_seed(capsys):
    with pytest.raises(SystemExit):
        main(["run", "noisy-clients-study", "--first-seed", "3", "--out", "x"])
    assert "unrecognized arguments: --first-seed 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "noisy-clients-study", "--help"])
    assert "first seed: the study runs seeds seed, seed+1" in capsys.readouterr().out


def test_run_needs_a_simulation_or_resume(capsys):
    assert main(["run"]) == 2
    assert "expected a simulation (fedvalue run --help lists them) or --resume DIR" in capsys.readouterr().err


def test_resume_alone_reads_the_simulation_from_the_run_and_names_what_is_wrong(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["run", "--resume", str(empty)]) == 2
    assert f"--resume: expected the directory of a run to continue, holding run.json; {empty} has none" \
        in capsys.readouterr().err
    study = tmp_path / "study"
    study.mkdir()
    (study / "run.json").write_text(json.dumps({"simulation": "noisy-clients-study"}))
    assert main(["run", "--resume", str(study)]) == 2
    assert "names the simulation 'noisy-clients-study'; only ['noisy-clients'" in capsys.readouterr().err
    # A resumable run: the simulation named in run.json runs with run.json's settings, in DIR.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    settings = {"simulation": "noisy-clients", **SIMULATIONS["noisy-clients"].config(rounds=3).as_dict()}  # engine flat
    (run_dir / "run.json").write_text(json.dumps(settings))
    called = {}

    def resumed(config, options):
        called.update(config=config, options=options)
        return 0

    monkeypatch.setitem(SIMULATIONS, "noisy-clients", dataclasses.replace(SIMULATIONS["noisy-clients"],
                                                                          main=resumed))
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert called["config"].rounds == 3 and called["options"].resume and called["options"].quiet
    assert called["options"].out == str(run_dir)
    assert main(["run", "--resume", str(run_dir), "noisy-clients", "--resume", str(empty)]) == 2
    assert "--resume: given twice" in capsys.readouterr().err
    # Options before the simulation's name are not dropped.
    assert main(["run", "--quiet", "noisy-clients", "--out", str(tmp_path / "new")]) == 0
    assert called["options"].quiet and not called["options"].resume
    assert main(["run", "--sign-key", "k.pem", "augmentation", "--out", str(tmp_path / "aug")]) == 2
    assert "--sign-key: augmentation runs are not signed" in capsys.readouterr().err
    # --resume before a simulation that cannot resume: refused in words, not an AttributeError.
    assert main(["run", "--resume", str(run_dir), "augmentation", "--out", str(tmp_path / "aug")]) == 2
    assert "--resume: augmentation runs cannot be resumed" in capsys.readouterr().err


def test_errors_use_the_command_lines_words(tmp_path, capsys):
    assert in_cli_words("out: x already holds a run; continue that run with resume=True (--resume DIR), or pass "
                        "overwrite=True (--overwrite) to replace it.") == (
        "out: x already holds a run; continue that run with --resume DIR, or pass --overwrite to replace it.")
    assert in_cli_words("resume=True needs run.json") == "--resume DIR needs run.json"
    options = command_line_options(build_parser())
    assert options["clients_per_round"] == "--clients-per-round" and options["resume"] == "--resume"
    assert in_cli_words("clients_per_round: expected at most num_clients=30; got 99.", options) == (
        "--clients-per-round: expected at most --num-clients 30; got 99.")
    assert in_cli_words("the seed: a number; rounds=3 was", options) == "the seed: a number; --rounds 3 was"
    assert main(["run", "noisy-clients", "--clients-per-round", "99", "--out", str(tmp_path / "x")]) == 2
    assert "error: --clients-per-round: expected at most --num-clients 30; got 99." in capsys.readouterr().err
    held = tmp_path / "held"
    held.mkdir()
    (held / "ledger.csv").write_text("round\n")
    assert main(["run", "noisy-clients", "--out", str(held)]) == 2
    err = capsys.readouterr().err
    assert "--resume DIR" in err and "--overwrite" in err and "=True" not in err
    # An option that is unset is left out on the command line; None is Python's word.
    assert main(["run", "noisy-clients", "--stderr-target", "0", "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "--stderr-target: expected a finite number > 0 (or leave the option out); got 0.0." in err
    assert "None" not in err


def test_a_second_ctrl_c_says_why_the_run_stopped_and_where_its_rounds_are(tmp_path, capsys, monkeypatch):
    def stopped_at_once(config, options):
        raise KeyboardInterrupt  # what the second SIGINT raises inside the engine

    monkeypatch.setitem(SIMULATIONS, "noisy-clients", dataclasses.replace(SIMULATIONS["noisy-clients"],
                                                                          main=stopped_at_once))
    out = tmp_path / "run"
    assert main(["run", "noisy-clients", "--out", str(out)]) == INTERRUPTED_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("fedvalue: interrupted: stopped at once by a second Ctrl-C")
    assert f"continue with fedvalue run --resume {out}" in err
