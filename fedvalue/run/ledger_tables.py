"""The valuation ledger: per-round, per-client books written as each round completes.

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
from collections.abc import Collection, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from fedvalue.run import kill_points, rundir
from fedvalue.run.archive import APPEND_ONLY_FILES
from fedvalue.run.rundir import RunDir, open_run_dir
from fedvalue.run.run_info import config_json, read_run_config
from fedvalue.run.seals import Signer, write_manifest
from fedvalue.run.writer_lock import lock_run_dir
from fedvalue.flows.reciprocity_measures import DEFAULT_P, reciprocity, reciprocity_ratio
from fedvalue.schema import (
    CLAIM_PREFIX,
    FIRST_ORDER_FILE,
    FLOW_METHODS,
    LEDGER_COLUMNS,
    LEDGER_FILE,
    LEDGER_PARQUET_FILE,
    ROUND_COLUMNS,
    ROUNDS_FILE,
    RUN_CONFIG_FILE,
    LedgerRow,
    Status,
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


def csv_lines(columns: Iterable[str], rows: Iterable[Mapping[str, object] | LedgerRow]) -> list[str]:
    """Rows (mappings, or :class:`~fedvalue.schema.LedgerRow`) as the CSV lines the ledger
    writes (each ending in a newline; a None or NaN cell is empty)."""
    columns = list(columns)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    lines = []
    for row in rows:
        if isinstance(row, LedgerRow):
            row = row.as_dict()
        writer.writerow([_cell(row.get(c)) for c in columns])
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

    def write_round(self, round_row: Mapping[str, object],
                    ledger_rows: Iterable[LedgerRow | Mapping[str, object]]) -> str:
        """Append one round: its ledger rows first, then its rounds.csv row (the commit mark);
        returns the round's chain hash (the run's head).

        ``ledger_rows`` are :class:`~fedvalue.schema.LedgerRow` (a mapping of the ledger's
        columns is taken as one: ValueError naming a bad status or column), their ``noisy``
        cells joined from the writer's ``noisy_clients``. A None cell is written empty; a
        reason with its control characters escaped and a formula defused
        (:func:`spreadsheet_safe`).
        """
        rows = with_ground_truth([LedgerRow.from_mapping(row) for row in ledger_rows], self.noisy_clients)
        ledger_lines = csv_lines(LEDGER_COLUMNS, [
            replace(row, reason=spreadsheet_safe(row.reason)) if row.reason is not None else row for row in rows])
        previous = _last_hash(self.run) or genesis_hash(self.run)
        round_line = csv_lines(ROUND_COLUMNS[:-1], [round_row])[0]
        round_row = {**round_row, "hash": chain_hash(previous, ledger_lines, round_line)}
        server_round = int(round_row["round"])
        _append_lines(self.run, LEDGER_FILE, LEDGER_COLUMNS, ledger_lines, ("ledger_torn", server_round))
        kill_points.reached("ledger", server_round)
        _append_lines(self.run, ROUNDS_FILE, ROUND_COLUMNS, csv_lines(ROUND_COLUMNS, [round_row]),
                      ("rounds_torn", server_round))
        kill_points.reached("rounds", server_round)  # the commit mark
        return round_row["hash"]

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

    def committed_rounds(self) -> list[dict]:
        """The rows of rounds.csv written so far (as the writer's caller booked them)."""
        if not self.run.exists(ROUNDS_FILE):
            return []
        return read_rounds_csv(io.StringIO(self.run.read_text(ROUNDS_FILE), newline="")).to_dict("records")

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


def ledger_rows_of(ledger: pd.DataFrame) -> list[LedgerRow]:
    """A ledger's rows (as :func:`read_ledger_csv` reads them) as
    :class:`~fedvalue.schema.LedgerRow`: empty cells are None, example counts ints. Client
    ids stay the text the file holds (compare them with :func:`fedvalue.schema.client_key`)."""
    rows = []
    for record in ledger[list(LEDGER_COLUMNS)].to_dict("records"):
        count = record["num_examples"]
        record["num_examples"] = None if pd.isna(count) else int(count)
        record["round"] = int(record["round"])
        rows.append(LedgerRow(**record))
    return rows



def read_rounds_csv(path: str | os.PathLike) -> pd.DataFrame:
    """rounds.csv as a DataFrame (client lists and hashes stay strings, missing values NaN)."""
    return pd.read_csv(path, dtype={"clients": str, "ads_method": str, "hash": str}, keep_default_na=False,
                       na_values={"efficiency_gap": [""], "utility_after": [""], "utility_realized": [""]})


@dataclass(frozen=True)
class Run:
    """A run directory loaded as DataFrames."""

    ledger: pd.DataFrame
    rounds: pd.DataFrame
    config: dict
    first_order: pd.DataFrame | None = None

    def summary(self) -> pd.DataFrame:
        """Per client: total value per method, rounds participated, noisy flag (and flows)."""
        return client_summary(self.ledger)

    def run_summary(self, p: float = DEFAULT_P) -> dict:
        """Run-level figures: see :func:`run_summary`."""
        return run_summary(self, p=p)

    def flows(self) -> pd.DataFrame:
        """Per round and client: ``inflow``, ``outflow``, ``self`` (booked rows only)."""
        return flow_rounds(self.ledger)

    def rows(self) -> list[LedgerRow]:
        """The ledger as :class:`~fedvalue.schema.LedgerRow` (:func:`ledger_rows_of`)."""
        return ledger_rows_of(self.ledger)


def flow_rounds(ledger: pd.DataFrame) -> pd.DataFrame:
    """The TracIn rows of a ledger as one row per (round, client): inflow, outflow, self."""
    rows = ledger[ledger["method"].isin(list(FLOW_METHODS)) & ledger["status"].isin([Status.OK, Status.IDLE])]
    if rows.empty:
        return pd.DataFrame(columns=["round", "client", "inflow", "outflow", "self"])
    wide = rows.pivot_table(index=["round", "client_id"], columns="method", values="value", aggfunc="sum")
    wide = wide.reindex(columns=list(FLOW_METHODS)).rename(columns=FLOW_METHODS).reset_index()
    return wide.rename(columns={"client_id": "client"}).rename_axis(columns=None)


def first_order_error(first_order: pd.DataFrame | None) -> dict:
    """The first-order check of TracIn flows ([RECIP], Remark 2.5 / Fig. 5).

    Per round t and client v, actual = L_v(A_t) − L_v(A_{t−1}) and predicted =
    −(inflow_v + self_v). Returns ``relative_error`` = Σ|actual − predicted| / Σ|actual|
    over all rows, ``median_round_relative_error`` (the same ratio per round, median over
    rounds) and ``rounds_checked``; NaN/0 when there is nothing to check.
    """
    if first_order is None or first_order.empty:
        return {"first_order_relative_error": float("nan"), "first_order_median_round_error": float("nan"),
                "first_order_rounds_checked": 0}
    gap = (first_order["actual_change"] - first_order["predicted_change"]).abs()
    actual = first_order["actual_change"].abs()
    per_round = gap.groupby(first_order["round"]).sum() / actual.groupby(first_order["round"]).sum()
    total = float(actual.sum())
    return {
        "first_order_relative_error": float(gap.sum()) / total if total > 0 else float("nan"),
        "first_order_median_round_error": float(per_round.median()),
        "first_order_rounds_checked": int(per_round.size),
    }


def run_summary(run: Run, *, p: float = DEFAULT_P) -> dict:
    """Run-level figures of a run directory.

    Always: ``rounds``, ``utility_start`` (U(A_0)), ``utility_end`` (U of the last realized
    state), ``max_efficiency_gap`` (largest |Σφ_t − (v_t(I_t) − v_t(∅))|),
    ``num_evaluations`` and ``valuation_seconds`` (sums over rounds), ``failed_replies``.
    With TracIn flows: reciprocity of the clients' total inflows and outflows ([RECIP]
    Def. 2.1: ``alpha`` at ``p``, ``pearson``, ``spearman``, ``negative_inflow_share``,
    ``negative_outflow_share``, ...; prefixed ``reciprocity_``), ``flow_balance_gap``
    (Σ inflow − Σ outflow, zero up to rounding) and :func:`first_order_error`.
    """
    rounds = run.rounds
    summary: dict = {"rounds": int(len(rounds))}
    if len(rounds):
        summary.update({
            "utility_start": float(rounds["utility_before"].iloc[0]),
            "utility_end": float(rounds["utility_realized"].iloc[-1]),
            "max_efficiency_gap": float(rounds["efficiency_gap"].abs().max()) if rounds["efficiency_gap"].notna().any()
            else float("nan"),
            "num_evaluations": int(rounds["num_evaluations"].sum()),
            "valuation_seconds": float(rounds["valuation_seconds"].sum()),
            "failed_replies": int(rounds["num_failed"].sum()),
        })
    flows = flow_rounds(run.ledger)
    if not flows.empty:
        totals = flows.groupby("client")[["inflow", "outflow"]].sum()
        report = reciprocity(totals["inflow"], totals["outflow"], p=p)
        summary.update({f"reciprocity_{k}": v for k, v in report.to_dict().items()})
        summary["flow_balance_gap"] = float(totals["inflow"].sum() - totals["outflow"].sum())
        summary.update(first_order_error(run.first_order))
    return summary


def client_summary(ledger: pd.DataFrame) -> pd.DataFrame:
    """Per client: ``total_<method>`` for every valuation method, ``rounds``, ``noisy``; with
    TracIn flows ``inflow``, ``outflow``, ``self``, ``balance``, ``ratio``; with a claim review
    ``claim_flags`` (rows flagging a claimed weight: their values are claimed counts, not
    values, so they are counted, not summed).

    Sorted by total ADS (or the first method) descending.
    """
    is_claim = ledger["method"].str.startswith(CLAIM_PREFIX)
    booked = ledger[ledger["status"].isin([Status.OK, Status.IDLE]) & ~is_claim]
    totals = booked.pivot_table(index="client_id", columns="method", values="value", aggfunc="sum")
    totals.columns = [f"total_{m}" for m in totals.columns]
    sampled = ledger[(ledger["status"] != Status.IDLE) & ~is_claim]
    rounds = sampled.groupby("client_id")["round"].nunique().rename("rounds")
    summary = totals.join(rounds, how="outer")
    summary["rounds"] = summary["rounds"].fillna(0).astype(int)
    if is_claim.any():
        flags = ledger[is_claim].groupby("client_id").size().rename("claim_flags")
        summary = summary.join(flags, how="left")
        summary["claim_flags"] = summary["claim_flags"].fillna(0).astype(int)
    if "total_tracin_inflow" in summary:
        for method, name in FLOW_METHODS.items():
            summary[name] = summary.pop(f"total_{method}").fillna(0.0)
        summary["balance"] = summary["inflow"] - summary["outflow"]
        summary["ratio"] = reciprocity_ratio(summary["inflow"].to_numpy(), summary["outflow"].to_numpy())
    if "noisy" in ledger:
        summary = summary.join(ledger.groupby("client_id")["noisy"].first())
    key = "total_ads" if "total_ads" in summary else summary.columns[0]
    return summary.sort_values(key, ascending=False, kind="mergesort")


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


def load_run(run_dir: str | os.PathLike | RunDir) -> Run:
    """Read a run directory written by :class:`LedgerWriter` (through :mod:`fedvalue.run.rundir`).

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
    return Run(ledger=ledger, rounds=rounds, config=read_run_config(run), first_order=first_order)
