"""The valuation ledger's tables as written: per-round, per-client books appended as each round
completes (:class:`LedgerWriter`, each cell in one spelling: :func:`csv_lines`), and the hash chain
that links the rounds (:func:`chain_hash`, recomputed from the files by :func:`chain_heads`).
:mod:`fedvalue.run.ledger_reader` reads the tables back, typed; :mod:`fedvalue.analysis.run_summary`
sums them up.

A run directory holds

``ledger.csv`` / ``ledger.parquet``
    Long format, one row per (round, client, method): ``round``, ``client_id``,
    ``method``, ``value``, ``stderr``, ``num_examples``, ``status`` (ok, failed, rejected,
    idle: :mod:`fedvalue.schema`), ``noisy`` (whether the client is one of the run's
    noisy clients, which the writer joins from the run's ground truth; empty when the
    run names none), ``reason`` (why a failed or rejected client was not valued; empty
    otherwise).
``rounds.csv``
    One row per round: ``round``, ``clients`` (space-separated ids in reply order),
    ``num_clients``, ``num_failed``, ``utility_before`` (v_t(∅) = U(A_{t−1})),
    ``utility_after`` (v_t(I_t)), ``utility_realized`` (U(A_t), the state the run
    moved to), ``num_evaluations``, ``valuation_seconds``, ``ads_method``,
    ``efficiency_gap`` (Σφ_t − (v_t(I_t) − v_t(∅)), [ADS] Prop. 4.2),
    ``num_unaggregatable`` (coalitions the inner strategy returned no arrays for, valued
    at v_t(∅) as Flower keeps the state), ``hash``:
    SHA-256 over the previous round's hash, the round's ledger.csv lines as written and
    its rounds.csv line without the hash; round 1 chains from the SHA-256 of run.json.
    Changing any recorded value breaks the chain from that round on
    (``fedvalue audit DIR`` checks it).
``first_order.csv`` (runs with TracIn flows)
    Per round and client: its summed inference loss at A_{t−1} and at A_t, the actual
    change and the change its flows predict, −(inflow + self) ([RECIP], Remark 2.5).
``run.json``
    The full configuration, seed and package versions.

Rows are appended and fsynced after every round, so a crash loses no completed round.
Values are written with Python's shortest round-trip float repr: the same run gives
the same bytes. A ``reason`` (text a failing client's error carried) is written with its
control characters escaped and, when it starts like a spreadsheet formula (``=``, ``+``,
``-``, ``@``), behind a ``'``: a spreadsheet never runs it and a terminal never obeys it.
Every file goes through :mod:`fedvalue.run.rundir`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
from collections.abc import Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from fedvalue.run import kill_points, rundir
from fedvalue.run.archive import APPEND_ONLY_FILES
from fedvalue.run.ledger_reader import read_ledger_csv, read_rounds_csv, round_rows_of
from fedvalue.run.rundir import RunDir, open_run_dir
from fedvalue.run.run_info import config_json, read_run_config
from fedvalue.run.seals import Signer, write_manifest
from fedvalue.run.writer_lock import lock_run_dir
from fedvalue.schema import (
    FIRST_ORDER_FILE,
    LEDGER_COLUMNS,
    LEDGER_FILE,
    LEDGER_PARQUET_FILE,
    ROUND_COLUMNS,
    ROUNDS_FILE,
    RUN_CONFIG_FILE,
    LedgerRow,
    RoundRow,
    with_ground_truth,
)

#: A run's chain starts from the hash of its run.json (or this, when it has none).
GENESIS_HASH = "0" * 64
#: run.json entries that say where a run started, not how it is set: a resume (on this machine
#: or another) keeps them as written and does not compare them.
STARTED_ON_KEYS = ("platform",)


def _cell(value: object) -> str:
    """One CSV cell: shortest round-trip repr for floats, empty for missing."""
    if value is None:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return "" if math.isnan(value) else repr(value)
    return str(value)


def csv_lines(columns: Iterable[str], rows: Iterable[Mapping[str, object] | LedgerRow | RoundRow]) -> list[str]:
    """Rows (mappings, or typed rows: :class:`~fedvalue.schema.LedgerRow`, :class:`~fedvalue.schema.RoundRow`)
    as the CSV lines the ledger writes (each ending in a newline; a None or NaN cell is empty)."""
    columns = list(columns)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    lines = []
    for row in rows:
        cells = row if isinstance(row, Mapping) else row.as_dict()
        writer.writerow([_cell(cells.get(c)) for c in columns])
        lines.append(buffer.getvalue())
        buffer.seek(0)
        buffer.truncate()
    return lines


def spreadsheet_safe(text: object) -> str:
    """``text`` for a CSV cell a person may open: control characters escaped, and a
    leading ``=``, ``+``, ``-`` or ``@`` (a spreadsheet formula) behind a ``'``."""
    shown = rundir.printable("" if text is None else text, 2000)
    return "'" + shown if shown[:1] in ("=", "+", "-", "@") else shown


def _append_lines(run: RunDir, name: str, columns: Iterable[str], lines: list[str],
                  torn_step: tuple[str, int] | None = None) -> None:
    """Append ``lines`` (a header first when the table is new) and fsync, through the run
    directory's descriptor (never through a link of a received directory). ``torn_step``:
    the kill point (:mod:`fedvalue.run.kill_points`) of a write torn in its middle."""
    header = "" if run.exists(name) else ",".join(columns) + "\n"
    data = (header + "".join(lines)).encode("utf-8")
    if torn_step is not None:
        if kill_points.armed(*torn_step):
            run.append(name, data[: len(data) // 2])
            data = data[len(data) // 2:]
        kill_points.reached(*torn_step)
    run.append(name, data)


def chain_hash(previous: str, ledger_lines: Iterable[str], round_line_without_hash: str) -> str:
    """SHA-256 link of one round: previous hash, its ledger lines, its round line (sans hash)."""
    digest = hashlib.sha256(previous.encode("ascii"))
    for line in ledger_lines:
        digest.update(line.encode("utf-8"))
    digest.update(round_line_without_hash.encode("utf-8"))
    return digest.hexdigest()


def chain_links(genesis: str, ledger_by_round: Mapping[str, list[str]],
                round_lines: list[str]) -> Iterator[tuple[str, str, str]]:
    """(round, recomputed hash, recorded hash) of every rounds.csv data line in order, each
    link from the recorded hash before it (``ledger_by_round``: the round's ledger lines)."""
    previous = genesis
    for line in round_lines:
        body, _, recorded = line.rstrip("\n").rpartition(",")
        key = body.split(",", 1)[0]
        yield key, chain_hash(previous, ledger_by_round.get(key, []), body + "\n"), recorded
        previous = recorded


def chain_from_lines(genesis: str, ledger_lines: list[str], round_lines: list[str]) -> list[str]:
    """Every round's chain hash recomputed from the tables' data lines (headers removed);
    ValueError naming the first round whose recorded hash does not match."""
    by_round: dict[str, list[str]] = {}
    for line in ledger_lines:
        by_round.setdefault(line.split(",", 1)[0], []).append(line)
    heads = []
    for key, expected, recorded in chain_links(genesis, by_round, round_lines):
        if expected != recorded:
            raise ValueError(f"{ROUNDS_FILE}: round {rundir.printable(key, 20)} does not match its recorded hash; "
                             "the run directory was changed by hand.")
        heads.append(recorded)
    return heads


def table_lines(text: str) -> list[str]:
    """A table's data lines (its header removed), each with its newline."""
    return text.splitlines(keepends=True)[1:]


def chain_heads(run_dir: str | os.PathLike | RunDir) -> list[str]:
    """Every round's chain hash recomputed from the run's files; ValueError naming the
    first round whose recorded hash does not match (a file was changed by hand)."""
    run = open_run_dir(run_dir)
    if not run.exists(ROUNDS_FILE):
        return []
    ledger = table_lines(run.read_text(LEDGER_FILE)) if run.exists(LEDGER_FILE) else []
    return chain_from_lines(genesis_hash(run), ledger, table_lines(run.read_text(ROUNDS_FILE)))


def genesis_hash(run_dir: str | os.PathLike | RunDir) -> str:
    """The chain's start: SHA-256 of run.json (:data:`GENESIS_HASH` without one)."""
    run = open_run_dir(run_dir)
    return genesis_of(run.read_bytes(RUN_CONFIG_FILE, max_bytes=rundir.MAX_JSON_BYTES)
                      if run.exists(RUN_CONFIG_FILE) else None)


def genesis_of(run_config: bytes | None) -> str:
    """SHA-256 of run.json's bytes, or :data:`GENESIS_HASH` for a run without one."""
    return GENESIS_HASH if run_config is None else hashlib.sha256(run_config).hexdigest()


def _last_hash(run: RunDir) -> str | None:
    if not run.exists(ROUNDS_FILE):
        return None
    rows = list(csv.DictReader(io.StringIO(run.read_text(ROUNDS_FILE), newline="")))
    return rows[-1]["hash"] if rows else None


def _typed_rows(round_row: RoundRow, ledger_rows: Sequence[LedgerRow]) -> list[LedgerRow]:
    """``ledger_rows`` as a list, once the round's rows are known to be typed rows (TypeError
    naming the parameter otherwise)."""
    if not isinstance(round_row, RoundRow):
        raise TypeError(f"round_row: expected a fedvalue.schema.RoundRow (RoundRow.from_mapping reads a mapping of "
                        f"rounds.csv's columns); got {type(round_row).__name__}.")
    rows = list(ledger_rows)
    for position, row in enumerate(rows):
        if not isinstance(row, LedgerRow):
            raise TypeError(f"ledger_rows: expected fedvalue.schema.LedgerRow rows (LedgerRow.from_mapping reads a "
                            f"mapping of the ledger's columns); got {type(row).__name__} at position {position}.")
    return rows


class LedgerWriter:
    """Appends each completed round to a run directory (see module docstring).

    Parameters
    ----------
    run_dir
        The run directory (created if missing).
    config
        The run's configuration, written to ``run.json`` (the hash chain starts from it).
    resume
        Continue a run already in ``run_dir``: ``run.json`` is kept and must equal
        ``config`` when one is given (a changed configuration would break the chain and
        the promise of the same ledger as an uninterrupted run), but for the entries of
        :data:`STARTED_ON_KEYS`.
    noisy_clients
        The run's ground truth, the clients known to be noisy (a simulation made them so):
        each written row's ``noisy`` cell says whether its client is one of them
        (:func:`fedvalue.schema.with_ground_truth`). None: the rows' cells are written as given.
    """

    def __init__(self, run_dir: str | os.PathLike | RunDir, *, config: Mapping | None = None,
                 resume: bool = False, noisy_clients: Collection[Hashable] | None = None) -> None:
        self.noisy_clients = None if noisy_clients is None else frozenset(noisy_clients)
        if resume:
            try:
                self.run = open_run_dir(run_dir)
            except FileNotFoundError:
                raise ValueError(f"resume: expected a run directory holding run.json; {rundir.resolve(run_dir)} "
                                 "does not exist.") from None
            self.run_dir = self.run.path
            self.lock = lock_run_dir(self.run)
            try:
                self._check_same_config(config)
            except BaseException:
                self.lock.release()  # a refused writer does not keep the directory locked
                raise
            return
        self.run = open_run_dir(run_dir, create=True)
        self.run_dir = self.run.path
        self.lock = lock_run_dir(self.run)  # before anything is written: one writer at a time
        if config is not None:
            self.run.write_text(RUN_CONFIG_FILE, config_json(config))

    def _check_same_config(self, config: Mapping | None) -> None:
        if not self.run.exists(RUN_CONFIG_FILE):
            raise ValueError(f"resume: expected a run directory holding run.json; {self.run_dir} has none.")
        if config is None:
            return
        saved = read_run_config(self.run)
        given = json.loads(json.dumps(config, sort_keys=True, default=str))
        changed = sorted(k for k in (set(saved) | set(given)) - set(STARTED_ON_KEYS) if saved.get(k) != given.get(k))
        if changed:
            key = changed[0]
            raise ValueError(
                f"resume: the run in {self.run_dir} was started with {key}={saved.get(key)!r}; got "
                f"{key}={given.get(key)!r} (differing keys: {changed}). Resume with the same configuration, "
                "or start a new run in another directory."
            )

    @property
    def ledger_path(self) -> Path:
        return self.run_dir / LEDGER_FILE

    def write_round(self, round_row: RoundRow, ledger_rows: Sequence[LedgerRow]) -> str:
        """Append one round: its ledger rows first, then its rounds.csv row (the commit mark);
        returns the round's chain hash (the run's head).

        ``round_row`` is a :class:`~fedvalue.schema.RoundRow` and ``ledger_rows`` are
        :class:`~fedvalue.schema.LedgerRow` (their ``from_mapping`` reads a mapping of the
        columns); the rows' ``noisy`` cells are joined from the writer's ``noisy_clients``. A
        None cell is written empty; a reason with its control characters escaped and a formula
        defused (:func:`spreadsheet_safe`). TypeError, before anything is written, for rows of
        another type.
        """
        rows = with_ground_truth(_typed_rows(round_row, ledger_rows), self.noisy_clients)
        ledger_lines = csv_lines(LEDGER_COLUMNS, [
            replace(row, reason=spreadsheet_safe(row.reason)) if row.reason is not None else row for row in rows])
        previous = _last_hash(self.run) or genesis_hash(self.run)
        head = chain_hash(previous, ledger_lines, csv_lines(ROUND_COLUMNS[:-1], [round_row])[0])
        server_round = round_row.round
        _append_lines(self.run, LEDGER_FILE, LEDGER_COLUMNS, ledger_lines, ("ledger_torn", server_round))
        kill_points.reached("ledger", server_round)
        _append_lines(self.run, ROUNDS_FILE, ROUND_COLUMNS, csv_lines(ROUND_COLUMNS, [{**round_row.as_dict(),
                                                                                       "hash": head}]),
                      ("rounds_torn", server_round))
        kill_points.reached("rounds", server_round)  # the commit mark
        return head

    def write_parquet(self) -> None:
        """Mirror ledger.csv as ledger.parquet, replaced whole so it is always a complete file:
        at the close and at a resume, not each round (rewriting the whole copy every round
        would cost O(rounds²) over a run)."""
        if not self.run.exists(LEDGER_FILE):
            self.run.unlink(LEDGER_PARQUET_FILE)
            return
        self.run.write_bytes(LEDGER_PARQUET_FILE, parquet_bytes(self.run.read_text(LEDGER_FILE)))

    def table_sizes(self) -> dict[str, int]:
        """Size in bytes of each append-only table now (what a checkpoint cuts back to)."""
        return {name: self.run.size(name) for name in APPEND_ONLY_FILES if self.run.exists(name)}

    def committed_rounds(self) -> list[RoundRow]:
        """The rows of rounds.csv written so far, typed as the writer's caller booked them (their
        hashes left out)."""
        if not self.run.exists(ROUNDS_FILE):
            return []
        return round_rows_of(read_rounds_csv(io.StringIO(self.run.read_text(ROUNDS_FILE), newline="")))

    def close(self, planned_rounds: int, *, sealed: bool = False, signer: Signer | None = None) -> dict:
        """Write the Parquet copy, then the run's final manifest (:mod:`fedvalue.run.seals`):
        its rounds, its chain head and the digest of every file. Called once the run has done
        all ``planned_rounds``."""
        heads = chain_heads(self.run)
        self.write_parquet()
        kill_points.reached(kill_points.CLOSE_STEP, len(heads))
        manifest = write_manifest(self.run, rounds=len(heads), planned_rounds=planned_rounds,
                                  head=heads[-1] if heads else None, sealed=sealed, signer=signer)
        self.lock.release()  # the writer's work on the directory is done
        return manifest

    def append_table(self, name: str, columns: Iterable[str], rows: list[Mapping[str, object]]) -> None:
        """Append rows to a side table of the run (written before the round's commit mark)."""
        if rows:
            columns = list(columns)
            _append_lines(self.run, name, columns, csv_lines(columns, rows))
            if name == FIRST_ORDER_FILE:
                kill_points.reached(kill_points.FIRST_ORDER_STEP, max(int(row["round"]) for row in rows))


def parquet_bytes(ledger_text: str) -> bytes:
    """ledger.csv's text as the bytes of ledger.parquet (the writer's one conversion)."""
    buffer = io.BytesIO()
    read_ledger_csv(io.StringIO(ledger_text, newline="")).to_parquet(buffer, index=False)
    return buffer.getvalue()
