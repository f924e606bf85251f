"""Third-party checks of a run directory: hash chain, schema, group efficiency.

``audit_run(DIR)`` re-derives, from the files alone,

1. the hash chain: for every round, SHA-256(previous hash, the round's ledger.csv lines
   as written, its rounds.csv line without the hash) equals the recorded hash, the first
   round chaining from SHA-256(run.json) (:mod:`fedvalue.ledger`). A changed, added,
   removed or reordered value anywhere breaks the chain from that round on;
2. the schema: the columns, statuses, rounds in order, finite values for booked rows;
3. group efficiency per round ([ADS], Prop. 4.2): Σ_i φ_t(i) over the round's ADS
   rows equals utility_after − utility_before, to ``tolerance`` × max(1, Σ_i |φ_t(i)|);
4. the Parquet copy equals the CSV;
5. with a ``utility`` and the run's round records (:mod:`fedvalue.archive`), every number
   recomputed from the saved arrays: for the FedAvg family the round game is rebuilt from
   A_{t−1}, the replies and their weights, and ADS, LOO (same method, seed and settings),
   v_t(∅), v_t(I_t), U(A_t) (A_t = the weighted mean of the accepted replies, which must
   also equal the next round's recorded start state), the harm booked for rejected
   replies, the top-k ``selected`` marks and the TracIn flows (from the saved inference
   gradients) must equal the ledger's. Rounds aggregated by another strategy are checked
   by 1–3 only (their aggregation needs the strategy's own code and state). With the run's
   ``fairness`` objective, the fairness books too (:mod:`fedvalue.fair_books`): ads_fairness,
   loo_fairness, fairness_influence, the clients a drop-K or I-JACK rule accepts and the
   I-JACK factors (re-derived from the recomputed influences and the recorded rule; A_t is
   then the mean weighted by n_u w_u), and group efficiency of ads_fairness.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fedvalue.ads import AdsSettings
from fedvalue.archive import read_checkpoint, read_round_record, round_record_paths
from fedvalue.books import ClientEntry, book_round
from fedvalue.fair_books import FairnessBooks, fairness_round, policy_outcome
from fedvalue.fairness import GroupFairness
from fedvalue.ledger import chain_hash, genesis_hash, read_ledger_csv
from fedvalue.rounds import ArraysUtility, fedavg_round_game, round_rng, value_round, weighted_mean
from fedvalue.schema import (
    CLIENT_STATUSES,
    LEDGER_COLUMNS,
    LEDGER_FILE,
    LEDGER_PARQUET_FILE,
    ROUND_COLUMNS,
    ROUNDS_FILE,
    STATUS_OK,
    STATUS_REJECTED,
)


@dataclass
class AuditReport:
    """What an audit found: ``problems`` is empty for an intact run."""

    run_dir: str
    rounds: int = 0
    ledger_rows: int = 0
    problems: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _lines(path: Path) -> tuple[str, list[str]]:
    with open(path, encoding="utf-8", newline="") as handle:
        lines = handle.readlines()
    return (lines[0].rstrip("\n") if lines else ""), lines[1:]


def audit_run(run_dir: str | os.PathLike, *, tolerance: float = 1e-6, utility: ArraysUtility | None = None,
              recompute_tolerance: float = 1e-9, fairness: GroupFairness | None = None) -> AuditReport:
    """Check a run directory written by :class:`fedvalue.ledger.LedgerWriter` (module docstring).

    Parameters
    ----------
    run_dir
        The run directory.
    tolerance
        Allowed group-efficiency gap, relative to max(1, Σ_i |φ_t(i)|).
    utility
        The run's utility U (the same held-out data and model); with it, and when the run
        saved round records, every value is recomputed (check 5).
    recompute_tolerance
        Allowed |recomputed − booked| relative to max(1, |booked|); the same code on the same
        arrays reproduces the values exactly, so any larger difference is a changed number.
    fairness
        The run's fairness objective (same held-out data, sensitive attribute and gap), for
        runs that booked fairness; without it their rounds are not recomputed.
    """
    run_dir = Path(run_dir)
    report = AuditReport(str(run_dir))
    ledger_path, rounds_path = run_dir / LEDGER_FILE, run_dir / ROUNDS_FILE
    if not ledger_path.exists() and not rounds_path.exists():
        raise FileNotFoundError(
            f"run_dir: expected a fedvalue run directory holding ledger.csv and rounds.csv; {run_dir} has neither."
        )
    for path in (ledger_path, rounds_path):
        if not path.exists():
            report.problems.append(f"{path.name}: missing from {run_dir}")
    if report.problems:
        return report

    ledger_header, ledger_lines = _lines(ledger_path)
    rounds_header, round_lines = _lines(rounds_path)
    if ledger_header.split(",") != list(LEDGER_COLUMNS):
        report.problems.append(f"ledger.csv: columns {ledger_header.split(',')}, expected {list(LEDGER_COLUMNS)}")
    if rounds_header.split(",") != list(ROUND_COLUMNS):
        report.problems.append(f"rounds.csv: columns {rounds_header.split(',')}, expected {list(ROUND_COLUMNS)}")
    if report.problems:
        return report
    report.rounds, report.ledger_rows = len(round_lines), len(ledger_lines)

    # 1. The chain, from the raw bytes: ledger lines grouped by their round (written contiguously).
    by_round: dict[str, list[str]] = {}
    order: list[str] = []
    for line in ledger_lines:
        key = line.split(",", 1)[0]
        if key not in by_round:
            by_round[key] = []
            order.append(key)
        elif order[-1] != key:
            report.problems.append(f"ledger.csv: rows of round {key} are not contiguous")
        by_round[key].append(line)
    previous = genesis_hash(run_dir)
    broken = None
    for line in round_lines:
        body, _, recorded = line.rstrip("\n").rpartition(",")
        round_key = body.split(",", 1)[0]
        expected = chain_hash(previous, by_round.get(round_key, []), body + "\n")
        if expected != recorded and broken is None:
            broken = round_key
            report.problems.append(
                f"hash chain: round {round_key} does not match its recorded hash (its ledger rows, its rounds.csv "
                "row, an earlier round or run.json was changed)"
            )
        previous = recorded
    extra = [k for k in order if k not in {ln.split(",", 1)[0] for ln in round_lines}]
    if extra:
        report.problems.append(f"ledger.csv: rows for rounds {extra} that rounds.csv never committed")
    if broken is None:
        report.checks.append(f"hash chain intact over {len(round_lines)} rounds")

    # 2. Schema and values.
    try:
        ledger = read_ledger_csv(ledger_path)
        rounds = pd.read_csv(rounds_path, dtype={"clients": str, "ads_method": str, "hash": str},
                             keep_default_na=False, na_values={"efficiency_gap": [""], "utility_after": [""]})
    except (ValueError, pd.errors.ParserError) as error:
        report.problems.append(f"schema: the tables do not parse ({error})")
        return report
    bad_status = sorted(set(ledger["status"]) - set(CLIENT_STATUSES))
    if bad_status:
        report.problems.append(f"ledger.csv: unknown statuses {bad_status}")
    booked = ledger[ledger["status"].isin(["ok", "idle"])]
    values = pd.to_numeric(booked["value"], errors="coerce")
    if not values.map(lambda v: isinstance(v, float) and math.isfinite(v)).all():
        report.problems.append("ledger.csv: a booked row has a missing or non-finite value")
    if list(rounds["round"]) != list(range(1, len(rounds) + 1)):
        report.problems.append(f"rounds.csv: rounds {list(rounds['round'])}, expected 1..{len(rounds)}")
    if not report.problems:
        report.checks.append(f"schema and values of {len(ledger)} ledger rows")

    # 3. Group efficiency of ADS per round.
    ads = ledger[(ledger["method"] == "ads") & (ledger["status"] == "ok")]
    if not ads.empty:
        numbers = pd.to_numeric(ads["value"], errors="coerce")
        sums = numbers.groupby(ads["round"]).sum()
        scale = numbers.abs().groupby(ads["round"]).sum().clip(lower=1.0)  # float sums err relative to size
        gains = rounds.set_index("round")["utility_after"] - rounds.set_index("round")["utility_before"]
        gaps = (sums - gains.reindex(sums.index)).abs() / scale
        worst = gaps.max()
        if not worst <= tolerance:
            report.problems.append(
                f"group efficiency: Σ ADS − (utility_after − utility_before) is {worst:.3g} in round "
                f"{int(gaps.idxmax())} (tolerance {tolerance:g})"
            )
        else:
            report.checks.append(f"group efficiency in {len(sums)} rounds (max gap {worst:.1e})")

    # 4. Parquet mirrors the CSV.
    parquet = run_dir / LEDGER_PARQUET_FILE
    if parquet.exists():
        _check_parquet(pd.read_parquet(parquet), ledger, report)

    # 5. Recompute from the saved arrays.
    if utility is not None:
        recompute_run(run_dir, utility, ledger, rounds, report, recompute_tolerance, fairness=fairness)
    return report


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
    except AssertionError:
        report.problems.append("ledger.parquet differs from ledger.csv")
        return
    if lagging:
        last = int(ledger["round"].iloc[-1]) if len(ledger) else 0
        report.checks.append(f"ledger.parquet equals ledger.csv up to round {last} (the run stopped before "
                             "mirroring the rounds after it; a resume rewrites the copy)")
    else:
        report.checks.append("ledger.parquet equals ledger.csv")


def _close(booked: float | None, recomputed: float | None, tolerance: float) -> bool:
    if booked is None or recomputed is None or (isinstance(booked, float) and math.isnan(booked)):
        return (booked is None or (isinstance(booked, float) and math.isnan(booked))) and recomputed is None
    return abs(float(booked) - float(recomputed)) <= tolerance * max(1.0, abs(float(booked)))


def recompute_run(run_dir: str | os.PathLike, utility: ArraysUtility, ledger: pd.DataFrame, rounds: pd.DataFrame,
                  report: AuditReport, tolerance: float = 1e-9, *, fairness: GroupFairness | None = None) -> None:
    """Check 5 of the module docstring; findings go to ``report``."""
    run_dir = Path(run_dir)
    paths = round_record_paths(run_dir)
    committed = [int(r) for r in rounds["round"]]
    if not paths:
        report.checks.append("no round records saved: values not recomputed")
        return
    missing = [t for t in committed if t not in paths]
    if missing:
        report.problems.append(f"records: rounds {missing} have no round record")
    round_rows = rounds.set_index("round")
    booked_values = ledger.set_index(["round", "method", "client_id"])["value"]
    recomputed_rounds, skipped, worst = 0, [], 0.0
    skipped_by: set[str] = set()
    unfair: list[int] = []  # rounds with fairness books, audited without the fairness objective
    following = None  # the next round's record: read once, for its start state and then its own round
    for position, t in enumerate(committed):
        if t not in paths:
            continue
        record = following if following is not None and following.round == t else read_round_record(paths[t])
        following = None
        if record.meta.get("aggregation") != "weighted-mean":
            skipped.append(t)
            skipped_by.add(str(record.meta.get("strategy", "an unknown strategy")))
            continue
        if "fairness" in record.meta and fairness is None:
            unfair.append(t)
            continue
        next_start = None
        if position + 1 < len(committed) and committed[position + 1] in paths:
            following = read_round_record(paths[committed[position + 1]])
            next_start = following.start_arrays
        elif position + 1 == len(committed):
            checkpoint = read_checkpoint(run_dir)
            next_start = checkpoint.arrays if checkpoint.round == t else None
        expected = _recompute_round(record, utility, fairness)
        problems_before = len(report.problems)
        report.problems += [f"recompute: round {t} {problem}" for problem in expected["problems"]]
        for key, value in expected["values"].items():
            booked = booked_values.get((t, key[0], str(key[1])))
            booked = None if booked is None or pd.isna(booked) else float(booked)
            if not _close(booked, value, tolerance):
                report.problems.append(
                    f"recompute: round {t} {key[0]} of client {key[1]} is booked {booked!r}; the saved arrays give "
                    f"{value!r}")
            elif booked is not None and value is not None:
                worst = max(worst, abs(booked - value))
        row = round_rows.loc[t]
        for column, value in expected["round"].items():
            booked = None if pd.isna(row[column]) else float(row[column])
            if not _close(booked, value, tolerance):
                report.problems.append(f"recompute: round {t} {column} is booked {booked!r}; the saved arrays give "
                                       f"{value!r}")
        if expected["realized"] is not None and next_start is not None and not all(
            np.array_equal(expected["realized"][k], next_start[k]) for k in next_start
        ):
            report.problems.append(f"recompute: the state after round {t} is not the weighted mean of its accepted "
                                   "replies (the next round started elsewhere)")
        if len(report.problems) == problems_before:
            recomputed_rounds += 1
    if recomputed_rounds:
        report.checks.append(f"recomputed every value of {recomputed_rounds} rounds from the saved arrays "
                             f"(largest difference {worst:.1e})")
    if skipped:
        report.checks.append(
            f"rounds {skipped} aggregate through {', '.join(sorted(skipped_by))}'s own code: their values were NOT "
            "recomputed (the audit recomputes FedAvg-family rounds only); the checks above hold for them")
    if unfair:
        report.checks.append(
            f"rounds {unfair} booked fairness: their values were NOT recomputed without the run's fairness objective "
            "(audit_run(..., fairness=...)); the checks above hold for them")


def _recompute_round(record, utility: ArraysUtility, fairness: GroupFairness | None = None) -> dict:
    """The books of one FedAvg-family round rebuilt from its record alone, by the writer's own
    :func:`fedvalue.books.book_round` (the audit computes no ledger value itself)."""
    statuses, meta = record.statuses, record.meta
    ok = [c for c in record.replies if statuses.get(c) == STATUS_OK]
    accepted = [c for c in ok if c in set(record.accepted)]
    valuation = None
    settings = AdsSettings(**meta["valuation"])
    if ok:
        game = fedavg_round_game(ok, record.start_arrays, [record.replies[c] for c in ok],
                                 [record.weights[c] for c in ok], utility)
        valuation = value_round(game, meta["methods"], settings, seed=round_rng(meta["seed"], record.round))
    problems: list[str] = []
    fair, factors = None, {}
    if "fairness" in meta and fairness is not None:
        fair = fairness_round(fairness, ok, record.start_arrays, [record.replies[c] for c in ok],
                              [record.weights[c] for c in ok], methods=meta["methods"], settings=settings,
                              seed=round_rng(meta["seed"], record.round))
        rule = meta["fairness"].get("rule")
        if rule and ok:
            chosen, rule_factors = policy_outcome(rule, fair.influences)
            if chosen != set(accepted):
                problems.append(f"the {rule['rule']} rule accepts {sorted(chosen, key=str)} from the recomputed "
                                f"fairness influences; the record accepted {sorted(accepted, key=str)}")
            if rule_factors is not None:
                factors = rule_factors
                fair = FairnessBooks(fair.valuation, fair.influences, fair.utility, factors)
        if fair.valuation is not None and "ads" in fair.valuation.results:
            gap = float(fair.valuation.results["ads"].values.sum()) - (
                fair.valuation.utility_after - fair.valuation.utility_before)
            if not abs(gap) <= 1e-9 * max(1.0, float(np.abs(fair.valuation.results["ads"].values).sum())):
                problems.append(f"ads_fairness breaks group efficiency by {gap:.3g}")
    rejected = [c for c in record.replies if statuses.get(c) == STATUS_REJECTED]
    # Replies with NaN/inf reach the inner strategy only when the run was told to pass them through.
    aggregated = accepted + ([] if meta.get("reject_non_finite", True) else rejected)
    realized = None
    if aggregated:
        with np.errstate(all="ignore"):
            realized = weighted_mean([record.replies[c] for c in aggregated],
                                     [record.weights[c] * factors[c] if c in factors else record.weights[c]
                                      for c in aggregated])
    # Replies in reply order (the order their sums were taken in), then the clients without one.
    entries = [ClientEntry(c, statuses[c], record.weights.get(c)) for c in record.replies if c in statuses]
    entries += [ClientEntry(c, status) for c, status in statuses.items() if c not in record.replies]
    books = book_round(record.round, entries, valuation, methods=meta["methods"], start_arrays=record.start_arrays,
                       replies=record.replies, accepted=accepted, realized=realized, utility=utility,
                       gradients=record.gradients if meta.get("flows") else None,
                       book_selection=bool(meta.get("selection")), fairness=fair)
    values = {(row["method"], row["client_id"]): row["value"] for row in books.ledger_rows}
    columns = ("utility_before", "utility_after", "utility_realized") if ok else ("utility_before", "utility_realized")
    return {"values": values, "round": {c: books.round_row[c] for c in columns}, "realized": realized,
            "problems": problems}
