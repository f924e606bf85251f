"""Third-party checks of a run directory, failing closed.

``audit_run(DIR)`` reports each check as **verified**, **failed** or **not verifiable**;
a run is *intact* only when nothing failed and nothing it claims went unverified. From
the files alone it re-derives

1. the hash chain: for every round, SHA-256(previous hash, the round's ledger.csv lines
   as written, its rounds.csv line without the hash) equals the recorded hash, the first
   round chaining from SHA-256(run.json) (:mod:`fedvalue.run.ledger_tables`);
2. the schema: the columns, statuses, rounds in order, finite values for booked rows,
   one row per (round, method, client), claim-review rows only in a run whose run.json
   names a claim review; where the run's noisy clients are known (given, or run.json's
   ``noisy_clients``), the ``noisy`` column marks exactly them (:mod:`fedvalue.audit.noisy_column`);
3. group efficiency per round ([ADS], Prop. 4.2): Σ_i φ_t(i) over the round's ADS
   rows equals utility_after − utility_before, to ``tolerance`` × max(1, Σ_i |φ_t(i)|);
4. the Parquet copy equals the CSV exactly (its row count read from its metadata first),
   and, once the run has its manifest, holds every row;
5. the files (:mod:`fedvalue.audit.audit_files`): every entry at every level is one a run or
   its report writes (no link, no special file); the final manifest (:mod:`fedvalue.run.seals`)
   lists exactly the run's files by their exact names with their digests, names as many
   rounds as rounds.csv holds and run.json planned, and the chain's head; each round's
   seal names its chain head and its record's digest. A run without a manifest is
   incomplete (not verifiable);
6. with a ``verifier`` (the signer's public key) every seal and the manifest carry its
   valid signature, and, for an EC key, ``model.sig`` verifies with model-signing's own
   verifier (:mod:`fedvalue.run.model_signature`); and with ``expect_head`` the chain ends at that published hash; with
   either, signatures and digests are checked before anything is parsed, and the audit
   stops at the first failure;
7. with a ``utility``, every recomputable field of every round from its saved record
   (:mod:`fedvalue.audit.audit_recompute`), with the estimator settings, methods and seed of
   run.json, at most run.json's clients per round and no more evaluations than the round
   booked; with ``example_counts`` and ``retrain`` (a simulation rebuilds them from its
   seed) each reply's weight and arrays too. Missing or unreadable records, rounds
   aggregated by another strategy's own code, and a run audited without its utility (or,
   for a run that booked fairness, without its fairness objective) are *not verifiable*.

The audit reads the run directory only, through :mod:`fedvalue.run.rundir` (no link followed,
reads capped; model-signing's verifier reads it itself, and only once every entry is known
to be a regular file or a directory), opens no network connection, and stops within ``budget_seconds`` (what it
did not reach is then not verifiable). Any content of any file gives a finding, never an
exception; every message is printable (control characters escaped). The report names the
run's chain head, its seed and the key its commitments name, so an auditor can tell one
authentic run of a signer from another.
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Callable, Collection, Sequence

import numpy as np
import pandas as pd

from fedvalue._checks import check_number
from fedvalue.audit.audit_files import (
    Budget,
    BudgetExceeded,
    RunFiles,
    check_commitments,
    check_layout,
    check_manifest_files,
    check_model_signature,
    check_signatures,
    read_commitments,
)
from fedvalue.audit.noisy_column import check_noisy_column
from fedvalue.audit.recomputation import ExampleCounts, Replay, Retrain, recompute_run
from fedvalue.audit.report import AuditReport
from fedvalue.audit.torn_tail import split_torn_tail, table_of
from fedvalue.scoring.fairness.objectives import GroupFairness
from fedvalue.run.ledger_tables import chain_links, genesis_of, parse_run_config, read_ledger_csv, read_rounds_csv
from fedvalue.valuation.round_game import ArraysUtility
from fedvalue.run.rundir import MAX_JSON_BYTES, RunDir, UnsafeRunFile, printable
from fedvalue.schema import (
    CLAIM_PREFIX,
    CLIENT_STATUSES,
    LEDGER_COLUMNS,
    LEDGER_FILE,
    LEDGER_PARQUET_FILE,
    MODEL_SIGNATURE_FILE,
    ROUNDS_FILE,
    ROUND_COLUMNS,
    RUN_CONFIG_FILE,
    Method,
    Status,
    record_name,
)
from fedvalue.run.seals import Verifier

#: Seconds an audit may take before what it has not reached is reported not verifiable (a
#: two-round CNN run's audit took 819 s on a loaded 2-core machine: docs/benchmarks.md).
DEFAULT_BUDGET_SECONDS = 3600.0
_HEX64 = re.compile(r"[0-9a-f]{64}")


def audit_run(run_dir: str | os.PathLike, *, tolerance: float = 1e-6, utility: ArraysUtility | None = None,
              recompute_tolerance: float = 1e-9, verifier: Verifier | None = None, expect_head: str | None = None,
              noisy_clients: Collection | None = None, sampled: Callable[[int], Sequence] | None = None,
              recompute: bool = True, fairness: GroupFairness | None = None,
              example_counts: ExampleCounts | None = None, retrain: Retrain | None = None,
              replay: Replay | None = None,
              budget_seconds: float = DEFAULT_BUDGET_SECONDS) -> AuditReport:
    """Check a run directory (module docstring).

    Parameters
    ----------
    run_dir
        The run directory (resolved once: relative, ``~`` and linked parents name it).
    tolerance
        Allowed group-efficiency gap, relative to max(1, Σ_i |φ_t(i)|); finite, ≥ 0.
    utility
        The run's utility U (the same held-out data and model); with it every recomputable
        field is recomputed from the round records (check 7).
    recompute_tolerance
        Allowed |recomputed − booked| relative to max(1, |booked|); the same code on the same
        arrays reproduces the values exactly, so any larger difference is a changed number.
    verifier
        The signer's public key (:class:`fedvalue.run.seals.Verifier`): seals and manifest must
        carry its signatures.
    expect_head
        A chain head published elsewhere (64 lowercase hex digits): the run's last hash must
        equal it.
    noisy_clients
        The run's noisy clients where they are known independently of the ledger (a
        built-in simulation's config and seed): run.json's ``noisy_clients`` and the
        ``noisy`` column must agree (without them, run.json's list is the one checked).
    sampled
        round -> the clients the run's sampler chose (a built-in simulation's seeded
        sampler): each record's clients must be those.
    recompute
        False: the caller declines check 7; values are then reported not recomputed in
        ``notes`` instead of as not verifiable.
    fairness
        The run's fairness objective (the same held-out data, sensitive attribute and gap),
        for runs that booked fairness; without it their rounds are not verifiable.
    example_counts
        client -> the examples it holds (a simulation's seeded partition): each reply's
        weight must be that count.
    retrain
        (round, client, A_{t−1}) -> the arrays the client's local training gives (a
        simulation replays it from the run's settings and seed): each saved reply must
        equal them (to 1e-5 relative, or within what float rounding does to that training
        on this machine: :mod:`fedvalue.audit.training_replay`).
    replay
        record -> Agg_t, the round's aggregation by the run's inner strategy as it was when
        the replies arrived (:func:`strategies.aggregation.reaggregate.replay_aggregator` builds it from the
        strategy's saved state): with it the rounds of strategies outside the FedAvg family
        (robust, adaptive, randomized, DP) are recomputed too; without it they are not
        verifiable.
    budget_seconds
        Time the audit may take; past it, what was not reached is not verifiable.

    Raises
    ------
    FileNotFoundError
        ``run_dir`` is not a directory holding ledger.csv or rounds.csv (not a run directory).
    ValueError
        A parameter out of range (named).
    """
    check_number("tolerance", tolerance, low=0.0)
    check_number("recompute_tolerance", recompute_tolerance, low=0.0)
    check_number("budget_seconds", budget_seconds, low=0.0, low_open=True)
    if expect_head is not None and not (isinstance(expect_head, str) and _HEX64.fullmatch(expect_head)):
        raise ValueError(f"expect_head: expected a chain head of 64 lowercase hex digits; got {expect_head!r}.")
    try:
        run = RunDir(run_dir)
    except (FileNotFoundError, UnsafeRunFile):
        raise FileNotFoundError(f"run_dir: expected a fedvalue run directory; {printable(run_dir)} is not a "
                                "directory.") from None
    if not run.exists(LEDGER_FILE) and not run.exists(ROUNDS_FILE) and not run.exists(RUN_CONFIG_FILE):
        raise FileNotFoundError(
            f"run_dir: expected a fedvalue run directory holding run.json, ledger.csv and rounds.csv; {run.show()} has "
            "none of them."
        )
    report = AuditReport(str(run.path))
    options = dict(tolerance=tolerance, utility=utility, recompute_tolerance=recompute_tolerance, verifier=verifier,
                   expect_head=expect_head, noisy_clients=noisy_clients, sampled=sampled, recompute=recompute,
                   fairness=fairness, example_counts=example_counts, retrain=retrain, replay=replay)
    try:
        _audit(RunFiles(run, Budget(budget_seconds)), report, **options)
    except BudgetExceeded as error:
        report.unverifiable.append(f"{error}; what it had not reached is not verified")
    except Exception as error:  # noqa: BLE001 - fail closed: whatever a file holds, the audit says so
        report.unverifiable.append(f"the audit stopped on content it cannot read ({type(error).__name__}: "
                                   f"{printable(error)})")
    finally:
        run.close()
    for name in ("problems", "checks", "unverifiable", "notes"):
        setattr(report, name, [printable(line, 1000) for line in getattr(report, name)])
    return report


def _read_tables(files: RunFiles, report: AuditReport, *,
                 complete: bool) -> tuple[tuple[str, list[str]], tuple[str, list[str]]] | None:
    """(header, data lines) of ledger.csv and rounds.csv; in a run without its manifest,
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
    return (ledger.header, ledger.lines), (rounds.header, rounds.lines)


def _read_config(files: RunFiles, report: AuditReport) -> dict:
    if not files.exists(RUN_CONFIG_FILE):
        return {}
    try:
        return parse_run_config(files.text(RUN_CONFIG_FILE, max_bytes=MAX_JSON_BYTES))
    except ValueError as error:
        report.problems.append(printable(error))
        return {}


def _audit(files: RunFiles, report: AuditReport, *, tolerance, utility, recompute_tolerance, verifier, expect_head,
           noisy_clients, sampled, recompute, fairness, example_counts, retrain, replay) -> None:
    config = _read_config(files, report)
    report.seed = config.get("seed")
    seals, manifest = read_commitments(files, report)
    signed = [m.get("key") for m in ([manifest] if manifest else []) + seals[-1:] if isinstance(m.get("key"), str)]
    report.signed_by = signed[0] if signed else None
    check_layout(files, report, has_manifest=manifest is not None)
    if verifier is not None:  # 6. signatures before anything is parsed; stop at the first failure
        if not check_signatures(verifier, seals, manifest, report):
            return
        report.key_verified = True
        if not check_model_signature(files, verifier, manifest, report):
            return
    elif files.exists(MODEL_SIGNATURE_FILE):
        report.notes.append(f"{MODEL_SIGNATURE_FILE}: not checked without the signer's public key (--public-key PEM); "
                            "model_signing verify key checks it too")
    pinned = verifier is not None or expect_head is not None
    if manifest is not None and pinned and not check_manifest_files(files, manifest, report, stop_at_first=True):
        return
    tables = _read_tables(files, report, complete=manifest is not None)
    if tables is None:
        return
    (ledger_header, ledger_lines), (rounds_header, round_lines) = tables
    headers_ok = True
    for name, header, columns in ((LEDGER_FILE, ledger_header, LEDGER_COLUMNS), (ROUNDS_FILE, rounds_header,
                                                                                 ROUND_COLUMNS)):
        if header.split(",") != list(columns):
            headers_ok = False
            report.problems.append(f"{name}: columns {[printable(c, 40) for c in header.split(',')[:16]]}, expected "
                                   f"{list(columns)}")
    if not headers_ok:
        return
    report.rounds, report.ledger_rows = len(round_lines), len(ledger_lines)

    heads = _check_chain(files, report, ledger_lines, round_lines)  # 1.
    report.head = heads[-1] if heads else None
    if expect_head is not None:
        if report.head == expect_head:
            report.checks.append(f"the chain ends at the published head {expect_head[:16]}...")
        else:
            report.problems.append(f"published head: expected the chain to end at {expect_head[:16]}...; it ends at "
                                   f"{str(report.head)[:16]}... ({len(heads)} rounds)")
            return
    tables = _check_schema(report, config, ledger_header, ledger_lines, rounds_header, round_lines)  # 2.
    if tables is None:
        return
    ledger, rounds = tables
    check_noisy_column(ledger, config, noisy_clients, report)  # 2., against the run's ground truth
    _check_efficiency(ledger, rounds, tolerance, report)  # 3.
    if files.exists(LEDGER_PARQUET_FILE):  # 4.
        _check_parquet(files, ledger, sum(map(len, ledger_lines)), manifest is not None, report)
    if manifest is not None and not pinned:  # 5. (checked first above when pinned)
        check_manifest_files(files, manifest, report, stop_at_first=False)
    check_commitments(files, report, seals, manifest, heads, _planned_rounds(config), verifier)
    if verifier is None:
        report.notes.append("no public key given: seals and manifest were checked for consistency only (anyone can "
                            "rewrite them with the tables); --public-key or --expect-head makes a rewrite fail")
    if utility is not None:  # 7.
        recompute_run(files, utility, ledger, rounds, report, recompute_tolerance, config=config,
                      sampled=sampled, fairness=fairness, example_counts=example_counts, retrain=retrain,
                      replay=replay)
    elif recompute:
        report.unverifiable.append("values: not recomputed (no utility to rebuild the round games with); "
                                   "fedvalue.audit.verdict.audit_run(DIR, utility=U) recomputes them")
    else:
        report.notes.append("values were not recomputed (asked not to)")


def _check_chain(files: RunFiles, report: AuditReport, ledger_lines: list[str], round_lines: list[str]) -> list[str]:
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
        report.checks.append(f"hash chain intact over {len(round_lines)} rounds")
    return heads


def _check_schema(report: AuditReport, config: dict, ledger_header: str, ledger_lines: list[str], rounds_header: str,
                  round_lines: list[str]) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """Check 2; the parsed tables (None when they do not parse or rounds are out of order)."""
    before = len(report.problems)
    try:
        ledger = read_ledger_csv(io.StringIO("".join([ledger_header + "\n", *ledger_lines]), newline=""))
        rounds = read_rounds_csv(io.StringIO("".join([rounds_header + "\n", *round_lines]), newline=""))
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
    return ledger, rounds


def _check_efficiency(ledger: pd.DataFrame, rounds: pd.DataFrame, tolerance: float, report: AuditReport) -> None:
    ads = ledger[(ledger["method"] == Method.ADS) & (ledger["status"] == Status.OK)]
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
        report.checks.append(f"group efficiency in {len(sums)} rounds (max gap {worst:.1e})")


def _check_parquet(files: RunFiles, ledger: pd.DataFrame, ledger_chars: int, complete: bool,
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


def _planned_rounds(config: dict) -> int | None:
    planned = config.get("num_rounds")
    return planned if isinstance(planned, int) and not isinstance(planned, bool) and planned > 0 else None
