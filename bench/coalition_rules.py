"""How well each coalition rule's within-round values find a run's bad clients, recomputed from its round records.

For every valued run directory under the given folders (a cell of ``fedvalue run noisy-federation``, or any run
whose ledger joins its ground truth into the ``noisy`` column), every saved round record is valued again by exact
ADS and LOO under both coalition rules of :mod:`fedvalue.valuation.round_game` (``renormalized``, the one the run
booked, and ``fixed-weight``), with the run's own utility rebuilt as the audit rebuilds it. Printed and written
to CSV, per run and rule: the ROC AUC of "lower value = bad client" per round (mean over the rounds that sampled
both kinds) and over the run's totals Φ_i, and the share of the bad clients' rounds in which they were valued
above zero.

    python -m bench.coalition_rules RUN_ROOT [RUN_ROOT ...] --out docs/results/coalition_rules.csv

The renormalized values are the run's own booked values, recomputed (checked here to the audit's tolerance); the
fixed-weight ones are what the same rounds would have booked under that rule (the trajectory is the run's).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench import results_header
from fedvalue.analysis.run_summary import load_run
from fedvalue.rounds.record_game import value_record
from fedvalue.run.archive import read_round_record, round_record_paths
from fedvalue.schema import Status
from fedvalue.valuation.round_game import round_rng
from fedvalue.valuation.settings import COALITION_RULES, FIXED_WEIGHT, RENORMALIZED, AdsSettings
from simulations.cli.audit import _audit_context

EXACT = AdsSettings(method="exact")
TOLERANCE = 1e-6


def roc_auc(scores: dict, bad: set) -> float | None:
    """P(score of a bad client < score of a good one) + ½ P(tie): the AUC of "lower = bad"; None without both kinds."""
    low = [s for c, s in scores.items() if c in bad]
    high = [s for c, s in scores.items() if c not in bad]
    if not low or not high:
        return None
    low, high = np.asarray(low)[:, None], np.asarray(high)[None, :]
    return float(np.mean((low < high) + 0.5 * (low == high)))


def valued_runs(roots: list[Path]) -> list[Path]:
    """Every run directory under ``roots`` that saved round records."""
    return sorted({p.parent.parent for root in roots for p in root.rglob("records/round-*.npz")})


def run_rules(run_dir: Path) -> list[dict]:
    """One row per coalition rule: the run's detection measures under it."""
    _, context, why_not = _audit_context(str(run_dir))
    utility = context.get("utility")
    if utility is None:
        raise SystemExit(f"{run_dir}: no utility to recompute with ({why_not})")
    ledger = load_run(run_dir).ledger
    bad = {str(c) for c in ledger.loc[ledger["noisy"] == True, "client_id"].unique()}  # noqa: E712 (a column)
    booked = {(int(r.round), str(r.client_id), r.method): r.value for r in ledger.itertuples() if r.status == Status.OK}
    rows = []
    for rule in COALITION_RULES:
        per_round, totals, positive = [], defaultdict(float), []
        for t, path in round_record_paths(run_dir).items():
            record = read_round_record(path)
            record = dataclasses.replace(record, settings=dataclasses.replace(
                record.settings, coalition_rule=rule, valuation=EXACT, methods=("ads", "loo")))
            if not record.replies:
                continue
            values = value_record(record, utility, round_rng(record.settings.seed, t)).results["ads"].values
            scores = {str(c): float(v) for c, v in values.items()}
            if rule == RENORMALIZED:  # the run's own books, recomputed
                for c, v in scores.items():
                    want = booked.get((t, c, "ads"))
                    if want is not None and abs(want - v) > TOLERANCE * max(1.0, abs(want)):
                        print(f"  {run_dir} round {t} client {c}: recomputed {v!r}, booked {want!r} "
                              "(the run's estimator was not exact)", file=sys.stderr)
            if (auc := roc_auc(scores, bad)) is not None:
                per_round.append(auc)
            for c, v in scores.items():
                totals[c] += v
                if c in bad:
                    positive.append(v > 0)
        rows.append({"run": str(run_dir), "rule": rule, "rounds": len(per_round),
                     "auc_per_round": float(np.mean(per_round)) if per_round else None,
                     "auc_total": roc_auc(dict(totals), bad),
                     "bad_valued_above_zero": float(np.mean(positive)) if positive else None})
    return rows


def paired_interval(rows: list[dict], measure: str) -> tuple[float, float, float, int] | None:
    """(mean, 95% t-interval low and high, runs) of the paired difference fixed-weight − renormalized in
    ``measure`` over the runs; None below two paired runs."""
    from scipy import stats

    by_run = defaultdict(dict)
    for row in rows:
        by_run[row["run"]][row["rule"]] = row[measure]
    diffs = [r[FIXED_WEIGHT] - r[RENORMALIZED] for r in by_run.values()
             if r.get(FIXED_WEIGHT) is not None and r.get(RENORMALIZED) is not None]
    if len(diffs) < 2:
        return None
    mean, half = float(np.mean(diffs)), float(stats.t.ppf(0.975, len(diffs) - 1) * stats.sem(diffs))
    return mean, mean - half, mean + half, len(diffs)


def summary_rows(rows: list[dict]) -> list[dict]:
    """Each rule's means over the runs, and the paired differences with their intervals."""
    found = []
    for rule in COALITION_RULES:
        mine = [r for r in rows if r["rule"] == rule and r["auc_per_round"] is not None]
        found.append({"run": "mean over runs", "rule": rule, "rounds": len(mine),
                      **{m: float(np.mean([r[m] for r in mine if r[m] is not None]))
                         for m in ("auc_per_round", "auc_total", "bad_valued_above_zero")}})
    for measure in ("auc_per_round", "auc_total"):
        interval = paired_interval(rows, measure)
        if interval is not None:
            mean, low, high, runs = interval
            found.append({"run": f"paired {FIXED_WEIGHT} - {RENORMALIZED}", "rule": measure, "rounds": runs,
                          measure: mean, "low": low, "high": high})
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("roots", nargs="+", type=Path, help="folders holding valued run directories")
    parser.add_argument("--out", type=Path, help="CSV of the rows (with the command and commit as a comment)")
    args = parser.parse_args(argv)
    rows = [row for run_dir in valued_runs(args.roots) for row in run_rules(run_dir)]
    rows += summary_rows(rows)
    columns = ["run", "rule", "rounds", "auc_per_round", "auc_total", "bad_valued_above_zero", "low", "high"]
    for row in rows:
        shown = {k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in row.items()}
        print("  ".join(f"{k}={v}" for k, v in shown.items()))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as handle:
            handle.write(results_header(f"python -m bench.coalition_rules {' '.join(map(str, args.roots))}"))
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
