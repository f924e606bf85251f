"""Checks 1 to 4 of the audit (:mod:`fedvalue.audit.checks`), on the ledger's tables: read as their
lines (a killed run's torn tail set apart), their columns, the hash chain recomputed from those
lines, the schema and values, group efficiency per round ([ADS] Prop. 4.2), and the Parquet copy
against the CSV. Each check adds its findings to the report and returns what the next one needs.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd

from fedvalue._checks import counted
from fedvalue.audit.audit_files import RunFiles
from fedvalue.audit.report import AuditReport
from fedvalue.audit.torn_tail import Table, split_torn_tail, table_of
from fedvalue.run.ledger_reader import LedgerTables, read_ledger_csv, read_rounds_csv
from fedvalue.run.ledger_tables import chain_links, genesis_of
from fedvalue.run.rundir import MAX_JSON_BYTES, printable
from fedvalue.valuation.settings import EXPANSION_METHODS
from fedvalue.schema import (
    CLAIM_PREFIX,
    CLIENT_STATUSES,
    LEDGER_COLUMNS,
    LEDGER_FILE,
    LEDGER_PARQUET_FILE,
    ROUND_COLUMNS,
    ROUNDS_FILE,
    RUN_CONFIG_FILE,
    Method,
    Status,
    record_name,
)


def read_table_lines(files: RunFiles, report: AuditReport, *, complete: bool) -> tuple[Table, Table] | None:
    """ledger.csv and rounds.csv as their header and data lines; in a run without its manifest,
    without the torn tail of a round it never committed (:mod:`fedvalue.audit.torn_tail`:
    reported as incomplete, not as a finding). None when a table cannot be read."""
    tables = []
    for name, columns in ((LEDGER_FILE, LEDGER_COLUMNS), (ROUNDS_FILE, ROUND_COLUMNS)):
        if not files.exists(name) and complete:
            report.problems.append(f"{name}: missing from the run directory")
            return None
        try:
            text = files.text(name) if files.exists(name) else None
        except (ValueError, OSError) as error:
            report.problems.append(f"{name}: {printable(error)}")
            return None
        tables.append(table_of(text, columns, complete=complete))
    ledger, rounds = tables
    if not complete:
        ledger, rounds, tail = split_torn_tail(ledger, rounds, record_exists=lambda t: files.exists(record_name(t)))
        if tail is not None:
            report.unverifiable.append(tail.finding())
    return ledger, rounds


def check_headers(report: AuditReport, ledger: Table, rounds: Table) -> bool:
    """Whether both tables have their columns, in order (else a finding for each that has not)."""
    headers_ok = True
    for name, table, columns in ((LEDGER_FILE, ledger, LEDGER_COLUMNS), (ROUNDS_FILE, rounds, ROUND_COLUMNS)):
        if table.header.split(",") != list(columns):
            headers_ok = False
            report.problems.append(f"{name}: columns {[printable(c, 40) for c in table.header.split(',')[:16]]}, "
                                   f"expected {list(columns)}")
    return headers_ok


def check_chain(files: RunFiles, report: AuditReport, ledger_lines: list[str], round_lines: list[str]) -> list[str]:
    """Check 1; returns the recorded hash of every round."""
    by_round: dict[str, list[str]] = {}
    order: list[str] = []
    for line in ledger_lines:
        key = line.split(",", 1)[0]
        if key not in by_round:
            by_round[key] = []
            order.append(key)
        elif order[-1] != key:
            report.problems.append(f"ledger.csv: rows of round {printable(key, 20)} are not contiguous")
        by_round[key].append(line)
    genesis = genesis_of(files.bytes(RUN_CONFIG_FILE, max_bytes=MAX_JSON_BYTES)
                         if files.exists(RUN_CONFIG_FILE) else None)
    broken, heads = None, []
    for round_key, expected, recorded in chain_links(genesis, by_round, round_lines):
        if expected != recorded and broken is None:
            broken = round_key
            report.problems.append(
                f"hash chain: round {printable(round_key, 20)} does not match its recorded hash (its ledger rows, its "
                "rounds.csv row, an earlier round or run.json was changed)"
            )
        heads.append(recorded)
    committed = {ln.split(",", 1)[0] for ln in round_lines}
    extra = [printable(k, 20) for k in order if k not in committed]
    if extra:
        report.problems.append(f"ledger.csv: rows for rounds {extra[:5]} that rounds.csv never committed")
    if broken is None:
        report.checks.append(f"hash chain intact over {counted(len(round_lines), 'round')}")
    return heads


def check_schema(report: AuditReport, config: dict, ledger_table: Table, rounds_table: Table) -> LedgerTables | None:
    """Check 2; the parsed tables with run.json's ``config`` (None when they do not parse or
    rounds are out of order)."""
    before = len(report.problems)
    try:
        ledger = read_ledger_csv(io.StringIO("".join([ledger_table.header + "\n", *ledger_table.lines]), newline=""))
        rounds = read_rounds_csv(io.StringIO("".join([rounds_table.header + "\n", *rounds_table.lines]), newline=""))
        round_numbers = [int(r) for r in rounds["round"]]
    except (ValueError, TypeError, OverflowError, pd.errors.ParserError) as error:
        report.problems.append(f"schema: the tables do not parse ({type(error).__name__}: {printable(error)})")
        return None
    bad_status = sorted(printable(s, 40) for s in set(ledger["status"]) - set(CLIENT_STATUSES))
    if bad_status:
        report.problems.append(f"ledger.csv: unknown statuses {bad_status[:5]}")
    booked = ledger[ledger["status"].isin([Status.OK, Status.IDLE])]
    values = pd.to_numeric(booked["value"], errors="coerce")
    if not values.map(lambda v: isinstance(v, float) and math.isfinite(v)).all():
        report.problems.append("ledger.csv: a booked row has a missing or non-finite value")
    duplicated = ledger.duplicated(["round", "method", "client_id"], keep=False)
    if duplicated.any():
        first = ledger[duplicated].iloc[0]
        report.problems.append(f"ledger.csv: {int(duplicated.sum())} rows book one (round, method, client) more than "
                               f"once (first: round {printable(first['round'], 20)}, "
                               f"{printable(first['method'], 40)}, client {printable(first['client_id'], 40)})")
    claims = ledger["method"].astype(str).str.startswith(CLAIM_PREFIX)
    if claims.any() and "claim_review" not in config:
        report.problems.append(f"ledger.csv: {int(claims.sum())} claim-review rows in a run whose run.json names no "
                               "claim review")
    if round_numbers != list(range(1, len(rounds) + 1)):
        report.problems.append(f"rounds.csv: rounds {round_numbers[:10]}, expected 1..{len(rounds)}")
        return None
    for column in ("utility_before", "utility_after", "utility_realized", "efficiency_gap", "valuation_seconds",
                   "num_evaluations", "num_clients", "num_failed"):
        numbers = pd.to_numeric(rounds[column], errors="coerce")
        if not numbers.dropna().map(math.isfinite).all() or numbers.abs().max() > 1e12:
            report.problems.append(f"rounds.csv: {column} holds a non-finite or implausibly large number")
    if len(report.problems) == before:
        report.checks.append(f"schema and values of {len(ledger)} ledger rows")
    return LedgerTables(ledger=ledger, rounds=rounds, config=config)


def check_efficiency(ledger: pd.DataFrame, rounds: pd.DataFrame, tolerance: float, report: AuditReport) -> None:
    """Check 3: Σ ADS = utility_after − utility_before per round ([ADS] Prop. 4.2), to ``tolerance`` × max(1,
    Σ|ADS|), in the rounds valued by an efficient estimator. A round valued by an expansion method
    (:data:`fedvalue.valuation.settings.EXPANSION_METHODS`, rounds.csv's ``ads_method`` ``ads-first-order`` or
    ``ads-second-order``) is efficient for its expanded game, not for the round game: it is not held to it
    (its booked ``efficiency_gap``, the expansion's remainder, is recomputed with its values, check 7)."""
    ads = ledger[(ledger["method"] == Method.ADS) & (ledger["status"] == Status.OK)]
    if ads.empty:
        return
    expanded = set(rounds.loc[rounds["ads_method"].isin([f"ads-{m}" for m in EXPANSION_METHODS]), "round"])
    if expanded:
        ads = ads[~ads["round"].isin(expanded)]
        report.checks.append(f"group efficiency not held in {counted(len(expanded), 'round')} valued by a first- or "
                             "second-order expansion (efficient for the expanded game only; their gap is the expansion's "
                             "remainder, booked as efficiency_gap and recomputed)")
        if ads.empty:
            return
    numbers = pd.to_numeric(ads["value"], errors="coerce")
    sums = numbers.groupby(ads["round"]).sum()
    scale = numbers.abs().groupby(ads["round"]).sum().clip(lower=1.0)  # float sums err relative to size
    indexed = rounds.set_index("round")
    gains = pd.to_numeric(indexed["utility_after"], errors="coerce") - pd.to_numeric(indexed["utility_before"],
                                                                                       errors="coerce")
    with np.errstate(all="ignore"):
        gaps = (sums - gains.reindex(sums.index)).abs() / scale
    worst = gaps.max()
    if not worst <= tolerance:
        report.problems.append(f"group efficiency: Σ ADS − (utility_after − utility_before) is {worst:.3g} in round "
                               f"{gaps.idxmax() if gaps.notna().any() else '?'} (tolerance {tolerance:g})")
    else:
        report.checks.append(f"group efficiency in {counted(len(sums), 'round')} (max gap {worst:.1e})")


def check_parquet(files: RunFiles, ledger: pd.DataFrame, ledger_chars: int, complete: bool,
                   report: AuditReport) -> None:
    """Check 4. The copy is written at the close and at each resume, so a run without its
    manifest holds none or a copy whole rounds behind (of the round a resume started from); a
    run with its manifest has every row. Rows and size are read from the metadata before
    the data."""
    import pyarrow.parquet as pq

    try:
        data = files.bytes(LEDGER_PARQUET_FILE)
        metadata = pq.ParquetFile(io.BytesIO(data)).metadata
        rows, names = metadata.num_rows, list(metadata.schema.to_arrow_schema().names)
        unpacked = sum(metadata.row_group(k).total_byte_size for k in range(metadata.num_row_groups))
    except Exception as error:  # noqa: BLE001 - any unreadable copy is a finding
        report.problems.append(f"ledger.parquet: unreadable ({type(error).__name__}: {printable(error, 200)})")
        return
    if names != list(LEDGER_COLUMNS):
        report.problems.append(f"ledger.parquet: columns {[printable(n, 40) for n in names][:12]}, expected "
                               f"{list(LEDGER_COLUMNS)}")
        return
    if rows > len(ledger) or (complete and rows != len(ledger)):
        report.problems.append(f"ledger.parquet holds {rows} rows; ledger.csv holds {len(ledger)}"
                               + (" (a complete run mirrors every row)" if complete else ""))
        return
    if unpacked > max(64 * 1024**2, 20 * ledger_chars):
        report.problems.append(f"ledger.parquet unpacks to {unpacked} bytes, far more than ledger.csv's rows need")
        return
    rounds = ledger["round"].to_numpy()
    if rows < len(ledger) and rows and rounds[rows - 1] == rounds[rows]:
        report.problems.append("ledger.parquet differs from ledger.csv (it ends inside a round)")
        return
    try:
        mirror = pd.read_parquet(io.BytesIO(data))
        pd.testing.assert_frame_equal(mirror.reset_index(drop=True), ledger.iloc[:rows].reset_index(drop=True),
                                      check_dtype=False, check_exact=True)
    except (AssertionError, TypeError, ValueError, OSError):
        report.problems.append("ledger.parquet differs from ledger.csv")
        return
    if rows < len(ledger):
        last = int(ledger["round"].iloc[rows - 1]) if rows else 0
        report.checks.append(f"ledger.parquet equals ledger.csv up to round {last} (the copy is written at the "
                             "close and at a resume; the rounds after it came since)")
    else:
        report.checks.append("ledger.parquet equals ledger.csv, exactly")
