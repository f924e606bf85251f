"""How the first- and second-order expansions of the round game agree with exact ADS, and what each costs, on saved rounds.

For every run directory under the given folders whose round records a FedAvg-family strategy aggregated (a cell of
``fedvalue run noisy-federation``, say), every saved round is valued again, under both coalition rules of
:mod:`fedvalue.valuation.round_game`, by exact ADS, by MC-ADS with a budget of 100 coalition evaluations (the round's
generator, as a run books it) and by the two expansion methods (``AdsSettings(method="first-order")`` and
``"second-order"``, :mod:`fedvalue.valuation.taylor`), with the run's own utility rebuilt as the audit rebuilds it
(it must be differentiable: ``neg_loss``). Each estimator is timed side by side in this one process (the
valuation's own ``seconds``, what rounds.csv books as ``valuation_seconds``). Per round and rule: the Spearman
correlation of each estimate with exact ADS, the ROC AUC of "lower value = bad client" of each (the run's
``noisy_clients`` are the bad ones), the expansions' efficiency gaps against v(I_t) − v(∅) (their remainders), and
the seconds; then each rule's summary over the rounds.

    python -m bench.taylor_agreement RUN_ROOT [RUN_ROOT ...] --out docs/results/taylor_agreement.csv

Nothing is written under the run roots.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
from scipy import stats

from bench import results_header
from bench.coalition_rules import roc_auc, valued_runs
from fedvalue.rounds.record_game import value_record
from fedvalue.run.archive import read_round_record, round_record_paths
from fedvalue.valuation.round_game import round_rng
from fedvalue.valuation.settings import COALITION_RULES, AdsSettings
from simulations.cli.audit import _audit_context

ESTIMATORS = {
    "exact": AdsSettings(method="exact"),
    "mc100": AdsSettings(method="mc", budget=100),
    "first": AdsSettings(method="first-order"),
    "second": AdsSettings(method="second-order"),
}
COMPARED = ("first", "second", "mc100")
COLUMNS = ["run", "regime", "round", "rule", "n", "bad", "gain",
           *[f"spearman_{e}" for e in COMPARED], *[f"auc_{e}" for e in ESTIMATORS],
           *[f"seconds_{e}" for e in ESTIMATORS], "gap_first", "gap_second"]


def spearman(values: np.ndarray, exact: np.ndarray) -> float | None:
    """Spearman's ρ of ``values`` against ``exact``; None when either is constant."""
    if np.ptp(values) == 0 or np.ptp(exact) == 0:
        return None
    return float(stats.spearmanr(values, exact).statistic)


def regime_of(config: dict) -> str:
    """The run's bad clients in words, from its run.json: ``clean``, ``label flips p=… on …%`` and/or ``free-rider …%``."""
    if config.get("clean") or not config.get("noisy_clients"):
        return "clean"
    parts = []
    if config.get("noisy_fraction"):
        parts.append(f"label flips p={config.get('flip_probability')} on {config['noisy_fraction']:.0%}")
    if config.get("extra_bad_kind") not in (None, "none") and config.get("extra_bad_fraction"):
        parts.append(f"{config['extra_bad_kind']} {config['extra_bad_fraction']:.0%}")
    return " + ".join(parts) or "bad clients"


def round_rows(run_dir: Path, utility, bad: set, regime: str) -> list[dict]:
    """One row per (round, rule) of ``run_dir``: each estimator's agreement with exact ADS, AUC and seconds."""
    rows = []
    for t, path in round_record_paths(run_dir).items():
        record = read_round_record(path)
        if not record.replies or record.settings.by_strategy:
            continue
        for rule in COALITION_RULES:
            found = {}
            for name, settings in ESTIMATORS.items():
                changed = dataclasses.replace(record, settings=dataclasses.replace(
                    record.settings, coalition_rule=rule, valuation=settings, methods=("ads",)))
                valuation = value_record(changed, utility, round_rng(record.settings.seed, t))
                found[name] = valuation
            exact = found["exact"].results["ads"].values
            clients = [str(c) for c in exact.index]
            row = {"run": str(run_dir), "regime": regime, "round": t, "rule": rule, "n": len(clients),
                   "bad": sum(c in bad for c in clients),
                   "gain": found["exact"].utility_after - found["exact"].utility_before}
            for name, valuation in found.items():
                values = valuation.results["ads"].values.reindex(exact.index).to_numpy()
                if name in COMPARED:
                    row[f"spearman_{name}"] = spearman(values, exact.to_numpy())
                row[f"auc_{name}"] = roc_auc(dict(zip(clients, values)), bad)
                row[f"seconds_{name}"] = valuation.seconds
            for name in ("first", "second"):
                row[f"gap_{name}"] = found[name].results["ads"].efficiency_gaps.iloc[0]
            rows.append(row)
    return rows


def run_rows(run_dir: Path) -> list[dict]:
    """The rows of one run (its utility rebuilt; a warm-up valuation of its first round first, not timed)."""
    _, context, why_not = _audit_context(str(run_dir))
    utility = context.get("utility")
    if utility is None or not getattr(utility, "differentiable", False):
        print(f"{run_dir}: skipped, no differentiable utility to recompute with ({why_not})")
        return []
    config = json.loads((run_dir / "run.json").read_text())
    bad = {str(c) for c in config.get("noisy_clients", [])}
    first = read_round_record(next(iter(round_record_paths(run_dir).values())))
    if first.replies and not first.settings.by_strategy:
        value_record(dataclasses.replace(first, settings=dataclasses.replace(
            first.settings, valuation=ESTIMATORS["second"], methods=("ads",))), utility, round_rng(0, 0))
    return round_rows(run_dir, utility, bad, regime_of(config))


def _mean(values) -> float | None:
    kept = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(kept)) if kept else None


def summary_rows(rows: list[dict]) -> list[dict]:
    """Per rule, over every round and over each regime's rounds: mean Spearman and AUC of each estimator, the
    share of rounds with ρ ≥ 0.9 and the 10th percentile of ρ, the median seconds, and the median |gap| / |gain|
    of the expansions (their remainder relative to the round's gain)."""
    found = []
    for regime in ["all", *sorted({r["regime"] for r in rows})]:
        for rule in COALITION_RULES:
            mine = [r for r in rows if r["rule"] == rule and regime in ("all", r["regime"])]
            if mine:
                found += _summaries(mine, regime, rule)
    return found


def _summaries(mine: list[dict], regime: str, rule: str) -> list[dict]:
    """The three summary rows of one (regime, rule)'s rounds ``mine`` (:func:`summary_rows`)."""
    summary = {"run": "mean over rounds", "regime": regime, "round": len(mine), "rule": rule,
               "n": _mean([r["n"] for r in mine]), "bad": _mean([r["bad"] for r in mine])}
    share = {"run": "share of rounds with spearman >= 0.9", "regime": regime, "round": len(mine), "rule": rule}
    low = {"run": "10th percentile over rounds", "regime": regime, "round": len(mine), "rule": rule}
    for name in COMPARED:
        kept = [r[f"spearman_{name}"] for r in mine if r[f"spearman_{name}"] is not None]
        summary[f"spearman_{name}"] = _mean(kept)
        share[f"spearman_{name}"] = float(np.mean([v >= 0.9 for v in kept])) if kept else None
        low[f"spearman_{name}"] = float(np.percentile(kept, 10)) if kept else None
    for name in ESTIMATORS:
        summary[f"auc_{name}"] = _mean([r[f"auc_{name}"] for r in mine])
        summary[f"seconds_{name}"] = float(np.median([r[f"seconds_{name}"] for r in mine]))
    for name in ("first", "second"):
        summary[f"gap_{name}"] = float(np.median([abs(r[f"gap_{name}"]) / max(abs(r["gain"]), 1e-12) for r in mine]))
    return [summary, share, low]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("roots", nargs="+", type=Path, help="folders holding valued run directories")
    parser.add_argument("--out", type=Path, help="CSV of the rows (with the command and commit as a comment)")
    args = parser.parse_args(argv)
    rows = []
    for run_dir in valued_runs(args.roots):
        found = run_rows(run_dir)
        rows += found
        print(f"{run_dir}: {len(found)} round valuations")
    rows += summary_rows(rows)
    for row in [r for r in rows if r["run"] == "mean over rounds"]:
        shown = {k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in row.items()}
        print("  ".join(f"{k}={v}" for k, v in shown.items()))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as handle:
            handle.write(results_header(f"python -m bench.taylor_agreement {' '.join(map(str, args.roots))} "
                                        f"--out {args.out}"))
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows([{k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()}
                              for row in rows])


if __name__ == "__main__":
    main()
