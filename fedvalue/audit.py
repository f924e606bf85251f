"""Third-party checks of a run directory, failing closed.

``audit_run(DIR)`` reports each check as **verified**, **failed** or **not verifiable**;
a run is *intact* only when nothing failed and nothing it claims went unverified. From
the files alone it re-derives

1. the hash chain: for every round, SHA-256(previous hash, the round's ledger.csv lines
   as written, its rounds.csv line without the hash) equals the recorded hash, the first
   round chaining from SHA-256(run.json) (:mod:`fedvalue.ledger`);
2. the schema: the columns, statuses, rounds in order, finite values for booked rows;
3. group efficiency per round ([ADS], Prop. 4.2): Σ_i φ_t(i) over the round's ADS
   rows equals utility_after − utility_before, to ``tolerance`` × max(1, Σ_i |φ_t(i)|);
4. the Parquet copy equals the CSV;
5. completeness: the final manifest (:mod:`fedvalue.seals`) names as many rounds as
   rounds.csv holds and run.json planned, the chain's head, and the digest of every
   file; each round's seal names its chain head and its record's digest. A run without
   a manifest is incomplete (not verifiable);
6. with a ``verifier`` (the signer's public key) every seal and the manifest carry its
   valid signature; with ``expect_head`` the chain ends at that published hash;
7. with a ``utility``, every recomputable field of every round from its saved record
   (:mod:`fedvalue.audit_recompute`). Missing or unreadable records, rounds aggregated
   by another strategy's own code, and a run audited without its utility (or, for a run
   that booked fairness, without its fairness objective) are *not verifiable*.

Any content of any file gives a message, never an exception: unreadable, special or
linked files (:mod:`fedvalue.rundir`) are findings of the audit.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fedvalue import rundir
from fedvalue.archive import RECORDS_DIR, read_checkpoint, read_round_record, round_record_paths
from fedvalue.audit_recompute import round_problems, sample_problems, settings_problems
from fedvalue.fairness import GroupFairness
from fedvalue.ledger import chain_hash, genesis_hash, read_ledger_csv, read_rounds_csv, read_run_config
from fedvalue.rounds import ArraysUtility
from fedvalue.schema import (
    CLIENT_STATUSES,
    LEDGER_COLUMNS,
    LEDGER_FILE,
    LEDGER_PARQUET_FILE,
    ROUND_COLUMNS,
    ROUNDS_FILE,
)
from fedvalue.seals import MANIFEST_FILE, SEALS_FILE, Verifier, read_manifest, read_seals, sha256_of

VERIFIED, FAILED, NOT_VERIFIABLE = "verified", "failed", "not verifiable"


@dataclass
class AuditReport:
    """What an audit found. ``checks`` were verified, ``problems`` failed, ``unverifiable``
    could not be checked; ``notes`` say what no audit of these files can check.

    ``ok`` is True when no check failed; ``intact`` (the verdict ``fedvalue audit`` exits 0
    on) when, besides, nothing went unverified.
    """

    run_dir: str
    rounds: int = 0
    ledger_rows: int = 0
    problems: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    unverifiable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

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


def audit_run(run_dir: str | os.PathLike, *, tolerance: float = 1e-6, utility: ArraysUtility | None = None,
              recompute_tolerance: float = 1e-9, verifier: Verifier | None = None, expect_head: str | None = None,
              noisy_clients: Collection | None = None, sampled: Callable[[int], Sequence] | None = None,
              recompute: bool = True, fairness: GroupFairness | None = None) -> AuditReport:
    """Check a run directory (module docstring).

    Parameters
    ----------
    run_dir
        The run directory.
    tolerance
        Allowed group-efficiency gap, relative to max(1, Σ_i |φ_t(i)|).
    utility
        The run's utility U (the same held-out data and model); with it every recomputable
        field is recomputed from the round records (check 7).
    recompute_tolerance
        Allowed |recomputed − booked| relative to max(1, |booked|); the same code on the same
        arrays reproduces the values exactly, so any larger difference is a changed number.
    verifier
        The signer's public key (:class:`fedvalue.seals.Verifier`): seals and manifest must
        carry its signatures.
    expect_head
        A chain head published elsewhere: the run's last hash must equal it.
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

    Raises
    ------
    FileNotFoundError
        ``run_dir`` holds neither ledger.csv nor rounds.csv (not a run directory).
    """
    run_dir = rundir.resolve(run_dir)
    report = AuditReport(str(run_dir))
    if not os.path.isdir(run_dir) or (not rundir.exists(run_dir, LEDGER_FILE)
                                      and not rundir.exists(run_dir, ROUNDS_FILE)):
        raise FileNotFoundError(
            f"run_dir: expected a fedvalue run directory holding ledger.csv and rounds.csv; {run_dir} has neither."
        )
    try:
        _audit(run_dir, report, tolerance=tolerance, utility=utility, recompute_tolerance=recompute_tolerance,
               verifier=verifier, expect_head=expect_head, noisy_clients=noisy_clients, sampled=sampled,
               recompute=recompute, fairness=fairness)
    except Exception as error:  # noqa: BLE001 - fail closed: whatever a file holds, the audit says so
        report.unverifiable.append(f"the audit stopped on content it cannot read ({type(error).__name__}: {error})")
    return report


def _table_lines(run_dir: Path, name: str, report: AuditReport) -> tuple[str, list[str]] | None:
    try:
        lines = rundir.read_text(run_dir, name).splitlines(keepends=True)
    except FileNotFoundError:
        report.problems.append(f"{name}: missing from {run_dir}")
        return None
    except ValueError as error:
        report.problems.append(f"{name}: {error}")
        return None
    return (lines[0].rstrip("\n") if lines else ""), lines[1:]


def _audit(run_dir: Path, report: AuditReport, *, tolerance, utility, recompute_tolerance, verifier, expect_head,
           noisy_clients, sampled, recompute, fairness) -> None:
    ledger_table, rounds_table = _table_lines(run_dir, LEDGER_FILE, report), _table_lines(run_dir, ROUNDS_FILE, report)
    try:
        config = read_run_config(run_dir)
    except ValueError as error:
        report.problems.append(str(error))
        config = {}
    if ledger_table is None or rounds_table is None:
        return
    (ledger_header, ledger_lines), (rounds_header, round_lines) = ledger_table, rounds_table
    if ledger_header.split(",") != list(LEDGER_COLUMNS):
        report.problems.append(f"ledger.csv: columns {ledger_header.split(',')[:12]}, expected {list(LEDGER_COLUMNS)}")
    if rounds_header.split(",") != list(ROUND_COLUMNS):
        report.problems.append(f"rounds.csv: columns {rounds_header.split(',')[:16]}, expected {list(ROUND_COLUMNS)}")
    if report.problems:
        return
    report.rounds, report.ledger_rows = len(round_lines), len(ledger_lines)

    heads = _check_chain(run_dir, report, ledger_lines, round_lines)

    # 2. Schema and values.
    try:
        ledger = read_ledger_csv(io.StringIO("".join([ledger_header + "\n", *ledger_lines]), newline=""))
        rounds = read_rounds_csv(io.StringIO("".join([rounds_header + "\n", *round_lines]), newline=""))
        round_numbers = [int(r) for r in rounds["round"]]
    except (ValueError, TypeError, OverflowError, pd.errors.ParserError) as error:
        report.problems.append(f"schema: the tables do not parse ({type(error).__name__}: {error})")
        return
    bad_status = sorted(set(ledger["status"]) - set(CLIENT_STATUSES))
    if bad_status:
        report.problems.append(f"ledger.csv: unknown statuses {bad_status[:5]}")
    booked = ledger[ledger["status"].isin(["ok", "idle"])]
    values = pd.to_numeric(booked["value"], errors="coerce")
    if not values.map(lambda v: isinstance(v, float) and math.isfinite(v)).all():
        report.problems.append("ledger.csv: a booked row has a missing or non-finite value")
    if round_numbers != list(range(1, len(rounds) + 1)):
        report.problems.append(f"rounds.csv: rounds {round_numbers[:10]}, expected 1..{len(rounds)}")
        return
    for column in ("utility_before", "utility_after", "utility_realized", "efficiency_gap", "valuation_seconds"):
        numbers = pd.to_numeric(rounds[column], errors="coerce")
        if not numbers.dropna().map(math.isfinite).all() or numbers.abs().max() > 1e12:
            report.problems.append(f"rounds.csv: {column} holds a non-finite or implausibly large number")
    if not report.problems:
        report.checks.append(f"schema and values of {len(ledger)} ledger rows")

    _check_efficiency(ledger, rounds, tolerance, report)
    if rundir.exists(run_dir, LEDGER_PARQUET_FILE):
        try:
            mirror = pd.read_parquet(io.BytesIO(rundir.read_bytes(run_dir, LEDGER_PARQUET_FILE)))
        except Exception as error:  # noqa: BLE001 - any unreadable copy is a finding
            report.problems.append(f"ledger.parquet: unreadable ({type(error).__name__}: {error})")
        else:
            _check_parquet(mirror, ledger, report)
    _check_commitments(run_dir, report, config, heads, verifier, expect_head)
    if utility is not None:
        recompute_run(run_dir, utility, ledger, rounds, report, recompute_tolerance, config=config,
                      noisy_clients=noisy_clients, sampled=sampled, fairness=fairness)
    elif recompute:
        report.unverifiable.append("values: not recomputed (no utility to rebuild the round games with); "
                                   "fedvalue.audit.audit_run(DIR, utility=U) recomputes them")
    else:
        report.notes.append("values were not recomputed (asked not to)")


def _check_chain(run_dir: Path, report: AuditReport, ledger_lines: list[str], round_lines: list[str]) -> list[str]:
    """Check 1; returns the recorded hash of every round."""
    by_round: dict[str, list[str]] = {}
    order: list[str] = []
    for line in ledger_lines:
        key = line.split(",", 1)[0]
        if key not in by_round:
            by_round[key] = []
            order.append(key)
        elif order[-1] != key:
            report.problems.append(f"ledger.csv: rows of round {key[:20]} are not contiguous")
        by_round[key].append(line)
    try:
        previous = genesis_hash(run_dir)
    except ValueError as error:
        report.problems.append(f"run.json: {error}")
        return []
    broken, heads = None, []
    for line in round_lines:
        body, _, recorded = line.rstrip("\n").rpartition(",")
        round_key = body.split(",", 1)[0]
        expected = chain_hash(previous, by_round.get(round_key, []), body + "\n")
        if expected != recorded and broken is None:
            broken = round_key
            report.problems.append(
                f"hash chain: round {round_key[:20]} does not match its recorded hash (its ledger rows, its "
                "rounds.csv row, an earlier round or run.json was changed)"
            )
        previous = recorded
        heads.append(recorded)
    committed = {ln.split(",", 1)[0] for ln in round_lines}
    extra = [k for k in order if k not in committed]
    if extra:
        report.problems.append(f"ledger.csv: rows for rounds {extra[:5]} that rounds.csv never committed")
    if broken is None:
        report.checks.append(f"hash chain intact over {len(round_lines)} rounds")
    return heads


def _check_efficiency(ledger: pd.DataFrame, rounds: pd.DataFrame, tolerance: float, report: AuditReport) -> None:
    ads = ledger[(ledger["method"] == "ads") & (ledger["status"] == "ok")]
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


def _check_parquet(mirror: pd.DataFrame, ledger: pd.DataFrame, report: AuditReport) -> None:
    """The Parquet copy equals ledger.csv, or its first whole rounds: the copy is rewritten
    just after each round's commit, so a run killed in between leaves it rounds behind
    (a resume rewrites it). Any other difference is a problem."""
    lagging = len(mirror) < len(ledger)
    if lagging:
        rounds = ledger["round"].to_numpy()
        if len(mirror) and rounds[len(mirror) - 1] == rounds[len(mirror)]:
            report.problems.append("ledger.parquet differs from ledger.csv (it ends inside a round)")
            return
        ledger = ledger.iloc[: len(mirror)]
    try:
        pd.testing.assert_frame_equal(mirror.reset_index(drop=True), ledger.reset_index(drop=True), check_dtype=False)
    except (AssertionError, TypeError, ValueError):
        report.problems.append("ledger.parquet differs from ledger.csv")
        return
    if lagging:
        last = int(ledger["round"].iloc[-1]) if len(ledger) else 0
        report.checks.append(f"ledger.parquet equals ledger.csv up to round {last} (the run stopped before "
                             "mirroring the rounds after it; a resume rewrites the copy)")
    else:
        report.checks.append("ledger.parquet equals ledger.csv")


def _planned_rounds(config: dict) -> int | None:
    planned = config.get("num_rounds")
    return planned if isinstance(planned, int) and not isinstance(planned, bool) and planned > 0 else None


def _check_commitments(run_dir: Path, report: AuditReport, config: dict, heads: list[str],
                       verifier: Verifier | None, expect_head: str | None) -> None:
    """Checks 5 and 6: the seals, the manifest, their signatures, a published head."""
    present, head = len(heads), heads[-1] if heads else None
    planned = _planned_rounds(config)
    if expect_head is not None:
        if head == expect_head:
            report.checks.append(f"the chain ends at the published head {expect_head[:16]}...")
        else:
            report.problems.append(f"published head: expected the chain to end at {expect_head[:16]}...; it ends at "
                                   f"{str(head)[:16]}... ({present} rounds)")
    try:
        seals = read_seals(run_dir)
    except ValueError as error:
        report.problems.append(str(error))
        seals = []
    try:
        manifest = read_manifest(run_dir)
    except ValueError as error:
        report.problems.append(str(error))
        manifest = None
    problems_before = len(report.problems)
    by_round = {}
    for seal in seals:
        t = seal["round"]
        if t in by_round or not 1 <= t <= present:
            report.problems.append(f"{SEALS_FILE}: a seal for round {t}, which rounds.csv does not commit once")
            continue
        by_round[t] = seal
        if seal.get("head") != heads[t - 1]:
            report.problems.append(f"{SEALS_FILE}: round {t}'s seal names another chain head than rounds.csv")
        record = seal.get("record")
        name = f"{RECORDS_DIR}/round-{t:06d}.npz"
        if record is not None and rundir.exists(run_dir, name):
            try:
                if sha256_of(run_dir, name) != record:
                    report.problems.append(f"{name}: its digest is not the one its round's seal committed to")
            except ValueError as error:
                report.problems.append(str(error))
        if verifier is not None and (problem := verifier.problem(seal)) is not None:
            report.problems.append(f"{SEALS_FILE}: round {t}'s seal: {problem}")
    unsealed = [t for t in range(1, present + 1) if t not in by_round]
    # A run killed between a round's commit and its seal leaves that last round unsealed.
    tolerated = [present] if manifest is None and present else []
    sealed = bool(seals) or verifier is not None or (manifest is not None and manifest.get("sealed") is not False)
    if [t for t in unsealed if t not in tolerated] and (sealed or manifest is None):
        status = report.problems if sealed else report.unverifiable
        status.append(f"{SEALS_FILE}: rounds {[t for t in unsealed if t not in tolerated][:10]} carry no seal")
    if manifest is None:
        if planned is not None and present > planned:
            report.problems.append(f"completeness: rounds.csv holds {present} rounds; run.json planned {planned}")
        elif planned is not None and present == planned:
            report.unverifiable.append(f"completeness: no final manifest ({MANIFEST_FILE}); the run holds all {planned} "
                                       "planned rounds but never committed to its end (killed before writing it, "
                                       "written by an older version, or the manifest was removed)")
        else:
            of = f" of {planned} planned" if planned is not None else ""
            report.unverifiable.append(f"completeness: no final manifest ({MANIFEST_FILE}); the run holds {present} "
                                       f"rounds{of} and is incomplete (killed, or cut short)")
    else:
        _check_manifest(run_dir, report, manifest, present, head, planned, verifier)
    if verifier is not None and len(report.problems) == problems_before:
        report.checks.append(f"signatures of key {verifier.fingerprint[:16]}... verify on {len(by_round)} round seals"
                             + (" and the manifest" if manifest is not None else ""))
    elif verifier is None:
        report.notes.append("no public key given: seals and manifest were checked for consistency only (anyone can "
                            "rewrite them with the tables); --public-key or --expect-head makes a rewrite fail")


def _check_manifest(run_dir: Path, report: AuditReport, manifest: dict, present: int, head: str | None,
                    planned: int | None, verifier: Verifier | None) -> None:
    before = len(report.problems)
    if manifest.get("rounds") != present or manifest.get("complete") is not True:
        report.problems.append(f"{MANIFEST_FILE}: names {manifest.get('rounds')!r} rounds (complete: "
                               f"{manifest.get('complete')!r}); rounds.csv holds {present}")
    if manifest.get("planned_rounds") != present:
        report.problems.append(f"completeness: the run holds {present} rounds; {manifest.get('planned_rounds')!r} "
                               "were planned")
    if planned is not None and manifest.get("planned_rounds") != planned:
        report.problems.append(f"{MANIFEST_FILE}: names {manifest.get('planned_rounds')!r} planned rounds; run.json "
                               f"planned {planned}")
    if manifest.get("head") != head:
        report.problems.append(f"{MANIFEST_FILE}: names another final chain head than rounds.csv")
    listed = manifest["files"]
    for name, digest in sorted(listed.items()):
        if not isinstance(name, str) or not rundir.exists(run_dir, name):
            report.problems.append(f"{MANIFEST_FILE}: lists {str(name)[:80]}, which the run directory lacks")
            continue
        try:
            if sha256_of(run_dir, name) != digest:
                report.problems.append(f"{name}: changed since the manifest was written (its digest differs)")
        except (ValueError, OSError) as error:
            report.problems.append(f"{name}: {error}")
    covered = set(listed)
    for name in (RECORDS_DIR, "checkpoint"):
        try:
            for path in rundir.list_dir(run_dir, name):
                if path.relative_to(run_dir).as_posix() not in covered:
                    report.problems.append(f"{path.relative_to(run_dir).as_posix()}: not in the manifest")
        except ValueError as error:
            report.problems.append(str(error))
    if verifier is not None and (problem := verifier.problem(manifest)) is not None:
        report.problems.append(f"{MANIFEST_FILE}: {problem}")
    if len(report.problems) == before:
        report.checks.append(f"the final manifest: {present} rounds as planned, the chain's head, the digests of "
                             f"{len(listed)} files")


def recompute_run(run_dir: str | os.PathLike, utility: ArraysUtility, ledger: pd.DataFrame, rounds: pd.DataFrame,
                  report: AuditReport, tolerance: float = 1e-9, *, config: dict | None = None,
                  noisy_clients: Collection | None = None, sampled: Callable[[int], Sequence] | None = None,
                  fairness: GroupFairness | None = None) -> None:
    """Check 7 of the module docstring; findings go to ``report``."""
    run_dir = rundir.resolve(run_dir)
    config = {} if config is None else config
    try:
        paths = round_record_paths(run_dir)
    except ValueError as error:
        report.unverifiable.append(f"values: not recomputed, the records cannot be read ({error})")
        return
    committed = [int(r) for r in rounds["round"]]
    saved_noisy = config.get("noisy_clients")
    if noisy_clients is not None and isinstance(saved_noisy, list) and \
            sorted(map(str, saved_noisy)) != sorted(map(str, noisy_clients)):
        report.problems.append(f"run.json: noisy_clients {saved_noisy[:10]} are not the ones the run's settings and "
                               f"seed draw, {sorted(noisy_clients)[:10]}")
    if noisy_clients is None and isinstance(saved_noisy, list):
        noisy_clients = {c for c in config["noisy_clients"] if isinstance(c, (int, str)) and not isinstance(c, bool)}
    if noisy_clients is not None:
        noisy_clients = {str(c) for c in noisy_clients}
    missing = [t for t in committed if t not in paths]
    if missing:
        report.unverifiable.append(f"values: rounds {missing[:10]} have no readable round record, so their books "
                                   "were not recomputed")
    by_round_rows = dict(tuple(ledger.groupby("round"))) if len(ledger) else {}
    round_rows = rounds.set_index("round")
    recomputed_rounds, skipped, worst = 0, [], 0.0
    skipped_by: set[str] = set()
    unfair: list[int] = []  # rounds with fairness books, audited without the fairness objective
    records: dict[int, object] = {}

    def record_of(t: int):
        if t not in records:
            try:
                records[t] = read_round_record(paths[t])
            except ValueError as error:
                records[t] = error
        return records[t]

    for position, t in enumerate(committed):
        if t not in paths:
            continue
        record = record_of(t)
        records.pop(t - 1, None)  # one round (and the next one's start) in memory at a time
        if isinstance(record, ValueError):
            report.unverifiable.append(f"values of round {t}: not recomputed, its record is unreadable ({record})")
            continue
        if record.round != t:
            report.problems.append(f"records: the record of round {t} says it is round {record.round}")
            continue
        if record.meta.get("aggregation") != "weighted-mean":
            skipped.append(t)
            skipped_by.add(str(record.meta.get("strategy", "an unknown strategy"))[:80])
            continue
        if "fairness" in record.meta and fairness is None:
            unfair.append(t)
            continue
        problems = [f"round {t}'s record: {p}" for p in settings_problems(record, config)]
        problems += sample_problems(record, sampled)
        next_start = None
        if position + 1 < len(committed) and committed[position + 1] in paths:
            following = record_of(committed[position + 1])
            next_start = None if isinstance(following, ValueError) else following.start_arrays
        elif position + 1 == len(committed):
            try:
                checkpoint = read_checkpoint(run_dir)
                next_start = checkpoint.arrays if checkpoint.round == t else None
            except ValueError as error:
                report.problems.append(f"checkpoint: {error}")
        noisy = None if noisy_clients is None else _noisy_ids(record, noisy_clients)
        try:
            found, difference = round_problems(record, utility, by_round_rows.get(t, ledger.iloc[:0]),
                                               round_rows.loc[t].to_dict(), tolerance, noisy_clients=noisy,
                                               next_start=next_start, fairness=fairness)
        except (KeyError, TypeError, ValueError, IndexError) as error:
            report.problems.append(f"recompute: round {t}'s record cannot be replayed ({type(error).__name__}: "
                                   f"{error})")
            continue
        problems += found
        report.problems += [f"recompute: {p}" for p in problems]
        if not problems:
            recomputed_rounds += 1
            worst = max(worst, difference)
    if recomputed_rounds:
        report.checks.append(f"recomputed every value of {recomputed_rounds} rounds from the saved arrays "
                             f"(largest difference {worst:.1e})")
    if skipped:
        report.unverifiable.append(
            f"values: rounds {skipped[:10]} aggregate through {', '.join(sorted(skipped_by))}'s own code: their "
            "values were NOT recomputed (the audit recomputes FedAvg-family rounds only)")
    if unfair:
        report.unverifiable.append(
            f"values: rounds {unfair[:10]} booked fairness: they were NOT recomputed without the run's fairness "
            "objective (audit_run(DIR, utility=U, fairness=F))")
    report.notes.append("not recomputable from the files: valuation_seconds, the reasons of failed clients, "
                        "claim-review rows")


def _noisy_ids(record, noisy_clients: set[str]) -> set:
    """The record's client ids (in their own types) that are noisy."""
    ids = [*record.statuses, *record.replies, *record.gradients]
    return {c for c in ids if str(c) in noisy_clients}
