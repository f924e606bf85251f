"""Check 7 of the audit (:mod:`fedvalue.audit.verdict`): every recomputable field of every round,
from its saved record.

The run-level loop, in steps: the round records are read one at a time (:class:`RoundRecords`);
a round aggregated by another strategy's own code without a way to replay it, or one that booked
fairness audited without its objective, is left out (:func:`_left_out`); a record that disagrees
with run.json, or books more evaluations than the audit takes on, is not taken on
(:func:`_record_problems`); the rest are replayed and recomputed
(:func:`fedvalue.audit.audit_recompute.round_problems`), and what was and was not recomputed is
summed up at the end (:class:`_Outcome`). The options cross the steps once, as one
:class:`Recompute`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fedvalue.audit.audit_files import Budget, RunFiles
from fedvalue.audit.audit_recompute import (
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
from fedvalue.audit.training_replay import ReplayTally, platform_note
from fedvalue.run.archive import RoundRecord, npz_from_bytes, parse_checkpoint_pointer, round_record_from_bytes
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
    """What recomputing a run's rounds takes (the audit's options, :func:`recompute_run`), made
    once: run.json's ``config``, the most clients a round may hold."""

    utility: ArraysUtility
    tolerance: float
    config: dict
    sampled: Callable[[int], Sequence] | None
    fairness: GroupFairness | None
    example_counts: ExampleCounts | None
    retrain: Retrain | None
    replay: Replay | None

    @property
    def players_cap(self) -> int:
        per_round = self.config.get("clients_per_round")
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

    def summarise(self, report: AuditReport, options: Recompute) -> None:
        """The run-level lines: rounds recomputed, replies retrained, rounds left out and why."""
        if self.recomputed:
            report.checks.append(f"recomputed every value of {self.recomputed} rounds from the saved arrays "
                                 f"(largest difference {self.worst:.1e})"
                                 + (", each reply's weight and arrays from the run's seed"
                                    if options.retrain is not None else ""))
        if self.replays.replies:
            report.checks.append(self.replays.summary())
        if options.retrain is not None:
            report.notes.append(platform_note(options.config.get("platform")))
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


class RoundRecords:
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


def recompute_run(files: RunFiles, utility: ArraysUtility, ledger: pd.DataFrame, rounds: pd.DataFrame,
                  report: AuditReport, tolerance: float = 1e-9, *, config: dict | None = None,
                  sampled: Callable[[int], Sequence] | None = None, fairness: GroupFairness | None = None, example_counts: ExampleCounts | None = None,
                  retrain: Retrain | None = None, replay: Replay | None = None) -> None:
    """Check 7 of :mod:`fedvalue.audit.verdict`'s docstring; findings go to ``report``."""
    config = {} if config is None else config
    options = Recompute(utility, tolerance, config, sampled, fairness, example_counts, retrain, replay)
    committed = [int(r) for r in rounds["round"]]
    records = RoundRecords(files, committed)
    missing = [t for t in committed if t not in records]
    if missing:
        report.unverifiable.append(f"values: rounds {missing[:10]} have no readable round record, so their books "
                                   "were not recomputed")
    by_round_rows = dict(tuple(ledger.groupby("round"))) if len(ledger) else {}
    round_rows = rounds.set_index("round")
    outcome = _Outcome()
    for position, t in enumerate(committed):
        if t not in records:
            continue
        files.budget.check(f"recomputing round {t}")
        record, previous = records.take(t)
        if not _readable(record, t, report) or _left_out(record, t, options, outcome):
            continue
        booked = round_rows.loc[t].to_dict()
        problems = _record_problems(record, t, previous, options, booked, report)
        if problems is None:
            continue
        problems += replay_problems(record, options.example_counts, options.retrain, outcome.replays)
        found = _recomputed(record, t, options, by_round_rows.get(t, ledger.iloc[:0]), booked,
                            records.next_start(position, report), files.budget, report)
        if found is None:
            continue
        problems += found[0]
        report.problems += [f"recompute: {p}" for p in problems]
        if not problems:
            outcome.recomputed += 1
            outcome.worst = max(outcome.worst, found[1])
    outcome.summarise(report, options)


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


def _record_problems(record: RoundRecord, t: int, previous, options: Recompute, booked: dict,
                     report: AuditReport) -> list[str] | None:
    """Where round ``t``'s record disagrees with run.json, the sampler and the previous round
    (empty: none). None when the round is not taken on: too many evaluations (not verifiable),
    or a disagreement (reported: the record's estimator is not taken on)."""
    problems = [f"round {t}'s record: {p}" for p in settings_problems(record, options.config)]
    problems += sample_problems(record, options.sampled)
    problems += reference_problems(record, None if isinstance(previous, ValueError) else previous)
    cap = options.players_cap
    if len(record.statuses) > cap or len(record.replies) > cap:
        problems.append(f"round {t}: its record holds {len(record.statuses)} clients; run.json samples at most "
                        f"{cap} per round")
    evaluations = pd.to_numeric(booked.get("num_evaluations"), errors="coerce")
    if not (evaluations <= MAX_ROUND_EVALUATIONS):
        report.unverifiable.append(f"values of round {t}: not recomputed, it books {evaluations} "
                                   f"evaluations (the audit recomputes at most {MAX_ROUND_EVALUATIONS})")
        return None
    if problems:
        report.problems += [f"recompute: {p}" for p in problems]
        return None
    return problems


def _recomputed(record: RoundRecord, t: int, options: Recompute, rows: pd.DataFrame, booked: dict,
                next_start: Mapping | None, budget: Budget, report: AuditReport) -> tuple[list[str], float] | None:
    """(problems, largest difference) of round ``t``'s books recomputed from its record, with U
    capped at the evaluations the round booked and by the audit's ``budget``; None when it could
    not be (reported)."""
    evaluations = int(pd.to_numeric(booked.get("num_evaluations"), errors="coerce"))
    capped = CappedUtility(options.utility, evaluations + 2 * len(record.replies) + 8, budget)
    try:
        return round_problems(record, capped, rows, booked, options.tolerance, next_start=next_start,
                              fairness=options.fairness, replay=options.replay if record.settings.by_strategy else None)
    except ReplayUnavailable as error:
        report.unverifiable.append(f"values of round {t}: not recomputed, {printable(error)}")
    except CappedUtility.Exceeded as error:
        report.problems.append(f"recompute: round {t}: {error}")
    except (KeyError, TypeError, ValueError, IndexError, ArithmeticError) as error:
        report.problems.append(f"recompute: round {t}'s record cannot be replayed ({type(error).__name__}: "
                               f"{printable(error)})")
    return None
