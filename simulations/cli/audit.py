"""``fedvalue audit DIR``: verify a run's chain, seals and books, and recompute its values."""

from __future__ import annotations

import argparse
import time

from simulations.cli.options import finite_non_negative, finite_positive, subcommand
from simulations.cli.registry import SIMULATIONS
from simulations.runner.config_checks import saved_run_config
from simulations.runner.simulation import Simulation


def add_parser(commands) -> None:
    audit = subcommand(commands, "audit", help="verify a run's hash chain, schema and group efficiency (exit 1 if not)")
    audit.add_argument("run_dir", help="a run directory written by fedvalue run")
    audit.add_argument("--tolerance", type=finite_non_negative("tolerance"), default=1e-6,
                       help="allowed group-efficiency gap (a finite number >= 0)")
    audit.add_argument("--no-recompute", action="store_true",
                       help="skip recomputing every value from the saved round records")
    audit.add_argument("--public-key", metavar="PEM",
                       help="the signer's Ed25519 public key: every seal and the manifest must carry its signature")
    audit.add_argument("--expect-head", metavar="HASH",
                       help="a chain head published elsewhere (64 hex digits): the run must end at it")
    audit.add_argument("--budget", metavar="SECONDS", type=finite_positive("budget"), default=3600.0,
                       help="seconds the audit may take; what it has not checked by then is not verifiable "
                            "(default: 3600)")


def _audit_context(run_dir: str) -> tuple[Simulation | None, dict, str | None]:
    """The simulation that made ``run_dir`` and what the audit rebuilds from its run.json
    (:func:`fedvalue.audit.verdict.audit_run` keywords), or why nothing could be rebuilt."""
    try:
        saved = saved_run_config(run_dir) or {}
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


def audit_command(args: argparse.Namespace) -> int:
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


