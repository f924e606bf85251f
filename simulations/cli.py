"""The ``fedvalue`` command: ``fedvalue run SIMULATION --out DIR [...]``, ``fedvalue report DIR``."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
import types
import typing
from collections.abc import Mapping, Sequence

from fedvalue.schema import RUN_CONFIG_FILE
from simulations.api import NoClientValued
from simulations.console import RunOptions, print_run_summary
from simulations.engine import INTERRUPTED_EXIT_CODE
from simulations.engine_failures import EngineFailed
from simulations.registry import SIMULATIONS, Simulation
from simulations.settings import saved_config
from simulations.strategy_choices import STRATEGIES, STRATEGY_PARAMETERS
from strategies.valuing import RunInterrupted

PARAMETER_HELP = {
    "seed": "seed of everything random in the run (same seed, same ledger)",
    "dataset": "digits (embedded), breast-cancer, diabetes, fashion-mnist (Debian's dataset-fashion-mnist), or "
               "mnist (needs --data-path)",
    "data_path": "fashion-mnist or mnist: directory of the IDX files or an .npz (x_train, y_train, x_test, y_test); "
                 "fashion-mnist defaults to /usr/share/datasets/fashion-mnist",
    "mnist_path": "directory of MNIST IDX files or an .npz (x_train, y_train, x_test, y_test)",
    "holdout_fraction": "share of the data held out for the server's utility (fashion-mnist and mnist hold out "
                        "their test split)",
    "num_clients": "number of clients (partitions)",
    "rounds": "federated rounds",
    "clients_per_round": "clients sampled per round",
    "schedule": "even (each client once per pass, [ADS] App. C.2) or random",
    "partition": "Flower Datasets partitioner: iid, dirichlet (label skew), pathological or shard",
    "dirichlet_alpha": "concentration of the label-skew partition",
    "classes_per_partition": "pathological partition: classes each client holds",
    "shards_per_partition": "shard partition: label-sorted shards each client holds",
    "noisy_fraction": "share of clients with label noise",
    "flip_probability": "probability a noisy client's label is flipped to another class",
    "hidden": "hidden layer sizes, comma-separated",
    "local_epochs": "local epochs per round",
    "learning_rate": "local SGD learning rate",
    "batch_size": "local batch size (0 = full batch)",
    "strategy": "inner Flower strategy: " + ", ".join(STRATEGIES),
    "methods": "valuations per round, comma-separated: ads,loo",
    "ads_method": "auto (exact when no dearer than MC; with --stderr-target the cheapest sampler), exact, mc, "
                  "tmc (truncated MC), antithetic, stratified or kernelshap",
    "epsilon": "MC-ADS accuracy ε",
    "delta": "MC-ADS failure probability δ",
    "truncation_tolerance": "tmc: a permutation stops when |v(I_t) − v(prefix)| is within this",
    "stderr_target": "sampling methods: stop sampling once every client's standard error is below this "
                     "(unset = run all m* permutations)",
    "utility": "accuracy, neg_loss",
    "num_cpus_per_client": "CPUs Ray gives each client",
    "num_gpus_per_client": "GPUs Ray gives each client (0 = none; fractions share a GPU)",
    "device": "torch device of the server's valuation (the utility's forward passes): cpu, cuda, cuda:1, ...",
    "max_parallel_clients": "clients training at once (unset = sized for the machine)",
    "ray_address": "attach to an existing Ray cluster at this address (unset = a local Ray)",
    "round_timeout": "seconds to wait for a round's replies",
    "query_timeout": "seconds to wait for the clients to report their partition ids (raise it on a loaded "
                     "machine)",
    "valuation_workers": "Ray actors scoring coalitions in parallel (0 = in the server process)",
    "model": "mlp (--hidden layers) or cnn (LeNet-5-style, for square images)",
    "examples_per_client": "class-balanced training examples per client (0 = equal shares of the whole training "
                           "pool); [ADS] 6.2 uses 120",
    "holdout_examples": "class-balanced sample of the held-out set for the utility (0 = all of it)",
    "valuation_budget": "coalition evaluations per round (e.g. 2000) or seconds per round (e.g. 30s) for ADS and "
                        "LOO together; auto then picks exact or a sampler that fits (unset = no budget)",
    "seeds": "number of seeds averaged over (the study runs them all on one engine)",
    "first_seed": "first seed of the study",
    "ks": "top-k sizes retrained, comma-separated",
    "clean_runs": "1: also run each seed with the label noise off (flagging false-positive rate); 0: skip",
    "repetitions": "random training/inference splits averaged over",
    "steps": "full-batch gradient-descent steps T (0 = the paper's: 600 breast-cancer, 200 diabetes)",
    "averaging": "conditional (mean over the splits that put an individual on each side) or all-splits",
    "target": "diabetes target: raw (the paper's) or standardized",
    "p": "population fraction at which alpha is reported",
    "attacks": "attacks to run, comma-separated (none = the honest baseline)",
    "attacker": "partition id of the attacking client",
    "source": "partition id the replicator copies",
    "noise_std": "standard deviation of the perturbing free-rider's noise",
    "inflation": "factor by which the inflating client multiplies its example count",
    "boost": "scale of the boosting attacker's update",
    "median_multiple": "claim review: cap at this multiple of the round's median claim",
    "jump_factor": "claim review: flag a claim above this multiple of the client's previous one",
    **{name: text for name, (_, text) in STRATEGY_PARAMETERS.items()},
    # augmentation and replication-market ([ADS] §6.1)
    "train_per_class": "original training instances per class (breast-cancer: of the majority class)",
    "test_per_class": "test instances per class (breast-cancer: of the majority class)",
    "rotation": "augmentation: largest rotation in degrees (drawn uniformly in ±rotation)",
    "shift": "augmentation: largest shift as a share of the image side",
    "scale": "augmentation: zoom drawn uniformly in 1 ± scale",
    "imbalance": "breast-cancer: minority count as a share of the majority count (train and test)",
    "smote_neighbors": "breast-cancer: Borderline-SMOTE neighbours",
    "k": "neighbours K of the KNN model and utility",
    "permutations": "permutations of MC-ADS and MC-DS per run",
    "max_fraction": "largest share of the synthetic instances removed or added",
    "fraction_steps": "steps from 0 to max-fraction",
    "contributors": "contributors sharing the originals",
    "max_copies": "replication: the broker adds 1..max-copies exact copies of every original",
}

def _parse_tuple(kind):
    def parse(text: str):
        try:
            return tuple(kind(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values; got {text!r}") from None
    return parse


#: reStructuredText roles and literals in docstrings and help texts, and their plain-text form.
_ROLE = re.compile(r":(?:func|class|mod|meth|data|attr):`~?(?:[\w.]+\.)?([\w]+)`")
_LITERAL = re.compile(r"``(.+?)``")


def plain(text: str) -> str:
    """``text`` as plain text for a terminal: ``literal`` -> literal, :func:`a.b` -> b."""
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text))


def _parser(commands, name: str, **options) -> argparse.ArgumentParser:
    """A sub-command parser: no abbreviated options (``--num-client`` is not ``--num-clients``),
    help in plain text."""
    if "help" in options:
        options["help"] = plain(options["help"])
    return commands.add_parser(name, allow_abbrev=False, **options)


def _add_config_options(parser: argparse.ArgumentParser, config_cls, own_help=None) -> None:
    """One ``--option`` per field of ``config_cls``; its help from ``own_help`` (the simulation's
    own texts), else :data:`PARAMETER_HELP`."""
    own_help = own_help or {}
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        hint = hints[f.name]
        default = f.default
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None: None unless given
            (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if typing.get_origin(hint) is tuple:
            (kind, _) = typing.get_args(hint)
            parse = _parse_tuple(kind)
            shown = ",".join(str(v) for v in default)
        else:
            parse, shown = hint, ("unset" if default is None else default)
        parser.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, type=parse, default=default, metavar=f.name.upper(),
            help=plain(f"{own_help.get(f.name) or PARAMETER_HELP.get(f.name, '')} (default: {shown})"),
        )


def _finite_non_negative(name: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (value >= 0 and value != float("inf")):
            raise argparse.ArgumentTypeError(f"{name}: expected a finite number >= 0; got {text!r}")
        return value
    return parse


def _finite_positive(name: str):
    def parse(text: str) -> float:
        value = _finite_non_negative(name)(text)
        if value == 0:
            raise argparse.ArgumentTypeError(f"{name}: expected a finite number > 0; got {text!r}")
        return value
    return parse


def _simulations_epilog() -> str:
    lines = ["simulations and their parameters (fedvalue run SIMULATION --help for details):"]
    for name, simulation in SIMULATIONS.items():
        lines.append(f"  {name}")
        for f in dataclasses.fields(simulation.config):
            lines.append(f"      --{f.name.replace('_', '-')} (default {f.default})")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedvalue", description="Federated learning with contributor books.",
                                     allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{run,report,audit,keygen}")
    run = _parser(
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
                     help="Ed25519 private key (fedvalue keygen) signing the run's seals and its manifest")
    simulations = run.add_subparsers(dest="simulation", required=False, metavar="SIMULATION")
    for name, simulation in SIMULATIONS.items():
        config_cls = simulation.config
        sim = _parser(simulations, name, prog=f"fedvalue run {name}",
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
                             help="Ed25519 private key (fedvalue keygen) signing each round's seal and the final "
                                  "manifest, so `fedvalue audit --public-key` fails any rewrite of the run")
        sim.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
        sim.add_argument("--quiet", action="store_true", help="no per-round progress")
        _add_config_options(sim, config_cls, simulation.help)
    report = _parser(commands, "report", help="print a run's per-client summary sorted by value")
    report.add_argument("run_dir", help="a run directory written by fedvalue run")
    report.add_argument("--plots", action="store_true",
                        help="write PNG figures to DIR/figures/ (cumulative value, value heat map, flows, utility)")
    report.add_argument("--html", action="store_true",
                        help="write DIR/report.html: tables and figures in one self-contained page")
    audit = _parser(commands, "audit", help="verify a run's hash chain, schema and group efficiency (exit 1 if not)")
    audit.add_argument("run_dir", help="a run directory written by fedvalue run")
    audit.add_argument("--tolerance", type=_finite_non_negative("tolerance"), default=1e-6,
                       help="allowed group-efficiency gap (a finite number >= 0)")
    audit.add_argument("--no-recompute", action="store_true",
                       help="skip recomputing every value from the saved round records")
    audit.add_argument("--public-key", metavar="PEM",
                       help="the signer's Ed25519 public key: every seal and the manifest must carry its signature")
    audit.add_argument("--expect-head", metavar="HASH",
                       help="a chain head published elsewhere (64 hex digits): the run must end at it")
    audit.add_argument("--budget", metavar="SECONDS", type=_finite_positive("budget"), default=3600.0,
                       help="seconds the audit may take; what it has not checked by then is not verifiable "
                            "(default: 3600)")
    keygen = _parser(commands, "keygen", help="write a new Ed25519 key pair for signing runs")
    keygen.add_argument("private_key", help="new file for the private key (PEM, owner-readable only)")
    keygen.add_argument("public_key", help="new file for the public key (PEM), to give auditors")
    return parser


def _run(args: argparse.Namespace) -> int:
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
        config = simulation.config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(simulation.config)})
    sign_key = None
    if getattr(args, "sign_key", None):
        from fedvalue.run.seals import Signer

        sign_key = Signer.from_file(args.sign_key)  # a bad key is refused before anything is written
    options = RunOptions(out=args.out, overwrite=args.overwrite, quiet=args.quiet,
                         resume=bool(getattr(args, "resume", None)), started=time.perf_counter(), sign_key=sign_key)
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
    saved = _saved_run_config(directory)
    if saved is None:
        raise ValueError(f"--resume: expected the directory of a run to continue, holding run.json; {directory} "
                         "has none.")
    name = saved.get("simulation")
    if name not in resumable:
        raise ValueError(f"--resume: {directory}/run.json names the simulation {name!r}; only {resumable} runs "
                         "can be resumed.")
    args.simulation = name
    for f in dataclasses.fields(SIMULATIONS[name].config):
        setattr(args, f.name, f.default)
    args.out, args.resume, args.overwrite = None, directory, False
    args.quiet, args.sign_key = args.quiet_alone, args.sign_key_alone


def _config_for_resume(config_cls, args: argparse.Namespace):
    """The configuration saved in ``args.resume``/run.json; an option given on the command line
    must agree with it (a changed setting would not continue the same run)."""
    from pathlib import Path

    from fedvalue.run.rundir import resolve

    if args.out is not None and resolve(args.out) != resolve(args.resume):
        raise ValueError(f"out: --resume continues the run in {args.resume}; got another --out {args.out}.")
    saved = _saved_run_config(args.resume)
    if saved is None:
        raise ValueError(f"resume: expected a run directory holding run.json; {args.resume} has none.")
    if saved.get("simulation") != args.simulation:
        raise ValueError(f"resume: {args.resume} holds a {saved.get('simulation')!r} run; got simulation "
                         f"{args.simulation!r}.")
    config = saved_config(config_cls, saved, source=str(Path(args.resume) / RUN_CONFIG_FILE))
    for f in dataclasses.fields(config_cls):
        value, given = getattr(config, f.name), getattr(args, f.name)
        if given != f.default and given != value:
            raise ValueError(f"{f.name}: the run in {args.resume} was started with {value!r}; got {given!r}. "
                             "A resumed run keeps its settings.")
    return config


def _saved_run_config(run_dir: str) -> dict | None:
    """The configuration in ``run_dir``/run.json (None when there is none; ValueError when it
    is not a JSON object or not a regular file), read through :mod:`fedvalue.run.rundir`."""
    from fedvalue.run.ledger_tables import read_run_config
    from fedvalue.run.rundir import RunDir

    try:
        run = RunDir(run_dir)
    except FileNotFoundError:
        return None
    with run:
        return read_run_config(run) if run.exists(RUN_CONFIG_FILE) else None


def _report(args: argparse.Namespace) -> int:
    from fedvalue.analysis.report import figure_dirs, html_report, write_figures
    from fedvalue.run.rundir import RunDir, UnsafeRunFile, printable
    from fedvalue.schema import LEDGER_FILE

    try:  # opened once: every file below is read and written through it, every path printed is its
        run = RunDir(args.run_dir)
    except (FileNotFoundError, UnsafeRunFile):
        what = "a directory written by fedvalue run" if args.plots or args.html else "a fedvalue run directory"
        raise FileNotFoundError(f"run_dir: expected {what}; {printable(args.run_dir)} is not a directory.") from None
    with run:
        if run.exists(LEDGER_FILE) or not (args.plots or args.html):
            _print_books(run)
        if args.plots:
            runs = figure_dirs(run)
            if not runs:
                print(f"{run.show()} holds no ledger, here or below: --plots draws a run's books; --html shows this "
                      "directory's tables and figures")
            for books in runs:
                print("wrote " + ", ".join(printable(path) for path in write_figures(books)))
        if args.html:
            print(f"wrote {printable(html_report(run))}")
    return 0


def _print_books(run_dir) -> None:
    import pandas as pd

    from fedvalue.analysis.findings import findings_lines, run_findings
    from fedvalue.run.ledger_tables import load_run
    from fedvalue.run.rundir import printable

    run = load_run(run_dir)
    lines = []
    try:  # everything is computed before anything is printed: a bad ledger gives one message
        summary = run.summary()
        with pd.option_context("display.max_rows", None, "display.width", 120):
            lines.append(summary.to_string(float_format=lambda v: f"{v:.4f}"))
        if "noisy" in summary and summary["noisy"].notna().any():
            for column in [c for c in summary.columns if c.startswith("total_")]:
                by_noise = summary.groupby("noisy")[column].mean()
                lines.append(f"mean {column}: noisy {by_noise.get(True, float('nan')):.4f}, "
                             f"clean {by_noise.get(False, float('nan')):.4f}")
        figures = run.run_summary()
        findings = findings_lines(run_findings(run))  # detection and top-k selection
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as error:
        raise ValueError(f"run_dir: the ledger in {run_dir} cannot be summarized ({type(error).__name__}: "
                         f"{error}); `fedvalue audit {run_dir}` says what is wrong with it.") from None
    print("\n".join(printable(line, 10_000) for line in "\n".join(lines).splitlines()))
    print("run:")
    print_run_summary(figures)
    for line in findings:
        print(printable(line, 10_000))
    return 0


def _audit_context(run_dir: str) -> tuple[Simulation | None, dict, str | None]:
    """The simulation that made ``run_dir`` and what the audit rebuilds from its run.json
    (:func:`fedvalue.audit.verdict.audit_run` keywords), or why nothing could be rebuilt."""
    try:
        saved = _saved_run_config(run_dir) or {}
    except (ValueError, OSError) as error:
        return None, {}, str(error)
    name = saved.get("simulation")
    simulation = SIMULATIONS.get(name) if isinstance(name, str) else None
    if simulation is None:
        return None, {}, "run.json names no fedvalue simulation"
    outside = sorted(key for key, value in saved.items() if key.endswith("_path") and value not in ("", None))
    if outside:  # the audit reads the run directory only
        return simulation, {}, (f"run.json names data outside the run directory ({', '.join(outside)}); the audit "
                                "opens no file outside it, so it does not rebuild the run's utility")
    saved = {**saved, "ray_address": None} if "ray_address" in saved else saved  # an audit connects nowhere
    try:
        if simulation.audit_from_run is not None:
            return simulation, simulation.audit_from_run(saved), None
        if simulation.utility_from_run is not None:
            return simulation, {"utility": simulation.utility_from_run(saved)}, None
    except Exception as error:  # noqa: BLE001 - a run.json no simulation accepts is a finding, not a crash
        return simulation, {}, f"run.json's settings do not rebuild the run's utility ({type(error).__name__}: {error})"
    return simulation, {}, None


def _audit(args: argparse.Namespace) -> int:
    import os
    import re

    from fedvalue.audit.verdict import audit_run
    from fedvalue.run.rundir import printable, resolve
    from fedvalue.run.seals import Verifier

    verifier = Verifier.from_file(args.public_key) if args.public_key else None
    if args.expect_head is not None and not re.fullmatch(r"[0-9a-f]{64}", args.expect_head):
        raise ValueError(f"expect_head: expected a chain head of 64 lowercase hex digits; got {args.expect_head!r}.")
    args.run_dir = resolve(args.run_dir)  # once: the audit, the replay and the verdict name this one
    if not os.path.isdir(args.run_dir):
        raise FileNotFoundError(f"run_dir: expected a fedvalue run directory; {printable(args.run_dir)} is not a "
                                "directory.")
    started = time.monotonic()
    simulation, rebuilt, why_not = (None, {}, None) if args.no_recompute else _audit_context(args.run_dir)
    replayed = simulation is not None and simulation.replay_check is not None
    report = audit_run(args.run_dir, tolerance=args.tolerance, verifier=verifier, expect_head=args.expect_head,
                       recompute=not (args.no_recompute or replayed), budget_seconds=args.budget, **rebuilt)
    if replayed and report.problems and (verifier is not None or args.expect_head is not None):
        report.unverifiable.append("replay: not run, the files already failed the checks above")  # verify, then work
    elif replayed:  # no saved model states to recompute from: the run is replayed from run.json instead
        try:
            checks, problems = simulation.replay_check(args.run_dir,
                                                       timeout=max(1.0, args.budget - (time.monotonic() - started)))
        except Exception as error:  # noqa: BLE001 - fail closed on whatever the files hold
            checks, problems = [], []
            report.unverifiable.append(f"replay: the run cannot be replayed from run.json ({type(error).__name__}: "
                                       f"{error})")
        report.checks += checks
        report.problems += problems
    elif why_not is not None and "utility" not in rebuilt:
        report.unverifiable = [u.replace("(no utility to rebuild the round games with)", f"({why_not})")
                               for u in report.unverifiable]
    for status, what in report.verdicts():
        print(printable(f"{ {'verified': 'ok', 'failed': 'FAILED', 'not verifiable': 'NOT VERIFIABLE'}[status]}: "
                        f"{what}", 2000))
    for note in report.notes:
        print(printable(f"note: {note}", 2000))
    print(f"run: {report.identity()}")
    print(printable(f"{args.run_dir}: {report.rounds} rounds, {report.ledger_rows} ledger rows: {report.verdict}",
                    2000))
    return 0 if report.intact else 1


def _keygen(args: argparse.Namespace) -> int:
    from fedvalue.run.seals import generate_keypair

    fingerprint = generate_keypair(args.private_key, args.public_key)
    print(f"wrote {args.private_key} (keep it secret) and {args.public_key} (give it to auditors); key "
          f"fingerprint {fingerprint}")
    return 0


#: The library names run-directory parameters in Python's words; the command line says them in
#: its own (a message that gives both, "resume=True (--resume DIR)", keeps the second).
_CLI_WORDS = (
    (re.compile(r"\b(?:resume|overwrite)=True \((--[\w-]+(?: DIR)?)\)"), r"\1"),
    (re.compile(r"\bresume=True\b"), "--resume DIR"),
    (re.compile(r"\boverwrite=True\b"), "--overwrite"),
    # An option left out is None in Python; on the command line it is not given at all.
    (re.compile(r" or None(?=[;.,)])"), " (or leave the option out)"),
)


def command_line_options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Python parameter name -> its long option (``clients_per_round`` -> ``--clients-per-round``),
    for every option of ``parser`` and its sub-commands."""
    options: dict[str, str] = {}
    for action in parser._actions:  # argparse keeps no public list of a parser's options
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options.update(command_line_options(sub))
        long = [o for o in action.option_strings if o.startswith("--")]
        if long and action.dest != "help":
            options.setdefault(action.dest, long[0])
    return options


def in_cli_words(message: str, options: Mapping[str, str] | None = None) -> str:
    """An error raised by the Python interface, in the command line's words: ``resume=True``
    as ``--resume DIR``, and a parameter named as ``name:`` or ``name=value`` as its option
    (``options``: :func:`command_line_options`)."""
    for pattern, replacement in _CLI_WORDS:
        message = pattern.sub(replacement, message)
    for name, option in (options or {}).items():
        message = re.sub(rf"(^|; |\. )({re.escape(name)}):", rf"\g<1>{option}:", message)
        message = re.sub(rf"(?<![\w-]){re.escape(name)}=(?!True\b)", f"{option} ", message)
    return message


def _interrupted(error: BaseException, args: argparse.Namespace) -> str:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    commands = {"audit": _audit, "run": _run, "report": _report, "keygen": _keygen}
    try:
        return commands[args.command](args)
    except (ValueError, FileNotFoundError) as error:
        from fedvalue.run.rundir import printable

        print(f"fedvalue: error: {printable(in_cli_words(str(error), command_line_options(parser)), 4000)}",
              file=sys.stderr)
        return 2
    except OSError as error:  # an unwritable --out, a path under a file, ...
        print(f"fedvalue: error: {getattr(error, 'filename', None) or 'path'}: {error.strerror or error}",
              file=sys.stderr)
        return 2
    except NoClientValued as error:
        print(f"fedvalue: run failed: {error}", file=sys.stderr)
        return 1
    except EngineFailed as error:  # one line: the cause and the option to change
        from fedvalue.run.rundir import printable

        print(f"fedvalue: error: {printable(in_cli_words(str(error), command_line_options(parser)), 4000)}",
              file=sys.stderr)
        return 1
    except (RunInterrupted, KeyboardInterrupt) as error:
        print(f"fedvalue: interrupted: {_interrupted(error, args)}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
