"""Check 7 of the audit (:mod:`fedvalue.audit.checks`): every recomputable field of every round,
from its saved record.

The run-level loop, in steps: the round records are read one at a time (:class:`SavedRecords`);
a round aggregated by another strategy's own code without a way to replay it, or one that booked
fairness audited without its objective, is left out (:func:`_left_out`); a record that disagrees
with run.json, or books more evaluations than the audit takes on, is not taken on
(:func:`_taken_on`); the rest are replayed and recomputed
(:func:`fedvalue.audit.round.round_problems`), and what was and was not recomputed is
summed up at the end (:class:`_Outcome`). The options cross the steps as one :class:`Recompute`,
made once by :func:`fedvalue.audit.checks.audit_run`; each round's books are read back as typed
rows (:class:`~fedvalue.rounds.booking.BookedRound`) and compared with the recomputed ones.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fedvalue._checks import counted
from fedvalue.audit.audit_files import Budget, RunFiles
from fedvalue.audit.projected_vectors import projection_problems
from fedvalue.audit.round import (
    CappedUtility,
    ReplayedRound,
    ReplayUnavailable,
    replay_problems,
    round_problems,
    sample_problems,
    settings_problems,
)
from fedvalue.audit.references import reference_problems
from fedvalue.audit.report import AuditReport
from fedvalue.audit.rounding_envelope import EnvelopeTally
from fedvalue.audit.training_replay import ReplayTally, platform_note
from fedvalue.rounds.booking import BookedRound
from fedvalue.run.archive import RoundRecord, npz_from_bytes, parse_checkpoint_pointer, round_record_from_bytes
from fedvalue.run.ledger_reader import LedgerTables, ledger_rows_of, round_rows_of
from fedvalue.run.rundir import printable
from fedvalue.schema import CHECKPOINT_FILE, checkpoint_names, record_name
from fedvalue.scoring.fairness.objectives import GroupFairness
from fedvalue.valuation.round_game import ArraysUtility

#: Most clients in a round the recompute takes on when run.json does not say how many.
MAX_PLAYERS = 64
#: Most coalition evaluations of one round the recompute takes on.
MAX_ROUND_EVALUATIONS = 2**20

#: client -> the examples it holds (a simulation's seeded partition).
ExampleCounts = Callable[[Hashable], int]
#: (round, client, A_{t−1}) -> the arrays the client's local training gives.
Retrain = Callable[[int, Hashable, Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
#: record -> Agg_t, the round's aggregation by the run's inner strategy (:func:`strategies.aggregation.reaggregate.replay_aggregator`).
Replay = Callable[[RoundRecord], ReplayedRound]


@dataclass(frozen=True)
class Recompute:
    """What recomputing a run's rounds takes (check 7, :func:`recompute_run`), as the auditor gives
    it: the run's utility U, the tolerance of a recomputed value, and what the caller knows of the
    run besides its files (the options of :func:`fedvalue.audit.checks.audit_run`, which makes it once)."""

    utility: ArraysUtility
    tolerance: float = 1e-9
    sampled: Callable[[int], Sequence] | None = None
    fairness: GroupFairness | None = None
    example_counts: ExampleCounts | None = None
    retrain: Retrain | None = None
    replay: Replay | None = None


def players_cap(config: dict) -> int:
    """The most clients a round's record may hold: run.json's ``clients_per_round``, at most
    :data:`MAX_PLAYERS`."""
    per_round = config.get("clients_per_round")
    if isinstance(per_round, int) and not isinstance(per_round, bool) and 0 < per_round <= MAX_PLAYERS:
        return per_round
    return MAX_PLAYERS


@dataclass
class _Outcome:
    """What the loop over the rounds found, beside the report's per-round findings."""

    recomputed: int = 0
    worst: float = 0.0
    skipped: list[int] = field(default_factory=list)  # aggregated by a strategy's own code, not replayed
    skipped_by: set[str] = field(default_factory=set)
    unfair: list[int] = field(default_factory=list)  # booked fairness, audited without the fairness objective
    replays: ReplayTally = field(default_factory=ReplayTally)
    envelopes: EnvelopeTally = field(default_factory=EnvelopeTally)

    def summarise(self, report: AuditReport, options: Recompute, config: dict) -> None:
        """The run-level lines: rounds recomputed, replies retrained, rounds left out and why."""
        if self.recomputed:
            report.checks.append(f"recomputed every value of {counted(self.recomputed, 'round')} from the saved arrays "
                                 f"(largest difference {self.worst:.1e})"
                                 + (", each reply's weight and arrays from the run's seed"
                                    if options.retrain is not None else ""))
        if self.envelopes.numbers:
            report.checks.append(self.envelopes.summary())
        if self.replays.replies:
            report.checks.append(self.replays.summary())
        report.measured = {**self.replays.measured(), **self.envelopes.measured()}
        if options.retrain is not None:
            report.notes.append(platform_note(config.get("platform")))
        if self.skipped:
            report.unverifiable.append(
                f"values: rounds {self.skipped[:10]} aggregate through {', '.join(sorted(self.skipped_by))}'s own "
                "code: their values were NOT recomputed ("
                + ("rounds that also booked fairness are recomputed for the FedAvg family only)"
                   if options.replay is not None else
                   "the audit was given no way to rebuild that strategy: "
                   "audit_run(DIR, utility=U, replay=strategies.replay_aggregator(build)) replays it)"))
        if self.unfair:
            report.unverifiable.append(
                f"values: rounds {self.unfair[:10]} booked fairness: they were NOT recomputed without the run's "
                "fairness objective (audit_run(DIR, utility=U, fairness=F))")
        report.notes.append("not recomputable from the files: valuation_seconds; and what a record says a client "
                            "reported (its reason, its claim), which only a signature or a published head protects")


class SavedRecords:
    """The run's saved round records, each parsed when first asked for and let go after the round
    that follows it: one round (and the next one's start) in memory at a time. An unreadable
    record is a ``ValueError`` in its place."""

    def __init__(self, files: RunFiles, committed: list[int]) -> None:
        self.files, self.committed = files, committed
        self.names = {t: record_name(t) for t in range(1, len(committed) + 1) if files.exists(record_name(t))}
        self._parsed: dict[int, object] = {}

    def __contains__(self, t: int) -> bool:
        return t in self.names

    def get(self, t: int):
        if t not in self._parsed:
            try:
                self._parsed[t] = round_record_from_bytes(self.files.bytes(self.names[t]), self.names[t])
            except (ValueError, OSError) as error:
                self._parsed[t] = ValueError(printable(error))
            self.files.release(self.names[t])  # parsed: its bytes are not kept
        return self._parsed[t]

    def take(self, t: int) -> tuple[object, object]:
        """(round ``t``'s record, the previous round's, now let go)."""
        record = self.get(t)
        return record, self._parsed.pop(t - 1, None)

    def next_start(self, position: int, report: AuditReport) -> Mapping | None:
        """A_t of the round at ``position`` as the next round's record (or, after the last
        round, the checkpoint) holds it."""
        t = self.committed[position]
        if position + 1 < len(self.committed):
            following = self.committed[position + 1]
            if following not in self.names:
                return None
            record = self.get(following)
            return None if isinstance(record, ValueError) else record.start_arrays
        try:
            # Through the audit's own reads: hashed once, the same bytes the manifest check saw.
            if not self.files.exists(CHECKPOINT_FILE):
                return None
            pointer = parse_checkpoint_pointer(self.files.text(CHECKPOINT_FILE, max_bytes=1 << 20), CHECKPOINT_FILE)
            if pointer[0] != t:
                return None
            name = checkpoint_names(t)[0]
            return npz_from_bytes(self.files.bytes(name), name)[0]
        except (ValueError, OSError, FileNotFoundError) as error:
            report.problems.append(f"checkpoint: {printable(error)}")
            return None


def recompute_run(files: RunFiles, tables: LedgerTables, report: AuditReport, options: Recompute) -> None:
    """Check 7 of :mod:`fedvalue.audit.checks`'s docstring on the run's ``tables`` (run.json
    among them); findings go to ``report``."""
    committed = [int(r) for r in tables.rounds["round"]]
    records = SavedRecords(files, committed)
    missing = [t for t in committed if t not in records]
    if missing:
        report.unverifiable.append(f"values: rounds {missing[:10]} have no readable round record, so their books "
                                   "were not recomputed")
    ledger = tables.ledger
    by_round_rows = dict(tuple(ledger.groupby("round"))) if len(ledger) else {}
    outcome = _Outcome()
    for position, t in enumerate(committed):
        if t not in records:
            continue
        files.budget.check(f"recomputing round {t}")
        record, previous = records.take(t)
        if not _readable(record, t, report) or _left_out(record, t, options, outcome):
            continue
        booked = _booked(t, tables.rounds.iloc[[position]], by_round_rows.get(t, ledger.iloc[:0]), report)
        if booked is None or not _taken_on(record, previous, booked, tables.config, options, report):
            continue
        problems = replay_problems(record, options.example_counts, options.retrain, outcome.replays)
        found = _recomputed(record, booked, records.next_start(position, report), options, files.budget, report,
                            outcome.envelopes)
        if found is None:
            continue
        problems += found[0]
        report.problems += [f"recompute: {p}" for p in problems]
        if not problems:
            outcome.recomputed += 1
            outcome.worst = max(outcome.worst, found[1])
    outcome.summarise(report, options, tables.config)


def _booked(t: int, round_row: pd.DataFrame, ledger_rows: pd.DataFrame, report: AuditReport) -> BookedRound | None:
    """Round ``t``'s rows as the run booked them, typed (:mod:`fedvalue.run.ledger_reader`); None
    when a cell is not what its column holds (reported)."""
    try:
        return BookedRound(round_rows_of(round_row)[0], ledger_rows_of(ledger_rows))
    except ValueError as error:
        report.problems.append(f"recompute: round {t}'s books are not typed rows ({printable(error)})")
        return None


def _readable(record, t: int, report: AuditReport) -> bool:
    """Whether round ``t``'s record was read and says it is round ``t`` (else a finding)."""
    if isinstance(record, ValueError):
        report.unverifiable.append(f"values of round {t}: not recomputed, its record is unreadable ({record})")
        return False
    if record.round != t:
        report.problems.append(f"records: the record of round {t} says it is round {record.round}")
        return False
    return True


def _left_out(record: RoundRecord, t: int, options: Recompute, outcome: _Outcome) -> bool:
    """Whether round ``t`` cannot be recomputed with what the audit was given: aggregated by a
    strategy's own code without a replay (or with fairness), or fairness without its objective."""
    settings = record.settings
    if settings.by_strategy and (options.replay is None or settings.fairness is not None):
        outcome.skipped.append(t)
        outcome.skipped_by.add(printable(settings.strategy or "an unknown strategy", 80))
        return True
    if settings.fairness is not None and options.fairness is None:
        outcome.unfair.append(t)
        return True
    return False


def _taken_on(record: RoundRecord, previous, booked: BookedRound, config: dict, options: Recompute,
              report: AuditReport) -> bool:
    """Whether the audit recomputes the record's round: not when the record disagrees with
    run.json, the sampler or the previous round (reported: the record's estimator is not taken
    on), nor when the round books more evaluations than the audit takes on (not verifiable)."""
    t = record.round
    problems = [f"round {t}'s record: {p}" for p in settings_problems(record, config)]
    problems += sample_problems(record, options.sampled)
    problems += reference_problems(record, None if isinstance(previous, ValueError) else previous)
    problems += projection_problems(record, options.tolerance)
    cap = players_cap(config)
    if len(record.statuses) > cap or len(record.replies) > cap:
        problems.append(f"round {t}: its record holds {len(record.statuses)} clients; run.json samples at most "
                        f"{cap} per round")
    evaluations = booked.round_row.num_evaluations
    if evaluations > MAX_ROUND_EVALUATIONS:
        report.unverifiable.append(f"values of round {t}: not recomputed, it books {evaluations} "
                                   f"evaluations (the audit recomputes at most {MAX_ROUND_EVALUATIONS})")
        return False
    report.problems += [f"recompute: {p}" for p in problems]
    return not problems


def _recomputed(record: RoundRecord, booked: BookedRound, next_start: Mapping | None, options: Recompute,
                budget: Budget, report: AuditReport, envelopes: EnvelopeTally) -> tuple[list[str], float] | None:
    """(problems, largest difference) of the record's round recomputed and compared with its
    ``booked`` rows, with U capped at the evaluations the round booked and by the audit's
    ``budget``; None when it could not be (reported). ``envelopes`` counts the numbers that
    passed only within float32 rounding of U (:mod:`fedvalue.audit.rounding_envelope`)."""
    t = record.round
    capped = CappedUtility(options.utility, booked.round_row.num_evaluations + 2 * len(record.replies) + 8, budget)
    try:
        return round_problems(record, capped, booked, options.tolerance, next_start=next_start,
                              fairness=options.fairness, replay=options.replay if record.settings.by_strategy else None,
                              envelopes=envelopes)
    except ReplayUnavailable as error:
        report.unverifiable.append(f"values of round {t}: not recomputed, {printable(error)}")
    except CappedUtility.Exceeded as error:
        report.problems.append(f"recompute: round {t}: {error}")
    except (KeyError, TypeError, ValueError, IndexError, ArithmeticError) as error:
        report.problems.append(f"recompute: round {t}'s record cannot be replayed ({type(error).__name__}: "
                               f"{printable(error)})")
    return None
