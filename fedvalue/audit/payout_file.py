"""The audit's check of ``payout.csv``, what ``fedvalue report --payout`` writes beside a run
(:mod:`fedvalue.analysis.payout`), when the run directory holds one.

The file is untrusted input, read as text: it must have :data:`~fedvalue.analysis.payout.PAYOUT_COLUMNS`
in order, one row per client, the same method, rule, floor, budget and ``undefended`` on every
row, finite numbers and True/False flags. Its payout is then recomputed from the audited ledger,
``payout_table(ledger, budget, method=, rule=, floor=, allow_undefended=undefended)``, and every
client's row must equal the recomputed one: the same clients, and for each the same
``total_value``, ``eligible``, ``payment`` and ``undefended``. The report writes floats as
``repr`` writes them (pandas' ``to_csv`` without a float format), which parse back to the same
double, so numbers are compared exactly: any difference is a changed number. Each finding names
the file, the client and the column; a file that cannot be read or parsed is one finding, never
an exception. A payout.csv written before the run's last round no longer matches its books.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter

import pandas as pd

from fedvalue.analysis.payout import PAYOUT_COLUMNS, payout_table
from fedvalue.audit.audit_files import RunFiles
from fedvalue.audit.report import AuditReport
from fedvalue.run.rundir import printable
from fedvalue.schema import PAYOUT_FILE

#: Most mismatching (client, column) pairs named one by one; the rest are counted.
MAX_NAMED = 10
#: Columns that state the payout's settings: one value on every row.
SETTINGS = ("method", "rule", "floor", "budget", "undefended")
#: Columns recomputed per client, and how a cell of each is parsed.
NUMBERS, FLAGS = ("total_value", "payment", "floor", "budget"), ("eligible", "undefended")
COMPARED = ("total_value", "eligible", "payment", "undefended")


class _Unreadable(ValueError):
    """What makes payout.csv unusable, as its finding says it (without the file's name)."""


def _cell(column: str, text: str, line: int) -> object:
    """A cell as the report wrote it: a finite float, True/False, or text."""
    if column in NUMBERS:
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise _Unreadable(f"line {line}: {column} is {printable(text, 40)!r}, expected a finite number")
        return number
    if column in FLAGS:
        if text not in ("True", "False"):
            raise _Unreadable(f"line {line}: {column} is {printable(text, 40)!r}, expected True or False")
        return text == "True"
    return text


def _read_payout(text: str) -> list[dict]:
    """payout.csv's rows as dicts of parsed cells (:func:`_cell`); :class:`_Unreadable` saying what
    is wrong and where (the line number counts the header as line 1)."""
    try:
        lines = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as error:
        raise _Unreadable(f"not CSV ({printable(error, 200)})") from None
    if not lines:
        raise _Unreadable(f"empty, expected the columns {list(PAYOUT_COLUMNS)} and a row per client")
    header = lines[0]
    if header != list(PAYOUT_COLUMNS):
        raise _Unreadable(f"columns {[printable(c, 40) for c in header[:16]]}, expected {list(PAYOUT_COLUMNS)}")
    if len(lines) == 1:
        raise _Unreadable("no rows, expected one per client the paid book values")
    rows = []
    for number, cells in enumerate(lines[1:], start=2):
        if len(cells) != len(PAYOUT_COLUMNS):
            raise _Unreadable(f"line {number} has {len(cells)} cells, expected {len(PAYOUT_COLUMNS)}")
        rows.append({column: _cell(column, cell, number) for column, cell in zip(PAYOUT_COLUMNS, cells)})
    for column in SETTINGS:
        stated = sorted({str(row[column]) for row in rows})
        if len(stated) > 1:
            shown = [printable(value, 40) for value in stated[:5]]
            raise _Unreadable(f"rows state {len(stated)} values of {column} ({shown}), expected one (the method, "
                              "rule, floor, budget and undefended of one payout on every row)")
    twice = sorted(client for client, rows_of in Counter(row["client_id"] for row in rows).items() if rows_of > 1)
    if twice:
        raise _Unreadable(f"clients {[printable(c, 40) for c in twice[:5]]} have more than one row, expected one "
                          "row per client")
    return rows


def payout_problems(text: str, ledger: pd.DataFrame) -> tuple[list[str], str | None]:
    """(findings, what was checked) for payout.csv's ``text`` against the payout ``ledger`` gives
    (module docstring): the findings name the file, the client and the column."""
    try:
        rows = _read_payout(text)
    except _Unreadable as error:
        return [f"{PAYOUT_FILE}: {error}"], None
    stated = rows[0]
    settings = (f"{printable(stated['method'], 40)}, {printable(stated['rule'], 40)}, floor {stated['floor']:g}, "
                f"budget {stated['budget']:g}")
    try:
        recomputed = payout_table(ledger, stated["budget"], method=stated["method"], rule=stated["rule"],
                                  floor=stated["floor"], allow_undefended=stated["undefended"])
    except (ValueError, TypeError, KeyError) as error:
        return [f"{PAYOUT_FILE}: the ledger gives no payout for its settings ({settings}): "
                f"{printable(error, 400)}"], None
    given = {row["client_id"]: row for row in rows}
    wanted = {str(row.client_id): {"total_value": float(row.total_value), "eligible": bool(row.eligible),
                                   "payment": float(row.payment), "undefended": bool(row.undefended)}
              for row in recomputed.itertuples(index=False)}
    problems = []
    extra, missing = sorted(set(given) - set(wanted)), sorted(set(wanted) - set(given))
    if extra:
        problems.append(f"{PAYOUT_FILE}: clients {[printable(c, 40) for c in extra[:10]]} are paid, the ledger's "
                        f"{printable(stated['method'], 40)} book values no such client")
    if missing:
        problems.append(f"{PAYOUT_FILE}: clients {[printable(c, 40) for c in missing[:10]]} of the ledger's "
                        f"{printable(stated['method'], 40)} book have no row")
    wrong = [(client, column) for client in wanted if client in given for column in COMPARED
             if given[client][column] != wanted[client][column]]
    problems += [f"{PAYOUT_FILE}: client {printable(client, 40)}: {column} is {given[client][column]!r}; the ledger "
                 f"gives {wanted[client][column]!r}" for client, column in wrong[:MAX_NAMED]]
    if len(wrong) > MAX_NAMED:
        problems.append(f"{PAYOUT_FILE}: and {len(wrong) - MAX_NAMED} more (client, column) pairs that differ from "
                        "the payout the ledger gives")
    return problems, f"{PAYOUT_FILE} equals the payout the ledger gives ({settings}; {len(rows)} clients), exactly"


def check_payout_file(files: RunFiles, ledger: pd.DataFrame, report: AuditReport) -> None:
    """payout.csv, when the run directory holds it as a regular file (any other kind is a layout
    finding), against the payout ``ledger`` gives (module docstring); findings go to ``report``."""
    if files.kind(PAYOUT_FILE) != "a regular file":
        return
    try:
        text = files.text(PAYOUT_FILE)
    except (ValueError, OSError) as error:  # too large, not UTF-8, replaced while read
        report.problems.append(f"{PAYOUT_FILE}: unreadable ({type(error).__name__}: {printable(error, 200)})")
        return
    problems, checked = payout_problems(text, ledger)
    report.problems += problems
    if not problems and checked is not None:
        report.checks.append(checked)
