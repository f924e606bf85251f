"""``fedvalue report DIR [--plots] [--html]``: a run's per-client books, figures and page."""

from __future__ import annotations

import argparse

from simulations.cli.options import finite_non_negative, subcommand
from simulations.runner.console import print_run_summary


def add_parser(commands) -> None:
    report = subcommand(commands, "report", help="print a run's per-client summary sorted by value")
    report.add_argument("run_dir", help="a run directory written by fedvalue run or by a ValuingStrategy in your own "
                                        "app (flwr run, simulate)")
    report.add_argument("--plots", action="store_true",
                        help="write PNG figures to DIR/figures/ (cumulative value, value heat map, flows, utility)")
    report.add_argument("--html", action="store_true",
                        help="write DIR/report.html: tables and figures in one self-contained page")
    report.add_argument("--payout", metavar="BUDGET", type=finite_non_negative("payout"),
                        help="write DIR/payout.csv: BUDGET shared among the clients by --rule from their --method "
                             "totals (the rule, floor and budget are stated on every row)")
    report.add_argument("--rule", choices=("share-of-positive", "equal"), default="share-of-positive",
                        help="payout rule: share-of-positive (in proportion to total value above the floor) or "
                             "equal (the same to every client above it) (default: share-of-positive)")
    report.add_argument("--method",
                        help="the ledger method whose totals are paid, e.g. ads, ads_defended, loo (default: "
                             "ads_defended when the run booked it, else ads); every book of identity-gamed value "
                             "(ads, loo, tracin_outflow and their defended books) only with --allow-undefended")
    report.add_argument("--allow-undefended", action="store_true",
                        help="with --payout: pay from a book the defences do not vouch for against identity games "
                             "(every book: an attacker that knows the defences' thresholds buys ADS, LOO and TracIn "
                             "outflow with several identities, docs/faults-and-audit.md); give it where each "
                             "identity is a distinct, verified participant; payout.csv's rows then say undefended")
    report.add_argument("--floor", type=finite_non_negative("floor"), default=0.0,
                        help="a client is paid only when its total is above this (default: 0)")


def report_command(args: argparse.Namespace) -> int:
    from fedvalue.analysis.report import figure_dirs, html_report, write_figures
    from fedvalue.analysis.payout import check_default_payable, check_payable
    from fedvalue.run.rundir import RunDir, UnsafeRunFile, printable
    from fedvalue.schema import LEDGER_FILE

    if args.payout is not None and args.method is not None:  # a refused book is said before anything is read
        check_payable(args.method, args.allow_undefended)
    elif args.payout is not None:
        check_default_payable(args.allow_undefended)
    elif args.allow_undefended:
        raise ValueError("allow_undefended: expected --payout BUDGET with it (it opts a payout in); got no --payout.")
    try:  # opened once: every file below is read and written through it, every path printed is its
        run = RunDir(args.run_dir)
    except (FileNotFoundError, UnsafeRunFile):
        what = ("a run directory (fedvalue run's or a ValuingStrategy's)" if args.plots or args.html
                else "a fedvalue run directory")
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
        if args.payout is not None:
            _write_payout(run, args)
    return 0


def _write_payout(run, args: argparse.Namespace) -> None:
    """DIR/payout.csv from the run's ledger (:func:`fedvalue.analysis.payout.payout_table`), and its table printed;
    without ``--method``, from :func:`fedvalue.analysis.payout.default_payout_method`'s book, which the last line
    names. Floats are written as repr writes them, so the audit reads back the exact numbers."""
    import sys

    from fedvalue.analysis.payout import UNDEFENDED, default_payout_method, payout_table
    from fedvalue.analysis.run_summary import load_run
    from fedvalue.run.rundir import printable
    from fedvalue.schema import PAYOUT_FILE

    ledger = load_run(run).ledger
    method = default_payout_method(ledger) if args.method is None else args.method
    table = payout_table(ledger, args.payout, method=method, rule=args.rule, floor=args.floor,
                         allow_undefended=args.allow_undefended)
    run.write_text(PAYOUT_FILE, table.to_csv(index=False, lineterminator="\n"))
    for line in table.to_string(index=False, float_format=lambda v: f"{v:.6g}").splitlines():
        print(printable(line, 2000))
    undefended = method in UNDEFENDED
    if undefended:
        print(f"fedvalue: warning: --method {method}: paid from a book the defences do not vouch for "
              f"(--allow-undefended): {UNDEFENDED[method]}", file=sys.stderr)
    if args.method is not None:
        chosen = ""
    elif method == "ads_defended":
        chosen = ", the default: the run booked the defended ADS"
    else:
        chosen = ", the default: the run booked no ads_defended"
    print(f"wrote {printable(run.path / PAYOUT_FILE)} ({args.rule}, floor {args.floor:g}, budget {args.payout:g}, "
          f"{method} totals{chosen}" + (", UNDEFENDED: paid by --allow-undefended" if undefended else "") + ")")


def _print_books(run_dir) -> None:
    import pandas as pd

    from fedvalue.analysis.findings import findings_lines, run_findings
    from fedvalue.analysis.run_summary import load_run
    from fedvalue.run.rundir import printable

    run = load_run(run_dir)
    lines = []
    try:  # everything is computed before anything is printed: a bad ledger gives one message
        summary = run.summary()
        shown = summary.loc[:, summary.notna().any()]  # a column without data (noisy without ground truth) is left out
        with pd.option_context("display.max_rows", None, "display.width", 120):
            lines.append(shown.to_string(float_format=lambda v: f"{v:.4f}"))
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


