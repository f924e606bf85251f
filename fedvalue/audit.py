"""Third-party checks of a run directory: hash chain, schema, group efficiency.

``audit_run(DIR)`` re-derives, from the files alone,

1. the hash chain: for every round, SHA-256(previous hash, the round's ledger.csv lines
   as written, its rounds.csv line without the hash) equals the recorded hash, the first
   round chaining from SHA-256(run.json) (:mod:`fedvalue.ledger`). A changed, added,
   removed or reordered value anywhere breaks the chain from that round on;
2. the schema: the columns, statuses, rounds in order, finite values for booked rows;
3. group efficiency per round (seed 004, Prop. 4.2): Σ_i φ_t(i) over the round's ADS
   rows equals utility_after − utility_before, to ``tolerance`` × max(1, Σ_i |φ_t(i)|);
4. the Parquet copy equals the CSV.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fedvalue.ledger import (
    CLIENT_STATUSES,
    LEDGER_COLUMNS,
    ROUND_COLUMNS,
    chain_hash,
    genesis_hash,
    read_ledger_csv,
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


def audit_run(run_dir: str | os.PathLike, *, tolerance: float = 1e-6) -> AuditReport:
    """Check a run directory written by :class:`fedvalue.ledger.LedgerWriter` (module docstring)."""
    run_dir = Path(run_dir)
    report = AuditReport(str(run_dir))
    ledger_path, rounds_path = run_dir / "ledger.csv", run_dir / "rounds.csv"
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
    parquet = run_dir / "ledger.parquet"
    if parquet.exists():
        try:
            pd.testing.assert_frame_equal(pd.read_parquet(parquet), ledger, check_dtype=False)
            report.checks.append("ledger.parquet equals ledger.csv")
        except AssertionError:
            report.problems.append("ledger.parquet differs from ledger.csv")
    return report
