"""Third-party checks of a run directory, failing closed.

``audit_run(DIR)`` reports each check as **verified**, **failed** or **not verifiable**;
a run is *intact* only when nothing failed and nothing it claims went unverified. From
the files alone it re-derives

1. the hash chain: for every round, SHA-256(previous hash, the round's ledger.csv lines
   as written, its rounds.csv line without the hash) equals the recorded hash, the first
   round chaining from SHA-256(run.json) (:mod:`fedvalue.run.ledger_tables`);
2. the schema: the columns, statuses, rounds in order, finite values for booked rows,
   one row per (round, method, client), claim-review rows only in a run whose run.json
   names a claim review;
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
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fedvalue._checks import check_number
from fedvalue.run.archive import (
    RoundRecord,
    npz_from_bytes,
    parse_checkpoint_pointer,
    round_record_from_bytes,
)
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
from fedvalue.audit.training_replay import ReplayTally, platform_note
from fedvalue.audit.audit_recompute import (
    CappedUtility,
    ReplayedRound,
    ReplayUnavailable,
    replay_problems,
    round_problems,
    sample_problems,
    settings_problems,
)
from fedvalue.audit.torn_tail import split_torn_tail, table_of
from fedvalue.audit.references import reference_problems
from fedvalue.scoring.fairness.objectives import GroupFairness
from fedvalue.run.ledger_tables import chain_links, genesis_of, parse_run_config, read_ledger_csv, read_rounds_csv
from fedvalue.valuation.round_game import ArraysUtility
from fedvalue.run.rundir import MAX_JSON_BYTES, RunDir, UnsafeRunFile, printable
from fedvalue.schema import (
    CHECKPOINT_FILE,
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
    checkpoint_names,
    record_name,
)
from fedvalue.run.seals import Verifier

VERIFIED, FAILED, NOT_VERIFIABLE = "verified", "failed", "not verifiable"
#: Seconds an audit may take before what it has not reached is reported not verifiable (a
#: two-round CNN run's audit took 819 s on a loaded 2-core machine: docs/benchmarks.md).
DEFAULT_BUDGET_SECONDS = 3600.0
#: Most clients in a round the recompute takes on when run.json does not say how many.
MAX_PLAYERS = 64
#: Most coalition evaluations of one round the recompute takes on.
MAX_ROUND_EVALUATIONS = 2**20
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass
class AuditReport:
    """What an audit found. ``checks`` were verified, ``problems`` failed, ``unverifiable``
    could not be checked; ``notes`` say what no audit of these files can check.

    ``ok`` is True when no check failed; ``intact`` (the verdict ``fedvalue audit`` exits 0
    on) when, besides, nothing went unverified. ``head`` (the chain's last hash), ``seed``
    (run.json's) and ``signed_by`` (the key fingerprint the manifest or seals name;
    ``key_verified`` when their signatures were checked against a given key) say WHICH run
    this is.
    """

    run_dir: str
    rounds: int = 0
    ledger_rows: int = 0
    problems: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    unverifiable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    head: str | None = None
    seed: object = None
    signed_by: str | None = None
    key_verified: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def intact(self) -> bool:
        return not self.problems and not self.unverifiable

    @property
    def verdict(self) -> str:
        if self.problems:
            return "NOT intact"
        return "NOT verifiable" if self.unverifiable else "intact"

    def verdicts(self) -> list[tuple[str, str]]:
        """(status, what) for every check, in the order verified, failed, not verifiable."""
        return ([(VERIFIED, c) for c in self.checks] + [(FAILED, p) for p in self.problems]
                + [(NOT_VERIFIABLE, u) for u in self.unverifiable])

    def identity(self) -> str:
        """Which run this is: its chain head, seed and signing key."""
        key = ("unsigned" if self.signed_by is None else
               f"signed by key {self.signed_by} ("
               + ("verified with the given public key" if self.key_verified else "not verified: no public key given")
               + ")")
        return f"head {self.head or 'none'}, seed {printable(self.seed, 40)}, {key}"


def audit_run(run_dir: str | os.PathLike, *, tolerance: float = 1e-6, utility: ArraysUtility | None = None,
              recompute_tolerance: float = 1e-9, verifier: Verifier | None = None, expect_head: str | None = None,
              noisy_clients: Collection | None = None, sampled: Callable[[int], Sequence] | None = None,
              recompute: bool = True, fairness: GroupFairness | None = None,
              example_counts: Callable[[Hashable], int] | None = None,
              retrain: Callable[[int, Hashable, Mapping[str, np.ndarray]], Mapping[str, np.ndarray]] | None = None,
              replay: Callable[[RoundRecord], ReplayedRound] | None = None,
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
        built-in simulation's config and seed): the ``noisy`` column must agree.
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
        the replies arrived (:func:`strategies.replay.replay_aggregator` builds it from the
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
                      noisy_clients=noisy_clients, sampled=sampled, fairness=fairness, example_counts=example_counts,
                      retrain=retrain, replay=replay)
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
    """Check 4. The copy is rewritten just after each round's commit, so a run killed in
    between leaves it whole rounds behind (a resume rewrites it); a run with its manifest
    has every row. Rows and size are read from the metadata before the data."""
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
        report.checks.append(f"ledger.parquet equals ledger.csv up to round {last} (the run stopped before "
                             "mirroring the rounds after it; a resume rewrites the copy)")
    else:
        report.checks.append("ledger.parquet equals ledger.csv, exactly")


def _planned_rounds(config: dict) -> int | None:
    planned = config.get("num_rounds")
    return planned if isinstance(planned, int) and not isinstance(planned, bool) and planned > 0 else None


def _players_cap(config: dict) -> int:
    per_round = config.get("clients_per_round")
    if isinstance(per_round, int) and not isinstance(per_round, bool) and 0 < per_round <= MAX_PLAYERS:
        return per_round
    return MAX_PLAYERS


def recompute_run(files: RunFiles, utility: ArraysUtility, ledger: pd.DataFrame, rounds: pd.DataFrame,
                  report: AuditReport, tolerance: float = 1e-9, *, config: dict | None = None,
                  noisy_clients: Collection | None = None, sampled: Callable[[int], Sequence] | None = None,
                  fairness: GroupFairness | None = None, example_counts=None, retrain=None,
                  replay: Callable[[RoundRecord], ReplayedRound] | None = None) -> None:
    """Check 7 of the module docstring; findings go to ``report``."""
    config = {} if config is None else config
    names = {t: record_name(t) for t in range(1, len(rounds) + 1) if files.exists(record_name(t))}
    committed = [int(r) for r in rounds["round"]]
    saved_noisy = config.get("noisy_clients")
    if noisy_clients is not None and isinstance(saved_noisy, list) and \
            sorted(map(str, saved_noisy)) != sorted(map(str, noisy_clients)):
        report.problems.append(f"run.json: noisy_clients {saved_noisy[:10]} are not the ones the run's settings and "
                               f"seed draw, {sorted(noisy_clients)[:10]}")
    if noisy_clients is None and isinstance(saved_noisy, list):
        noisy_clients = {c for c in saved_noisy if isinstance(c, (int, str)) and not isinstance(c, bool)}
    if noisy_clients is not None:
        noisy_clients = {str(c) for c in noisy_clients}
    missing = [t for t in committed if t not in names]
    if missing:
        report.unverifiable.append(f"values: rounds {missing[:10]} have no readable round record, so their books "
                                   "were not recomputed")
    by_round_rows = dict(tuple(ledger.groupby("round"))) if len(ledger) else {}
    round_rows = rounds.set_index("round")
    cap = _players_cap(config)
    recomputed_rounds, skipped, worst = 0, [], 0.0
    skipped_by: set[str] = set()
    unfair: list[int] = []  # rounds with fairness books, audited without the fairness objective
    records: dict[int, object] = {}
    tally = ReplayTally()

    def record_of(t: int):
        if t not in records:
            try:
                records[t] = round_record_from_bytes(files.bytes(names[t]), names[t])
            except (ValueError, OSError) as error:
                records[t] = ValueError(printable(error))
            files.release(names[t])  # parsed: one round (and the next one's start) in memory at a time
        return records[t]

    for position, t in enumerate(committed):
        if t not in names:
            continue
        files.budget.check(f"recomputing round {t}")
        record = record_of(t)
        previous = records.pop(t - 1, None)  # one round (and the next one's start) in memory at a time
        if isinstance(record, ValueError):
            report.unverifiable.append(f"values of round {t}: not recomputed, its record is unreadable ({record})")
            continue
        if record.round != t:
            report.problems.append(f"records: the record of round {t} says it is round {record.round}")
            continue
        by_strategy = record.meta.get("aggregation") != "weighted-mean"
        if by_strategy and (replay is None or "fairness" in record.meta):
            skipped.append(t)
            skipped_by.add(printable(record.meta.get("strategy", "an unknown strategy"), 80))
            continue
        if "fairness" in record.meta and fairness is None:
            unfair.append(t)
            continue
        problems = [f"round {t}'s record: {p}" for p in settings_problems(record, config)]
        problems += sample_problems(record, sampled)
        problems += reference_problems(record, None if isinstance(previous, ValueError) else previous)
        if len(record.statuses) > cap or len(record.replies) > cap:
            problems.append(f"round {t}: its record holds {len(record.statuses)} clients; run.json samples at most "
                            f"{cap} per round")
        booked_evaluations = pd.to_numeric(round_rows.loc[t].get("num_evaluations"), errors="coerce")
        if not (booked_evaluations <= MAX_ROUND_EVALUATIONS):
            report.unverifiable.append(f"values of round {t}: not recomputed, it books {booked_evaluations} "
                                       f"evaluations (the audit recomputes at most {MAX_ROUND_EVALUATIONS})")
            continue
        if problems:  # the record disagrees with run.json: its estimator is not taken on
            report.problems += [f"recompute: {p}" for p in problems]
            continue
        problems += replay_problems(record, example_counts, retrain, tally)
        next_start = _next_start(files, report, committed, position, names, record_of)
        noisy = None if noisy_clients is None else _noisy_ids(record, noisy_clients)
        capped = CappedUtility(utility, int(booked_evaluations) + 2 * len(record.replies) + 8, files.budget)
        try:
            found, difference = round_problems(record, capped, by_round_rows.get(t, ledger.iloc[:0]),
                                               round_rows.loc[t].to_dict(), tolerance, noisy_clients=noisy,
                                               next_start=next_start, fairness=fairness,
                                               replay=replay if by_strategy else None)
        except ReplayUnavailable as error:
            report.unverifiable.append(f"values of round {t}: not recomputed, {printable(error)}")
            continue
        except CappedUtility.Exceeded as error:
            report.problems.append(f"recompute: round {t}: {error}")
            continue
        except (KeyError, TypeError, ValueError, IndexError, ArithmeticError) as error:
            report.problems.append(f"recompute: round {t}'s record cannot be replayed ({type(error).__name__}: "
                                   f"{printable(error)})")
            continue
        problems += found
        report.problems += [f"recompute: {p}" for p in problems]
        if not problems:
            recomputed_rounds += 1
            worst = max(worst, difference)
    if recomputed_rounds:
        report.checks.append(f"recomputed every value of {recomputed_rounds} rounds from the saved arrays "
                             f"(largest difference {worst:.1e})"
                             + (", each reply's weight and arrays from the run's seed" if retrain is not None else ""))
    if tally.replies:
        report.checks.append(tally.summary())
    if retrain is not None:
        report.notes.append(platform_note(config.get("platform")))
    if skipped:
        report.unverifiable.append(
            f"values: rounds {skipped[:10]} aggregate through {', '.join(sorted(skipped_by))}'s own code: their "
            "values were NOT recomputed (" + ("rounds that also booked fairness are recomputed for the FedAvg family "
                                              "only)" if replay is not None else
                                              "the audit was given no way to rebuild that strategy: "
                                              "audit_run(DIR, utility=U, replay=strategies.replay_aggregator(build)) "
                                              "replays it)"))
    if unfair:
        report.unverifiable.append(
            f"values: rounds {unfair[:10]} booked fairness: they were NOT recomputed without the run's fairness "
            "objective (audit_run(DIR, utility=U, fairness=F))")
    report.notes.append("not recomputable from the files: valuation_seconds; and what a record says a client "
                        "reported (its reason, its claim), which only a signature or a published head protects")


def _next_start(files: RunFiles, report: AuditReport, committed: list[int], position: int, names: Mapping,
                record_of) -> Mapping | None:
    """A_t as the next round's record (or, after the last round, the checkpoint) holds it."""
    t = committed[position]
    if position + 1 < len(committed):
        following = committed[position + 1]
        if following not in names:
            return None
        record = record_of(following)
        return None if isinstance(record, ValueError) else record.start_arrays
    try:
        # Through the audit's own reads: hashed once, the same bytes the manifest check saw.
        if not files.exists(CHECKPOINT_FILE):
            return None
        pointer = parse_checkpoint_pointer(files.text(CHECKPOINT_FILE, max_bytes=1 << 20), CHECKPOINT_FILE)
        if pointer[0] != t:
            return None
        name = checkpoint_names(t)[0]
        return npz_from_bytes(files.bytes(name), name)[0]
    except (ValueError, OSError, FileNotFoundError) as error:
        report.problems.append(f"checkpoint: {printable(error)}")
        return None


def _noisy_ids(record, noisy_clients: set[str]) -> set:
    """The record's client ids (in their own types) that are noisy."""
    ids = [*record.statuses, *record.replies, *record.gradients]
    return {c for c in ids if str(c) in noisy_clients}
