"""``fedvalue run SIMULATION --out DIR [...]`` and ``fedvalue run --resume DIR``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from fedvalue.schema import RUN_CONFIG_FILE
from simulations.cli.options import add_config_options, subcommand
from simulations.cli.registry import SIMULATIONS
from simulations.runner.config_checks import saved_config, saved_run_config
from simulations.runner.console import RunOptions
from simulations.runner.engine_settings import flat_fields, flat_settings, nest_settings


def _simulations_epilog() -> str:
    lines = ["simulations and their parameters (fedvalue run SIMULATION --help for details):"]
    for name, simulation in SIMULATIONS.items():
        lines.append(f"  {name}")
        for f in flat_fields(simulation.config):
            lines.append(f"      --{f.name.replace('_', '-')} (default {f.default})")
    return "\n".join(lines)



def add_parser(commands) -> None:
    run = subcommand(
        commands, "run", help="run a simulation and write its ledger, or continue one (--resume DIR)",
        usage="fedvalue run [-h] SIMULATION --out DIR [options]\n       fedvalue run --resume DIR [--quiet] "
              "[--sign-key PEM]",
        epilog=_simulations_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # `fedvalue run --resume DIR` alone: the simulation and its settings come from DIR/run.json.
    # Own dests: a sub-parser's defaults would overwrite the same names after it parses.
    run.add_argument("--resume", dest="resume_alone", metavar="DIR",
                     help="continue the run in DIR from its last completed round (simulation and settings from "
                          "DIR/run.json)")
    run.add_argument("--quiet", dest="quiet_alone", action="store_true", help="no per-round progress")
    run.add_argument("--sign-key", dest="sign_key_alone", metavar="PEM",
                     help="private key (fedvalue keygen) signing the run's seals, its manifest and, with an EC key, "
                          "its model.sig")
    simulations = run.add_subparsers(dest="simulation", required=False, metavar="SIMULATION")
    for name, simulation in SIMULATIONS.items():
        config_cls = simulation.config
        sim = subcommand(simulations, name, prog=f"fedvalue run {name}",
                      help=(sys.modules[config_cls.__module__].__doc__ or "").splitlines()[0])
        sim.add_argument("--out", required=not (simulation.out_optional or simulation.resumable),
                         help="output directory" + (" for the tables (optional)" if simulation.out_optional
                                                    else " for the ledger"))
        if simulation.resumable:
            sim.add_argument("--resume", metavar="DIR",
                             help="continue the run in DIR from its last completed round (its settings are "
                                  "read from DIR/run.json)")
        if simulation.resumable:
            sim.add_argument("--sign-key", metavar="PEM",
                             help="private key (fedvalue keygen) signing each round's seal and the final manifest, so "
                                  "`fedvalue audit --public-key` fails any rewrite of the run; an EC key (keygen's "
                                  "default) also writes model.sig at the close, which `model_signing verify key` "
                                  "checks")
        sim.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
        if simulation.results:
            sim.add_argument("--results", metavar="FOLDER",
                             help="also write the docs' results files to FOLDER (" + ", ".join(simulation.results)
                                  + "), each headed by this command and the commit")
        sim.add_argument("--quiet", action="store_true", help="no per-round progress")
        add_config_options(sim, config_cls, simulation.help)


def run_command(args: argparse.Namespace) -> int:
    lock = _lock_and_verify_resume(args)  # before any setting of the run is read
    try:
        return _run_simulation(args)
    finally:
        if lock is not None:
            lock.release()


def _lock_and_verify_resume(args: argparse.Namespace):
    """``--resume DIR``: lock DIR (one writer at a time) and verify it (genesis, hash chain,
    the seal's signature with ``--sign-key``; :func:`fedvalue.run.resume_check.verify_resume`)
    before any setting of its run.json is read, validated or probed. The lock, held to the
    run's end (None when not resuming, or DIR holds no run.json: that is refused later)."""
    from fedvalue.run.resume_check import verify_resume
    from fedvalue.run.rundir import RunDir, resolve
    from fedvalue.run.seals import Signer
    from fedvalue.run.writer_lock import lock_run_dir

    directory = args.resume_alone or getattr(args, "resume", None)
    if directory is None or not (resolve(directory) / RUN_CONFIG_FILE).is_file():
        return None
    key = getattr(args, "sign_key", None) or args.sign_key_alone
    signer = Signer.from_file(key) if key else None  # a bad key is refused before anything is read
    with RunDir(directory) as run:
        lock = lock_run_dir(run)
        try:
            verify_resume(run, signer)
        except BaseException:
            lock.release()
            raise
    return lock


def _run_simulation(args: argparse.Namespace) -> int:
    if args.resume_alone is not None:
        _resume_alone(args)
    elif args.simulation is None:
        raise ValueError("fedvalue run: expected a simulation (fedvalue run --help lists them) or --resume DIR to "
                         "continue a run.")
    else:
        _take_leading_options(args)
    simulation = SIMULATIONS[args.simulation]
    if getattr(args, "resume", None):
        config = _config_for_resume(simulation.config, args)
        args.out = args.resume
    else:
        if simulation.resumable and args.out is None:
            raise ValueError("--out: expected the directory for the run's ledger (or --resume DIR to continue a "
                             "run).")
        flat = {f.name: getattr(args, f.name) for f in flat_fields(simulation.config)}
        config = simulation.config(**nest_settings(simulation.config, flat))
    sign_key = None
    if getattr(args, "sign_key", None):
        from fedvalue.run.seals import Signer

        sign_key = Signer.from_file(args.sign_key)  # a bad key is refused before anything is written
    options = RunOptions(out=args.out, overwrite=args.overwrite, quiet=args.quiet,
                         resume=bool(getattr(args, "resume", None)), started=time.perf_counter(), sign_key=sign_key,
                         results=getattr(args, "results", None), command=getattr(args, "command_line", ""))
    return simulation.main(config, options)


def _take_leading_options(args: argparse.Namespace) -> None:
    """``fedvalue run --quiet SIMULATION ...``: the options before the simulation's name count too."""
    args.quiet = args.quiet or args.quiet_alone
    if args.sign_key_alone is not None:
        if not hasattr(args, "sign_key"):
            raise ValueError(f"--sign-key: {args.simulation} runs are not signed (only resumable runs are).")
        args.sign_key = args.sign_key or args.sign_key_alone


def _resume_alone(args: argparse.Namespace) -> None:
    """``fedvalue run --resume DIR``: the simulation named in DIR/run.json, with every setting at
    its default on the command line (so that :func:`_config_for_resume` takes DIR's)."""
    directory = args.resume_alone
    resumable = [n for n, s in SIMULATIONS.items() if s.resumable]
    if args.simulation is not None:
        if args.simulation not in resumable:
            raise ValueError(f"--resume: {args.simulation} runs cannot be resumed; only {resumable} runs can.")
        if getattr(args, "resume", None) not in (None, directory):
            raise ValueError(f"--resume: given twice, as {directory} and {args.resume}; give it once.")
        args.resume = directory
        _take_leading_options(args)
        return
    saved = saved_run_config(directory)
    if saved is None:
        raise ValueError(f"--resume: expected the directory of a run to continue, holding run.json; {directory} "
                         "has none.")
    name = saved.get("simulation")
    if name not in resumable:
        raise ValueError(f"--resume: {directory}/run.json names the simulation {name!r}; only {resumable} runs "
                         "can be resumed.")
    args.simulation = name
    for f in flat_fields(SIMULATIONS[name].config):
        setattr(args, f.name, f.default)
    args.out, args.resume, args.overwrite = None, directory, False
    args.quiet, args.sign_key = args.quiet_alone, args.sign_key_alone


def _config_for_resume(config_cls, args: argparse.Namespace):
    """The configuration saved in ``args.resume``/run.json; an option given on the command line
    must agree with it (a changed setting would not continue the same run)."""
    from fedvalue.run.rundir import resolve

    if args.out is not None and resolve(args.out) != resolve(args.resume):
        raise ValueError(f"out: --resume continues the run in {args.resume}; got another --out {args.out}.")
    saved = saved_run_config(args.resume)
    if saved is None:
        raise ValueError(f"resume: expected a run directory holding run.json; {args.resume} has none.")
    if saved.get("simulation") != args.simulation:
        raise ValueError(f"resume: {args.resume} holds a {saved.get('simulation')!r} run; got simulation "
                         f"{args.simulation!r}.")
    config = saved_config(config_cls, saved, source=str(Path(args.resume) / RUN_CONFIG_FILE))
    settings = flat_settings(config)
    for f in flat_fields(config_cls):
        value, given = settings[f.name], getattr(args, f.name)
        if given != f.default and given != value:
            raise ValueError(f"{f.name}: the run in {args.resume} was started with {value!r}; got {given!r}. "
                             "A resumed run keeps its settings.")
    return config


def interrupted(error: BaseException, args: argparse.Namespace) -> str:
    """Why the run stopped, and where its committed rounds are."""
    if str(error):
        return str(error)
    reason = "stopped at once by a second Ctrl-C" if args.command == "run" else "stopped at once by Ctrl-C"
    run_dir = getattr(args, "out", None)
    simulation = SIMULATIONS.get(getattr(args, "simulation", None) or "")
    if run_dir and simulation is not None and simulation.resumable:
        return (f"{reason}, during the round in flight; the rounds committed before it are in {run_dir}: continue "
                f"with fedvalue run --resume {run_dir}")
    return reason + "; nothing after the last file written was kept"


