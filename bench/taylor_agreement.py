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

``--coverage``: whether MC-ADS's booked standard errors hold their coverage on the same saved rounds. Of each run,
``--rounds`` evenly spaced rounds are valued exactly (every coalition scored once) and then ``--repeats`` times by
MC-ADS at each of ``--budgets`` coalition evaluations a round, each draw through a fresh cache over those scores (so a
budget counts MC's own evaluations); the first draw at the run's own budget is the run's own valuation of the round
(its generator and its scoring), checked against the ledger (value and standard error, under the estimator the
record names). Per regime (the path component after the runs' common folder) and budget: the share of values within
2 standard errors of exact under the plain estimator and under the by-position one (:mod:`fedvalue.valuation.result`;
the values are the same under both), Spearman's ρ of the values with exact (mean over rounds and draws), and the
share of rounds whose booked rows were reproduced; an ``all`` row per budget.

    python -m bench.taylor_agreement --coverage RUN_DIR [RUN_DIR ...] --out docs/results/stderr_coverage.csv
    python -m bench.taylor_agreement --coverage RUNS/{clean,label-flip-1.0,free-rider}/mlp/seed-1/p1/value-ucb/run \
        --rounds 10 --budgets 100                                          # quick: about a minute on one core

Nothing is written under the run roots.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
from pathlib import Path

import numpy as np
from scipy import stats

from bench import results_header
from bench.coalition_rules import roc_auc, valued_runs
from fedvalue.analysis.run_summary import load_run
from fedvalue.audit.round import close
from fedvalue.rounds.record_game import record_game, value_record
from fedvalue.run.archive import read_round_record, round_record_paths
from fedvalue.schema import Method
from fedvalue.valuation.ads import ads, subset_form
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.plan import MAX_EXACT_GROUP_SIZE
from fedvalue.valuation.round_game import ads_share_of_budget, round_rng
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


#: The estimators compared: the one booked before, then the one booked now.
COMPARED_STDERR = ("plain", "by-position")
COVERAGE_COLUMNS = ["regime", "budget", "runs", "rounds", "values", "permutations",
                    *[f"coverage_{e.replace('-', '_')}" for e in COMPARED_STDERR], "spearman", "booked_reproduced"]


def spaced_rounds(run_dir: Path, count: int | None) -> list[int]:
    """``count`` of the run's recorded rounds, evenly spaced from the first (None: all)."""
    rounds = sorted(round_record_paths(run_dir))
    if count is None or count >= len(rounds):
        return rounds
    return [rounds[int(k * len(rounds) / count)] for k in range(count)]


def booked_ads(run_dir: Path) -> dict[tuple[int, str], tuple[float, float]]:
    """(value, stderr) of every ``ads`` row of the run's ledger, by (round, client)."""
    ledger = load_run(run_dir).ledger
    return {(int(r.round), str(r.client_id)): (r.value, r.stderr) for r in ledger.itertuples() if r.method == "ads"}


def table_game(players: list, table: np.ndarray) -> CoalitionGame:
    """The round game read from ``table`` (entry s: the coalition of the players whose bits s holds) through a
    fresh cache, so that a budget counts the estimator's own evaluations."""
    position = {p: k for k, p in enumerate(players)}
    return CoalitionGame(lambda coalition: float(table[sum(1 << position[p] for p in coalition)]), players)


def reproduces(booked: dict, t: int, result) -> bool:
    """Whether ``result`` is round ``t``'s booked ``ads`` rows: every value and standard error (to rounding)."""
    for player in result.values.index:
        value, stderr = booked.get((t, str(player)), (None, None))
        if not close(value, float(result.values[player]), 1e-12) or not close(stderr, float(result.stderr[player]),
                                                                               1e-9):
            return False
    return True


def coverage_draws(run_dir: Path, rounds: int | None, repeats: int, budgets: list[int]) -> list[dict]:
    """One row per (round, budget, draw) of ``run_dir``: the values within 2 standard errors of exact under each
    estimator, the permutations, Spearman's ρ with exact, and (the booked draw) whether the ledger's row was
    reproduced."""
    _, context, why_not = _audit_context(str(run_dir))
    utility = context.get("utility")
    if utility is None:
        print(f"{run_dir}: skipped, no utility to recompute with ({why_not})")
        return []
    booked, rows = booked_ads(run_dir), []
    paths = round_record_paths(run_dir)
    for t in spaced_rounds(run_dir, rounds):
        record = read_round_record(paths[t])
        if not record.replies or record.settings.by_strategy:
            continue
        game = record_game(record, utility)
        players = list(game.players)
        if not 1 < len(players) <= MAX_EXACT_GROUP_SIZE:
            continue
        table = np.asarray(game.values(list(range(1 << len(players)))))
        exact = subset_form(table, len(players))
        settings = record.settings.valuation
        for budget in budgets:
            share = ads_share_of_budget(budget, len(players), record.settings.methods)
            for repeat in range(repeats):
                as_booked = repeat == 0 and budget == settings.budget and settings.method == "mc"
                found = {}
                for estimator in COMPARED_STDERR:
                    chosen = dataclasses.replace(settings, method="mc", budget=share, stderr_target=None,
                                                 stderr_estimator=estimator)
                    if as_booked:  # the run's own valuation of the round, its coalitions scored as it scored them
                        again = dataclasses.replace(record, settings=dataclasses.replace(
                            record.settings, valuation=dataclasses.replace(settings, stderr_estimator=estimator)))
                        found[estimator] = value_record(again, utility, round_rng(record.settings.seed, t)).results[
                            Method.ADS]
                        continue
                    found[estimator] = ads(table_game(players, table), [players], chosen,
                                           seed=np.random.default_rng([record.settings.seed, t, repeat]))
                values = found["by-position"].values.to_numpy()
                row = {"run": str(run_dir), "round": t, "budget": budget, "values": len(players),
                       "permutations": found["by-position"].num_permutations,
                       "spearman": spearman(values, exact), "booked_reproduced": None}
                for estimator, result in found.items():
                    within = np.abs(result.values.to_numpy() - exact) <= 2 * result.stderr.to_numpy()
                    row[f"coverage_{estimator.replace('-', '_')}"] = int(within.sum())
                if as_booked:
                    row["booked_reproduced"] = reproduces(booked, t, found[settings.stderr_estimator])
                rows.append(row)
    return rows


def coverage_rows(draws: list[dict], regime_of_run: dict[str, str]) -> list[dict]:
    """Per regime and budget, and over all regimes per budget: :data:`COVERAGE_COLUMNS`."""
    found = []
    for budget in sorted({d["budget"] for d in draws}):
        for regime in [*sorted(set(regime_of_run.values())), "all"]:
            mine = [d for d in draws if d["budget"] == budget and regime in ("all", regime_of_run[d["run"]])]
            if not mine:
                continue
            values = sum(d["values"] for d in mine)
            reproduced = [d["booked_reproduced"] for d in mine if d["booked_reproduced"] is not None]
            row = {"regime": regime, "budget": budget, "runs": len({d["run"] for d in mine}),
                   "rounds": len({(d["run"], d["round"]) for d in mine}), "values": values,
                   "permutations": float(np.mean([d["permutations"] for d in mine])),
                   "spearman": _mean([d["spearman"] for d in mine]),
                   "booked_reproduced": float(np.mean(reproduced)) if reproduced else None}
            for estimator in COMPARED_STDERR:
                column = f"coverage_{estimator.replace('-', '_')}"
                row[column] = sum(d[column] for d in mine) / values
            found.append(row)
    return found


def regimes_of(run_dirs: list[Path]) -> dict[str, str]:
    """Each run's regime: its path's component after the runs' common folder (the run's own name when alone)."""
    if len(run_dirs) == 1:
        return {str(run_dirs[0]): run_dirs[0].name}
    common = Path(os.path.commonpath([str(r) for r in run_dirs]))
    return {str(r): r.relative_to(common).parts[0] for r in run_dirs}


def coverage_main(args: argparse.Namespace) -> None:
    run_dirs = valued_runs(args.roots)
    draws = []
    for run_dir in run_dirs:
        found = coverage_draws(run_dir, args.rounds, args.repeats, args.budgets)
        draws += found
        print(f"{run_dir}: {len({d['round'] for d in found})} rounds", flush=True)
    rows = coverage_rows(draws, regimes_of(run_dirs))
    for row in rows:
        print("  ".join(f"{k}={row[k]:.3f}" if isinstance(row[k], float) else f"{k}={row[k]}" for k in COVERAGE_COLUMNS))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        rounds = "" if args.rounds is None else f" --rounds {args.rounds}"
        command = (f"python -m bench.taylor_agreement --coverage {' '.join(map(str, args.roots))}{rounds} --repeats "
                   f"{args.repeats} --budgets {' '.join(map(str, args.budgets))} --out {args.out}")
        with args.out.open("w", newline="") as handle:
            handle.write(results_header(command))
            writer = csv.DictWriter(handle, fieldnames=COVERAGE_COLUMNS)
            writer.writeheader()
            writer.writerows([{k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()} for row in rows])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("roots", nargs="+", type=Path, help="folders holding valued run directories")
    parser.add_argument("--out", type=Path, help="CSV of the rows (with the command and commit as a comment)")
    parser.add_argument("--coverage", action="store_true",
                        help="the coverage of MC-ADS's standard errors against exact instead (module docstring)")
    parser.add_argument("--rounds", type=int, default=None, help="--coverage: rounds per run, evenly spaced (all)")
    parser.add_argument("--repeats", type=int, default=5, help="--coverage: MC draws per round and budget (5)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[100],
                        help="--coverage: coalition evaluations a round (100)")
    args = parser.parse_args(argv)
    if args.coverage:
        coverage_main(args)
        return
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
