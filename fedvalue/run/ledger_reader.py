"""The ledger's tables read back: ledger.csv and rounds.csv as DataFrames with stable dtypes,
their rows typed (:class:`~fedvalue.schema.LedgerRow`, :class:`~fedvalue.schema.RoundRow`), and a
run directory's tables read whole and checked (:func:`read_tables`).

The tables are those :class:`fedvalue.run.ledger_tables.LedgerWriter` writes (its module docstring
names every column). A cell the file leaves empty reads as missing (NaN in a DataFrame, None in a
typed row); client ids stay the text the file holds (compare them with
:func:`fedvalue.schema.client_key`). Every file is read through :mod:`fedvalue.run.rundir`. What a
run's books add up to (per-client totals, run-level figures) is :mod:`fedvalue.analysis.run_summary`.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedvalue.run import rundir
from fedvalue.run.rundir import RunDir, open_run_dir
from fedvalue.run.run_info import read_run_config
from fedvalue.schema import (
    FIRST_ORDER_FILE,
    LEDGER_COLUMNS,
    LEDGER_FILE,
    ROUND_COLUMNS,
    ROUNDS_FILE,
    LedgerRow,
    RoundRow,
)


def read_ledger_csv(path: str | os.PathLike) -> pd.DataFrame:
    """ledger.csv as a DataFrame with stable dtypes (client ids stay strings)."""
    frame = pd.read_csv(
        path,
        dtype={"client_id": str, "method": str, "status": str, "noisy": str, "reason": str},
        keep_default_na=False,
        na_values={"value": [""], "stderr": [""], "num_examples": [""]},
    )
    frame["noisy"] = frame["noisy"].map({"true": True, "false": False, "": pd.NA}).astype("boolean")
    return frame


def read_rounds_csv(path: str | os.PathLike) -> pd.DataFrame:
    """rounds.csv as a DataFrame (client lists and hashes stay strings, missing values NaN)."""
    return pd.read_csv(path, dtype={"clients": str, "ads_method": str, "hash": str}, keep_default_na=False,
                       na_values={"efficiency_gap": [""], "utility_after": [""], "utility_realized": [""]})


def ledger_rows_of(ledger: pd.DataFrame) -> list[LedgerRow]:
    """A ledger's rows (as :func:`read_ledger_csv` reads them) as :class:`~fedvalue.schema.LedgerRow`:
    empty cells are None, example counts ints. Client ids stay the text the file holds (compare
    them with :func:`fedvalue.schema.client_key`). ValueError naming the row whose cells are not
    a ledger row's (an unknown status, an example count that is not a whole number)."""
    rows = []
    for record in ledger[list(LEDGER_COLUMNS)].to_dict("records"):
        try:
            record["num_examples"] = _whole_or_none("num_examples", record["num_examples"])
            record["round"] = _whole_or_none("round", record["round"])
            rows.append(LedgerRow(**record))
        except ValueError as error:
            raise ValueError(f"{LEDGER_FILE}: the row of round {rundir.printable(record['round'], 20)}, client "
                             f"{rundir.printable(record['client_id'], 40)}, method "
                             f"{rundir.printable(record['method'], 40)}: {error}") from None
    return rows


def round_rows_of(rounds: pd.DataFrame) -> list[RoundRow]:
    """rounds.csv's rows (as :func:`read_rounds_csv` reads them) as :class:`~fedvalue.schema.RoundRow`,
    without their hashes: empty cells are None, counts ints. ValueError naming the round whose
    cells are not a round row's (a count that is not a whole number, text where a number goes)."""
    rows = []
    for record in rounds.to_dict("records"):
        try:
            rows.append(RoundRow.from_mapping({column: _number_of(column, cell) for column, cell in record.items()}))
        except ValueError as error:
            raise ValueError(f"{ROUNDS_FILE}: the row of round {rundir.printable(record.get('round'), 20)}: "
                             f"{error}") from None
    return rows


#: rounds.csv's columns that hold text; every other column but ``hash`` holds numbers.
_ROUND_TEXT_COLUMNS = ("clients", "ads_method", "hash")


def _number_of(column: str, cell: object) -> object:
    """A rounds.csv cell as its column's value: a number column's text (pandas leaves a column
    with empty cells as text) read as an int or float, an empty cell as None."""
    if column in _ROUND_TEXT_COLUMNS or not isinstance(cell, str):
        return cell
    if cell == "":
        return None
    try:
        return int(cell)
    except ValueError:
        pass
    try:
        return float(cell)
    except ValueError:
        raise ValueError(f"{column}: expected a number; got {rundir.printable(cell, 40)!r}.") from None


def _whole_or_none(column: str, value: object) -> int | None:
    """A ledger cell that holds a count: None when empty, an int when whole; ValueError otherwise."""
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
        return None
    number = float(value)
    if not number.is_integer():
        raise ValueError(f"{column}: expected a whole number; got {value!r}.")
    return int(value)


def check_tables(ledger: pd.DataFrame, rounds: pd.DataFrame) -> None:
    """ValueError unless the tables are a ledger's: its columns, numbers that are numbers
    (finite counts, no infinite value), and one row per (round, method, client)."""
    for frame, columns, name in ((ledger, LEDGER_COLUMNS, LEDGER_FILE), (rounds, ROUND_COLUMNS, ROUNDS_FILE)):
        if list(frame.columns) != list(columns):
            raise ValueError(f"{name} has columns {[rundir.printable(c, 40) for c in frame.columns][:12]}, expected "
                             f"{list(columns)}")
    for frame, columns, name in ((ledger, ("round", "value", "stderr", "num_examples"), LEDGER_FILE),
                                 (rounds, ("round", "num_clients", "num_failed", "utility_before",
                                           "utility_realized", "num_evaluations"), ROUNDS_FILE)):
        for column in columns:  # an empty table (a run that valued nothing) has no numbers to type
            if len(frame) and not pd.api.types.is_numeric_dtype(frame[column]):
                raise ValueError(f"{name}'s {column} holds something that is not a number")
            values = frame[column].to_numpy(dtype=float)
            if np.isinf(values).any():
                raise ValueError(f"{name}'s {column} holds an infinite number")
    for frame, columns, name in ((ledger, ("round",), LEDGER_FILE),
                                 (rounds, ("round", "num_clients", "num_failed", "num_evaluations"), ROUNDS_FILE)):
        for column in columns:
            values = frame[column].to_numpy(dtype=float)
            if np.isnan(values).any() or (values != np.round(values)).any() or (np.abs(values) > 2**53).any():
                raise ValueError(f"{name}'s {column} holds something that is not a whole count")
    duplicated = ledger.duplicated(["round", "method", "client_id"])
    if duplicated.any():
        first = ledger[duplicated].iloc[0]
        raise ValueError(f"{LEDGER_FILE} books client {rundir.printable(first['client_id'], 40)} twice under "
                         f"{rundir.printable(first['method'], 40)} in round {first['round']}")


@dataclass(frozen=True)
class LedgerTables:
    """A run directory's tables as :func:`read_tables` reads them: ledger.csv and rounds.csv as
    DataFrames (first_order.csv too when the run has it) and run.json as a dict."""

    ledger: pd.DataFrame
    rounds: pd.DataFrame
    config: dict
    first_order: pd.DataFrame | None = None

    def rows(self) -> list[LedgerRow]:
        """The ledger as :class:`~fedvalue.schema.LedgerRow` (:func:`ledger_rows_of`)."""
        return ledger_rows_of(self.ledger)

    def round_rows(self) -> list[RoundRow]:
        """rounds.csv as :class:`~fedvalue.schema.RoundRow`, hashes left out (:func:`round_rows_of`)."""
        return round_rows_of(self.rounds)


def read_tables(run_dir: str | os.PathLike | RunDir) -> LedgerTables:
    """Read a run directory written by :class:`fedvalue.run.ledger_tables.LedgerWriter` (through
    :mod:`fedvalue.run.rundir`); :func:`fedvalue.analysis.run_summary.load_run` adds the summaries.

    Raises
    ------
    FileNotFoundError
        ``run_dir`` holds no ledger.csv.
    ValueError
        Its tables are not a ledger's (:func:`check_tables`), or a file is a link, special
        or too large (:class:`fedvalue.run.rundir.UnsafeRunFile`).
    """
    run = open_run_dir(run_dir)
    if not run.exists(LEDGER_FILE):
        raise FileNotFoundError(
            f"run_dir: expected a fedvalue run directory holding ledger.csv; {run.show()} has none."
        )

    def table(name: str) -> io.StringIO:  # read safely (no links, no FIFOs), then parsed
        return io.StringIO(run.read_text(name), newline="")

    try:
        rounds = read_rounds_csv(table(ROUNDS_FILE))
        ledger = read_ledger_csv(table(LEDGER_FILE))
        first_order = (pd.read_csv(table(FIRST_ORDER_FILE), dtype={"client_id": str})
                       if run.exists(FIRST_ORDER_FILE) else None)
        check_tables(ledger, rounds)
    except rundir.UnsafeRunFile:
        raise
    except (ValueError, KeyError, TypeError, OverflowError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise ValueError(f"run_dir: {run.show()} holds tables that are not a fedvalue ledger "
                         f"({rundir.printable(error, 200)}).") from None
    return LedgerTables(ledger=ledger, rounds=rounds, config=read_run_config(run), first_order=first_order)
