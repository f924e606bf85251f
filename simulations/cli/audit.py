"""``fedvalue audit DIR``: verify a run's chain, seals and books, and recompute its values."""

from __future__ import annotations

import argparse
import json
import os
import time

from simulations.cli.options import finite_non_negative, finite_positive, subcommand
from simulations.cli.registry import SIMULATIONS
from simulations.runner.config_checks import saved_run_config
from simulations.runner.simulation import Simulation


def add_parser(commands) -> None:
    audit = subcommand(commands, "audit", help="verify a run's hash chain, schema and group efficiency (exit 1 if not)")
    audit.add_argument("run_dir", help="a run directory written by fedvalue run or by a ValuingStrategy in your own app")
    audit.add_argument("--tolerance", type=finite_non_negative("tolerance"), default=1e-6,
                       help="allowed group-efficiency gap (a finite number >= 0)")
    audit.add_argument("--no-recompute", action="store_true",
                       help="skip recomputing every value from the saved round records")
    audit.add_argument("--public-key", metavar="PEM",
                       help="the signer's public key (PEM, from fedvalue keygen): every seal and the manifest must carry its "
                            "signature; an EC key also checks model.sig with model-signing's own verifier")
    audit.add_argument("--expect-head", metavar="HASH",
                       help="a chain head published elsewhere (64 hex digits): the run must end at it")
    audit.add_argument("--utility", metavar="MODULE:CALLABLE",
                       help="the importable callable (no arguments) that rebuilds the run's utility U, e.g. "
                            "'my_app.task:held_out_utility', imported from the working directory; it replaces what "
                            "run.json names. Importing runs that module's code: name only code you trust")
    audit.add_argument("--trust-run-utility", action="store_true",
                       help="import the utility run.json names (module:callable) to recompute the values; a run "
                            "directory is untrusted input, so the audit imports nothing it names unless told so")
    audit.add_argument("--budget", metavar="SECONDS", type=finite_positive("budget"), default=3600.0,
                       help="seconds the audit may take; what it has not checked by then is not verifiable "
                            "(default: 3600)")
    audit.add_argument("--json", metavar="FILE",
                       help="also write the report to FILE as JSON (written whole when the audit ends): the verdict, "
                            "every check, finding and note, and what the recompute measured (replies bit for bit, to "
                            "1e-5 and only within float rounding; numbers only within float32 rounding of the utility; "
                            "their largest differences)")


def _audit_context(run_dir: str, utility: str | None = None, trust_run_utility: bool = False
                   ) -> tuple[Simulation | None, dict, str | None]:
    """The simulation that made ``run_dir`` and what the audit rebuilds from its run.json
    (:func:`fedvalue.audit.checks.audit_run` keywords), or why nothing could be rebuilt.
    ``utility`` (``--utility``) replaces the utility a simulation or run.json names."""
    try:
        saved = saved_run_config(run_dir) or {}
    except (ValueError, OSError) as error:
        return None, {}, str(error)
    name = saved.get("simulation")
    simulation = SIMULATIONS.get(name) if isinstance(name, str) else None
    if simulation is None or utility is not None:
        own, why_not = _own_utility(saved, utility, trust_run_utility)
        if simulation is None or own is None:
            return None, ({} if own is None else {"utility": own}), why_not
        rebuilt, why_not = _simulation_context(simulation, saved)[1:]
        return simulation, {**rebuilt, "utility": own}, why_not
    return _simulation_context(simulation, saved)


def _own_utility(saved: dict, utility: str | None, trust_run_utility: bool):
    """(U, None) rebuilt from ``--utility`` or, with ``--trust-run-utility``, the reference run.json
    names, its held-out data's digest checked against run.json's; else (None, why not)."""
    from fedvalue.run.run_info import UTILITY_REFERENCE_KEY, load_utility, utility_mismatch

    entry = saved.get(UTILITY_REFERENCE_KEY)
    entry = entry if isinstance(entry, dict) else {}
    named = entry.get("reference")
    if utility is None and not isinstance(named, str):
        return None, ("run.json names neither a fedvalue simulation nor the utility U the run scored with; give it: "
                      "--utility module:callable")
    if utility is None and not trust_run_utility:
        return None, (f"run.json names the utility {named!r}; importing it runs code the run directory names, so the "
                      f"audit does not do it unasked: give --utility {named} (or --trust-run-utility)")
    try:
        rebuilt = load_utility(named if utility is None else utility)
    except ValueError as error:
        return None, str(error)
    mismatch = utility_mismatch(rebuilt, entry)
    return (None, mismatch) if mismatch else (rebuilt, None)


def _simulation_context(simulation: Simulation, saved: dict) -> tuple[Simulation, dict, str | None]:
    """What ``simulation`` rebuilds from run.json's settings ``saved``, or why it cannot."""
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
    import re

    from fedvalue.audit.checks import audit_run
    from fedvalue.run.rundir import printable, resolve
    from fedvalue.run.seals import Verifier

    from fedvalue.run.run_info import check_reference

    if args.utility is not None:
        check_reference(args.utility)  # a malformed --utility is bad input (exit 2), before anything is read
    verifier = Verifier.from_file(args.public_key) if args.public_key else None
    if args.expect_head is not None and not re.fullmatch(r"[0-9a-f]{64}", args.expect_head):
        raise ValueError(f"expect_head: expected a chain head of 64 lowercase hex digits; got {args.expect_head!r}.")
    args.run_dir = resolve(args.run_dir)  # once: the audit, the replay and the verdict name this one
    if not os.path.isdir(args.run_dir):
        raise FileNotFoundError(f"run_dir: expected a fedvalue run directory; {printable(args.run_dir)} is not a "
                                "directory.")
    if args.json is not None:
        _check_json_file(args.json, args.run_dir)  # before the audit's work, not after it
    started = time.monotonic()
    simulation, rebuilt, why_not = ((None, {}, None) if args.no_recompute
                                    else _audit_context(args.run_dir, args.utility, args.trust_run_utility))
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
    print(printable(report.summary(), 2000))
    if args.json is not None:
        _write_json(args.json, report.as_dict())
    return 0 if report.intact else 1


def _check_json_file(path: str, run_dir: str) -> None:
    """``--json FILE`` names a file the audit can write: not a directory, in a directory that exists, and
    outside ``run_dir`` (a file there is one the run did not write: the next audit's finding)."""
    if os.path.isdir(path):
        raise ValueError(f"json: expected a file to write the report to; {path!r} is a directory.")
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(folder):
        raise ValueError(f"json: expected a file in an existing directory; {folder!r} is not one.")
    if os.path.commonpath([folder, os.path.realpath(run_dir)]) == os.path.realpath(run_dir):
        raise ValueError(f"json: expected a file outside the run directory; {path!r} is inside it.")


def _write_json(path: str, report: dict) -> None:
    """``report`` as JSON at ``path``, whole or not at all (a file beside it, renamed over it)."""
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
    os.replace(partial, path)


