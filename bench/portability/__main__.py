"""``python -m bench.portability {kernels,losses,table}``: the package docstring says what each does."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import portability
from bench.portability.plan import QUICK, STUDIES
from bench.portability.tables import read_results, render

#: What --out may hold besides nothing: what a study writes there.
OUT_ENTRIES = {"runs", "audits", "results.csv"}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command's parser and its subcommands' (their errors name the subcommand's options)."""
    parser = argparse.ArgumentParser(prog="python -m bench.portability", description=portability.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{kernels,losses,table}")
    subparsers = {}
    for name, what in (("kernels", "the main job's replies under five kernel sets (the first table)"),
                       ("losses", "neg_loss runs' numbers under three kernel sets (the second table)")):
        sub = commands.add_parser(name, help=what)
        sub.add_argument("--out", type=Path, required=True, metavar="DIR",
                         help="the runs, audits and their logs (made, or continued when it holds an earlier start)")
        sub.add_argument("--keep", type=Path, metavar="FILE",
                         help="the results file (.csv, headed by the command and commit; default DIR/results.csv)")
        sub.add_argument("--quick", action="store_true", help="two seeds or runs, two kernel sets: a smoke run")
        subparsers[name] = sub
    table = commands.add_parser("table", help="print the docs' table of a results file")
    table.add_argument("results", type=Path, metavar="RESULTS", help="a results file of kernels or losses")
    subparsers["table"] = table
    return parser, subparsers


def checked_out(out: Path) -> str | None:
    """Why ``--out`` cannot hold a study (None when it can): a file, or a folder holding other things."""
    if out.exists() and not out.is_dir():
        return f"--out: expected a directory for the runs and audits; {str(out)!r} is a file"
    others = sorted(entry.name for entry in out.iterdir() if entry.name not in OUT_ENTRIES) if out.is_dir() else []
    if others:
        return (f"--out: expected a new directory or one this command made (runs/, audits/); {str(out)!r} holds "
                f"{', '.join(others[:3])}")
    return None


def checked_keep(keep: Path | None) -> str | None:
    """Why ``--keep`` cannot be the results file (None when it can)."""
    if keep is not None and (keep.suffix != ".csv" or keep.is_dir()):
        return f"--keep: expected a .csv file for the results; got {str(keep)!r}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser, subparsers = build_parser()
    args = parser.parse_args(argv)
    sub = subparsers[args.command]
    if args.command == "table":
        try:
            rows = read_results(args.results)
        except (OSError, UnicodeDecodeError, ValueError) as error:
            sub.error(f"RESULTS: {error}")
        print(render(rows))
        return 0
    why_not = checked_out(args.out) or checked_keep(args.keep)
    if why_not:
        sub.error(why_not)
    from bench.portability.measure import measure  # here: fedvalue loads for a measurement only

    out = args.out.expanduser().resolve()
    command = "python -m bench.portability " + " ".join(sys.argv[1:] if argv is None else argv)
    study = (QUICK if args.quick else STUDIES)[args.command]
    print(render(measure(study, out, args.keep or out / "results.csv", command)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
