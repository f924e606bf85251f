"""The ``fedvalue`` command: one sub-command a module (``run``, ``report``, ``audit``, ``keygen``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from simulations.cli import audit, keygen, report, run
from simulations.cli.options import command_line_options, in_cli_words
from simulations.runner.api import NoClientValued
from simulations.runner.engine import INTERRUPTED_EXIT_CODE
from simulations.runner.engine_failures import EngineFailed
from strategies import RunInterrupted

#: Sub-command name -> (adds its parser, runs it).
COMMANDS = {"run": (run.add_parser, run.run_command), "report": (report.add_parser, report.report_command),
            "audit": (audit.add_parser, audit.audit_command), "keygen": (keygen.add_parser, keygen.keygen_command)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedvalue", description="Federated learning with contributor books.",
                                     allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{run,report,audit,keygen}")
    for add_parser, _ in COMMANDS.values():
        add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = "fedvalue " + shlex.join(sys.argv[1:] if argv is None else argv)  # heads results files
    try:
        return COMMANDS[args.command][1](args)
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
        print(f"fedvalue: interrupted: {run.interrupted(error, args)}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
