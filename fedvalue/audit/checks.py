"""Third-party checks of a run directory, failing closed.

``audit_run(DIR)`` reports each check as **verified**, **failed** or **not verifiable**;
a run is *intact* only when nothing failed and nothing it claims went unverified. From
the files alone it re-derives (checks 1 to 4 on the tables: :mod:`fedvalue.audit.tables`)

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
   and, once the run has its manifest, holds every row; and where ``fedvalue report --payout``
   wrote ``payout.csv`` beside the run, it is the payout the ledger gives for the method, rule,
   floor and budget it states, exactly (:mod:`fedvalue.audit.payout_file`);
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
   (:mod:`fedvalue.audit.round`), with the estimator settings, methods and seed of
   run.json, at most run.json's clients per round and no more evaluations than the round
   booked (a loss utility's numbers to within its float32 rounding on the auditor's machine:
   :mod:`fedvalue.audit.rounding_envelope`); with ``example_counts`` and ``retrain`` (a
   simulation rebuilds them from its seed) each reply's weight and arrays too. Missing or unreadable records, rounds
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

import os
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

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
    read_config,
)
from fedvalue.audit.noisy_column import check_noisy_column
from fedvalue.audit.payout_file import check_payout_file
from fedvalue.audit.rounds import ExampleCounts, Recompute, Replay, Retrain, recompute_run
from fedvalue.audit.report import AuditReport
from fedvalue.audit.tables import (
    check_chain,
    check_efficiency,
    check_headers,
    check_parquet,
    check_schema,
    read_table_lines,
)
from fedvalue.scoring.fairness.objectives import GroupFairness
from fedvalue.run.ledger_reader import LedgerTables
from fedvalue.valuation.round_game import ArraysUtility
from fedvalue.run.rundir import RunDir, UnsafeRunFile, printable
from fedvalue.schema import (
    LEDGER_FILE,
    LEDGER_PARQUET_FILE,
    MODEL_SIGNATURE_FILE,
    ROUNDS_FILE,
    RUN_CONFIG_FILE,
)
from fedvalue.run.seals import Verifier

#: Seconds an audit may take before what it has not reached is reported not verifiable (a
#: two-round CNN run's audit took 819 s on a loaded 2-core machine: docs/benchmarks.md).
DEFAULT_BUDGET_SECONDS = 3600.0
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class _AuditOptions:
    """:func:`audit_run`'s options as the checks read them, made once: check 7's as one
    :class:`~fedvalue.audit.rounds.Recompute` (None without a utility), and whether the
    caller declined check 7."""

    tolerance: float
    verifier: Verifier | None
    expect_head: str | None
    noisy_clients: Collection | None
    recompute: Recompute | None
    declined: bool = False

    @property
    def pinned(self) -> bool:
        """Whether the run is pinned to its signer or its published head: its commitments are then
        checked first and the audit stops at their first failure."""
        return self.verifier is not None or self.expect_head is not None


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
        arrays reproduces the values exactly on the run's machine, so any larger difference is a
        changed number, except that a utility rounding by the machine's kernels (a float32 loss) is
        allowed its float32 rounding measured on this machine besides
        (:mod:`fedvalue.audit.rounding_envelope`).
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
    run = _open_run(run_dir)
    recomputing = None if utility is None else Recompute(
        utility, tolerance=recompute_tolerance, sampled=sampled, fairness=fairness, example_counts=example_counts,
        retrain=retrain, replay=replay)
    options = _AuditOptions(tolerance=tolerance, verifier=verifier, expect_head=expect_head,
                            noisy_clients=noisy_clients, recompute=recomputing, declined=not recompute)
    report = AuditReport(str(run.path))
    try:
        _audit(RunFiles(run, Budget(budget_seconds)), report, options)
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


def _open_run(run_dir: str | os.PathLike) -> RunDir:
    """The run directory, opened once; FileNotFoundError unless it is a directory holding one of
    run.json, ledger.csv and rounds.csv."""
    try:
        run = RunDir(run_dir)
    except (FileNotFoundError, UnsafeRunFile):
        raise FileNotFoundError(f"run_dir: expected a fedvalue run directory; {printable(run_dir)} is not a "
                                "directory.") from None
    if not run.exists(LEDGER_FILE) and not run.exists(ROUNDS_FILE) and not run.exists(RUN_CONFIG_FILE):
        run.close()
        raise FileNotFoundError(
            f"run_dir: expected a fedvalue run directory holding run.json, ledger.csv and rounds.csv; {run.show()} has "
            "none of them."
        )
    return run


def _audit(files: RunFiles, report: AuditReport, options: _AuditOptions) -> None:
    """The checks of the module docstring, in its order; findings go to ``report``."""
    config = read_config(files, report)
    report.seed = config.get("seed")
    commitments = _verified_commitments(files, report, options)
    if commitments is None:
        _count_unchecked(files, report)
        return
    seals, manifest = commitments
    checked = _checked_tables(files, report, options, config, complete=manifest is not None)
    if checked is None:
        return
    tables, heads = checked
    if manifest is not None and not options.pinned:  # 5. (checked first when pinned)
        check_manifest_files(files, manifest, report, stop_at_first=False)
    check_commitments(files, report, seals, manifest, heads, _planned_rounds(config), options.verifier)
    if options.verifier is None:
        report.notes.append("no public key given: seals and manifest were checked for consistency only (anyone can "
                            "rewrite them with the tables); --public-key or --expect-head makes a rewrite fail")
    if options.recompute is not None:  # 7.
        recompute_run(files, tables, report, options.recompute)
    elif not options.declined:
        report.unverifiable.append("values: not recomputed (no utility to rebuild the round games with); "
                                   "fedvalue.audit.checks.audit_run(DIR, utility=U) recomputes them")
    else:
        report.notes.append("values were not recomputed (asked not to)")


def _verified_commitments(files: RunFiles, report: AuditReport,
                          options: _AuditOptions) -> tuple[list[dict], dict | None] | None:
    """The run's seals and manifest, read; with a verifier their signatures and model.sig (6.),
    and when pinned the manifest's files, checked before anything is parsed. None at the first
    failure of those (the audit stops)."""
    seals, manifest = read_commitments(files, report)
    signed = [m.get("key") for m in ([manifest] if manifest else []) + seals[-1:] if isinstance(m.get("key"), str)]
    report.signed_by = signed[0] if signed else None
    check_layout(files, report, has_manifest=manifest is not None)
    verifier = options.verifier
    if verifier is not None:  # 6. signatures before anything is parsed; stop at the first failure
        if not check_signatures(verifier, seals, manifest, report):
            report.key_failed, report.stopped = True, "the signatures"
            return None
        report.key_verified = True
        if not check_model_signature(files, verifier, manifest, report):
            report.model_failed, report.stopped = True, "model.sig"
            return None
    elif files.exists(MODEL_SIGNATURE_FILE):
        report.notes.append(f"{MODEL_SIGNATURE_FILE}: not checked without the signer's public key (--public-key PEM); "
                            "model_signing verify key checks it too")
    if manifest is not None and options.pinned and not check_manifest_files(files, manifest, report,
                                                                             stop_at_first=True):
        report.stopped = "the manifest's digests"
        return None
    return seals, manifest


def _count_unchecked(files: RunFiles, report: AuditReport) -> None:
    """The rounds and ledger rows the tables hold, counted as lines (nothing parsed, nothing
    believed) when the audit stopped before checking them; unknown (0) for a table it cannot read."""
    counts = []
    for name in (ROUNDS_FILE, LEDGER_FILE):
        try:
            text = files.text(name) if files.exists(name) else ""
        except (ValueError, OSError):
            text = ""
        counts.append(max(0, sum(1 for line in text.splitlines() if line.strip()) - 1))
    report.rounds, report.ledger_rows = counts


def _checked_tables(files: RunFiles, report: AuditReport, options: _AuditOptions, config: dict, *,
                    complete: bool) -> tuple[LedgerTables, list[str]] | None:
    """Checks 1 to 4 (:mod:`fedvalue.audit.tables`) and the published head: the parsed tables
    and every round's recorded hash; None when the tables cannot be taken further."""
    lines = read_table_lines(files, report, complete=complete)
    if lines is None or not check_headers(report, *lines):
        return None
    ledger_table, rounds_table = lines
    report.rounds, report.ledger_rows = len(rounds_table.lines), len(ledger_table.lines)
    report.tables_checked = True
    heads = check_chain(files, report, ledger_table.lines, rounds_table.lines)  # 1.
    report.head = heads[-1] if heads else None
    expect_head = options.expect_head
    if expect_head is not None:
        if report.head != expect_head:
            report.problems.append(f"published head: expected the chain to end at {expect_head[:16]}...; it ends at "
                                   f"{str(report.head)[:16]}... ({len(heads)} rounds)")
            return None
        report.checks.append(f"the chain ends at the published head {expect_head[:16]}...")
    tables = check_schema(report, config, ledger_table, rounds_table)  # 2.
    if tables is None:
        return None
    check_noisy_column(tables.ledger, config, options.noisy_clients, report)  # 2., against the run's ground truth
    check_efficiency(tables.ledger, tables.rounds, options.tolerance, report)  # 3.
    if files.exists(LEDGER_PARQUET_FILE):  # 4.
        check_parquet(files, tables.ledger, sum(map(len, ledger_table.lines)), complete, report)
    check_payout_file(files, tables.ledger, report)  # 4., a report's payout.csv against the ledger
    return tables, heads


def _planned_rounds(config: dict) -> int | None:
    planned = config.get("num_rounds")
    return planned if isinstance(planned, int) and not isinstance(planned, bool) and planned > 0 else None
