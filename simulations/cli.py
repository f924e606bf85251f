"""The ``fedvalue`` command: ``fedvalue run SIMULATION --out DIR [...]``, ``fedvalue report DIR``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import typing
from collections.abc import Sequence

from fedvalue.schema import RUN_CONFIG_FILE
from simulations.api import NoClientValued
from simulations.console import RunOptions, print_run_summary
from simulations.engine import INTERRUPTED_EXIT_CODE
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
                     "(0 = run all m* permutations)",
    "utility": "accuracy, neg_loss",
    "num_cpus_per_client": "CPUs Ray gives each client",
    "num_gpus_per_client": "GPUs Ray gives each client (0 = none; fractions share a GPU)",
    "device": "torch device of the server's valuation (the utility's forward passes): cpu, cuda, cuda:1, ...",
    "max_parallel_clients": "clients training at once (0 = sized for the machine)",
    "ray_address": "attach to an existing Ray cluster at this address",
    "round_timeout": "seconds to wait for a round's replies",
    "query_timeout": "seconds to wait for the clients to report their partition ids (raise it on a loaded "
                     "machine)",
    "valuation_workers": "Ray actors scoring coalitions in parallel (0 = in the server process)",
    "model": "mlp (--hidden layers) or cnn (LeNet-5-style, for square images)",
    "examples_per_client": "class-balanced training examples per client (0 = equal shares of the whole training "
                           "pool); [ADS] 6.2 uses 120",
    "holdout_examples": "class-balanced sample of the held-out set for the utility (0 = all of it)",
    "valuation_budget": "coalition evaluations per round (e.g. 2000) or seconds per round (e.g. 30s) for ADS and "
                        "LOO together; auto then picks exact or a sampler that fits (empty = no budget)",
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
    **{name: text for simulation in SIMULATIONS.values() for name, text in simulation.help.items()},
    # augmentation and replication-market ([ADS] §6.1)
    "runs": "independent runs (seeds seed, seed+1, ...) averaged in the figure",
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


def _add_config_options(parser: argparse.ArgumentParser, config_cls) -> None:
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        hint = hints[f.name]
        default = f.default
        if typing.get_origin(hint) is tuple:
            (kind, _) = typing.get_args(hint)
            parse = _parse_tuple(kind)
            shown = ",".join(str(v) for v in default)
        else:
            parse, shown = hint, default
        parser.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, type=parse, default=default, metavar=f.name.upper(),
            help=f"{PARAMETER_HELP.get(f.name, '')} (default: {shown})",
        )


def _simulations_epilog() -> str:
    lines = ["simulations and their parameters (fedvalue run SIMULATION --help for details):"]
    for name, simulation in SIMULATIONS.items():
        lines.append(f"  {name}")
        for f in dataclasses.fields(simulation.config):
            lines.append(f"      --{f.name.replace('_', '-')} (default {f.default})")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedvalue", description="Federated learning with contributor books.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{run,report,audit,keygen}")
    run = commands.add_parser(
        "run", help="run a simulation and write its ledger", epilog=_simulations_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    simulations = run.add_subparsers(dest="simulation", required=True, metavar="SIMULATION")
    for name, simulation in SIMULATIONS.items():
        config_cls = simulation.config
        sim = simulations.add_parser(name, help=(sys.modules[config_cls.__module__].__doc__ or "").splitlines()[0])
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
        _add_config_options(sim, config_cls)
    report = commands.add_parser("report", help="print a run's per-client summary sorted by value")
    report.add_argument("run_dir", help="a run directory written by fedvalue run")
    report.add_argument("--plots", action="store_true",
                        help="write PNG figures to DIR/figures/ (cumulative value, value heat map, flows, utility)")
    report.add_argument("--html", action="store_true",
                        help="write DIR/report.html: tables and figures in one self-contained page")
    audit = commands.add_parser("audit", help="verify a run's hash chain, schema and group efficiency (exit 1 if not)")
    audit.add_argument("run_dir", help="a run directory written by fedvalue run")
    audit.add_argument("--tolerance", type=float, default=1e-6, help="allowed group-efficiency gap")
    audit.add_argument("--no-recompute", action="store_true",
                       help="skip recomputing every value from the saved round records")
    audit.add_argument("--public-key", metavar="PEM",
                       help="the signer's Ed25519 public key: every seal and the manifest must carry its signature")
    audit.add_argument("--expect-head", metavar="HASH",
                       help="a chain head published elsewhere (64 hex digits): the run must end at it")
    keygen = commands.add_parser("keygen", help="write a new Ed25519 key pair for signing runs")
    keygen.add_argument("private_key", help="new file for the private key (PEM, owner-readable only)")
    keygen.add_argument("public_key", help="new file for the public key (PEM), to give auditors")
    return parser


def _run(args: argparse.Namespace) -> int:
    simulation = SIMULATIONS[args.simulation]
    if getattr(args, "resume", None):
        config = _config_for_resume(simulation.config, args)
        args.out = args.resume
    else:
        if simulation.resumable and args.out is None:
            raise ValueError("out: expected --out DIR for the run's ledger (or --resume DIR to continue a run).")
        config = simulation.config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(simulation.config)})
    sign_key = None
    if getattr(args, "sign_key", None):
        from fedvalue.seals import Signer

        sign_key = Signer.from_file(args.sign_key)  # a bad key is refused before anything is written
    options = RunOptions(out=args.out, overwrite=args.overwrite, quiet=args.quiet,
                         resume=bool(getattr(args, "resume", None)), started=time.perf_counter(), sign_key=sign_key)
    return simulation.main(config, options)


def _config_for_resume(config_cls, args: argparse.Namespace):
    """The configuration saved in ``args.resume``/run.json; an option given on the command line
    must agree with it (a changed setting would not continue the same run)."""
    from pathlib import Path

    if args.out is not None and Path(args.out) != Path(args.resume):
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
    is not a JSON object or not a regular file)."""
    from fedvalue import rundir
    from fedvalue.ledger import read_run_config

    return read_run_config(run_dir) if rundir.exists(run_dir, RUN_CONFIG_FILE) else None


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fedvalue.report import figure_dirs, html_report, write_figures
    from fedvalue.schema import LEDGER_FILE

    if (Path(args.run_dir) / LEDGER_FILE).exists() or not (args.plots or args.html):
        _print_books(args.run_dir)
    if args.plots:
        runs = figure_dirs(args.run_dir)
        if not runs:
            print(f"{args.run_dir} holds no ledger, here or below: --plots draws a run's books; --html shows this "
                  "directory's tables and figures")
        for run_dir in runs:
            print("wrote " + ", ".join(str(path) for path in write_figures(run_dir)))
    if args.html:
        print(f"wrote {html_report(args.run_dir)}")
    return 0


def _print_books(run_dir: str) -> None:
    import pandas as pd

    from fedvalue.ledger import load_run

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
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
        raise ValueError(f"run_dir: the ledger in {run_dir} cannot be summarized ({type(error).__name__}: "
                         f"{error}); `fedvalue audit {run_dir}` says what is wrong with it.") from None
    print("\n".join(lines))
    print("run:")
    print_run_summary(figures)
    return 0


def _audit_context(run_dir: str) -> tuple[Simulation | None, dict, str | None]:
    """The simulation that made ``run_dir`` and what the audit rebuilds from its run.json
    (:func:`fedvalue.audit.audit_run` keywords), or why nothing could be rebuilt."""
    try:
        saved = _saved_run_config(run_dir) or {}
    except ValueError as error:
        return None, {}, str(error)
    name = saved.get("simulation")
    simulation = SIMULATIONS.get(name) if isinstance(name, str) else None
    if simulation is None:
        return None, {}, "run.json names no fedvalue simulation"
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

    from fedvalue.audit import audit_run
    from fedvalue.seals import Verifier

    verifier = Verifier.from_file(args.public_key) if args.public_key else None
    if args.expect_head is not None and not re.fullmatch(r"[0-9a-f]{64}", args.expect_head):
        raise ValueError(f"expect_head: expected a chain head of 64 lowercase hex digits; got {args.expect_head!r}.")
    if not os.path.isdir(args.run_dir):
        raise FileNotFoundError(f"run_dir: expected a fedvalue run directory; {args.run_dir} is not a directory.")
    simulation, rebuilt, why_not = (None, {}, None) if args.no_recompute else _audit_context(args.run_dir)
    replayed = simulation is not None and simulation.replay_check is not None
    report = audit_run(args.run_dir, tolerance=args.tolerance, verifier=verifier, expect_head=args.expect_head,
                       recompute=not (args.no_recompute or replayed), **rebuilt)
    if replayed:  # no saved model states to recompute from: the run is replayed from run.json instead
        try:
            checks, problems = simulation.replay_check(args.run_dir)
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
        print(f"{ {'verified': 'ok', 'failed': 'FAILED', 'not verifiable': 'NOT VERIFIABLE'}[status]}: {what}")
    for note in report.notes:
        print(f"note: {note}")
    print(f"{args.run_dir}: {report.rounds} rounds, {report.ledger_rows} ledger rows: {report.verdict}")
    return 0 if report.intact else 1


def _keygen(args: argparse.Namespace) -> int:
    from fedvalue.seals import generate_keypair

    fingerprint = generate_keypair(args.private_key, args.public_key)
    print(f"wrote {args.private_key} (keep it secret) and {args.public_key} (give it to auditors); key "
          f"fingerprint {fingerprint}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"audit": _audit, "run": _run, "report": _report, "keygen": _keygen}
    try:
        return commands[args.command](args)
    except (ValueError, FileNotFoundError) as error:
        print(f"fedvalue: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # an unwritable --out, a path under a file, ...
        print(f"fedvalue: error: {getattr(error, 'filename', None) or 'path'}: {error.strerror or error}",
              file=sys.stderr)
        return 2
    except NoClientValued as error:
        print(f"fedvalue: run failed: {error}", file=sys.stderr)
        return 1
    except (RunInterrupted, KeyboardInterrupt) as error:
        print(f"fedvalue: interrupted: {error or 'stopped at once'}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
