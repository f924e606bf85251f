"""The noisy-federation benchmark in every regime of bad clients, and the paired "never worse" test per regime.

Each regime is one ``fedvalue run noisy-federation`` configuration (the quick configuration: 100 clients, 10 a
round, 30 rounds, the MLP, 50% bad clients) that differs only in what the bad clients do (``--bad-kind``,
``--flip-probabilities``, ``--mavericks``); each runs into its own folder under ``--out``, seed by seed over every
regime (so that a stopped run has every regime at the same seeds), and resumes per cell like the benchmark. Then
the tables of every regime are gathered, with a ``regime`` column, into ``regimes_summary.csv`` (each measure's
mean and 95% interval over seeds), ``regimes_paired.csv`` (each policy minus random, paired by seed) and
``regimes_curves.csv`` (test accuracy by round, mean and 95% half-width over seeds; the figure of
:mod:`bench.regimes.figure`), with a ``_fixed_weight`` suffix when the valuing policies value by the fixed-weight coalition rule (``--coalition-rule``).

    python -m bench.regimes --out ~/fedvalue-runs/regimes --seed 1 --seeds 5 --results docs/results
    python -m bench.regimes --quick --out /tmp/regimes                     # every regime, tiny: a smoke run
    python -m bench.regimes --seed 100 --seeds 1 --set guard_explore=0.3 --out /tmp/tune   # a tuning run
    python -m bench.regimes --full --regimes matched-0.7 --set 'models=["mlp","cnn"]' --out ~/fedvalue-runs/full \
        --policies random,value-guard,value-ucb,greedyfed,oracle --results docs/results    # the full configuration

The regimes' settings (the kinds' noise, the strengths, the mavericks' count) were chosen before any result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import pandas as pd

from bench import results_header
from simulations.experiments.noisy_federation.config import NoisyFederationConfig, check_config
from simulations.experiments.noisy_federation.measures import accuracy_bands
from simulations.experiments.noisy_federation.noisy_federation import run_benchmark, write_tables

#: regime -> the settings that make it (the rest is the quick configuration).
REGIMES = {
    "clean": {"bad_kind": "none", "flip_probabilities": (1.0,)},
    "label-flip-1.0": {"bad_kind": "label-flip", "flip_probabilities": (1.0,)},
    "label-flip-0.5": {"bad_kind": "label-flip", "flip_probabilities": (0.5,)},
    "class-swap": {"bad_kind": "class-swap", "flip_probabilities": (1.0,)},
    "feature-noise": {"bad_kind": "feature-noise", "flip_probabilities": (1.0,)},
    "free-rider": {"bad_kind": "free-rider", "flip_probabilities": (1.0,)},
    "noisy-free-rider": {"bad_kind": "noisy-free-rider", "flip_probabilities": (1.0,)},
    "stale-replayer": {"bad_kind": "stale-replayer", "flip_probabilities": (1.0,)},
    "sign-flip": {"bad_kind": "sign-flip", "flip_probabilities": (1.0,)},
    "boosted-update": {"bad_kind": "boosted-update", "flip_probabilities": (1.0,)},
    "noisy-update": {"bad_kind": "noisy-update", "flip_probabilities": (1.0,)},
    "mavericks": {"bad_kind": "none", "flip_probabilities": (1.0,), "mavericks": 2},
    "mavericks-flips": {"bad_kind": "label-flip", "flip_probabilities": (1.0,), "mavericks": 2},
}
#: The full configuration's regimes: the public benchmarks' protocol (40% of the clients flip labels at p = 0.7)
#: beside this project's own (half of them, at p = 1.0 and 0.5).
FULL_REGIMES = {
    "matched-0.7": {"bad_kind": "label-flip", "flip_probabilities": (0.7,), "noisy_fraction": 0.4},
    "label-flip-1.0": REGIMES["label-flip-1.0"],
    "label-flip-0.5": REGIMES["label-flip-0.5"],
}
#: The full configuration: long enough for random sampling to plateau, a larger validation split and budget; the
#: models are chosen per run (``--set models=[\"mlp\",\"cnn\"]``).
FULL = {"rounds": 120, "final_window": 10, "validation_examples": 2000, "valuation_budget": 200}
POLICIES = ("random", "value-ucb", "greedyfed", "oracle")
#: A smoke run of every regime: a few clients and rounds, small splits.
QUICK = {"num_clients": 12, "clients_per_round": 4, "rounds": 3, "final_window": 2, "validation_examples": 200,
         "test_examples": 300, "valuation_budget": 16, "hidden": (16,), "poc_candidates": 6,
         "topk": 2}


def regime_config(regime: str, *, seed: int, seeds: int, policies: tuple[str, ...], quick: bool,
                  coalition_rule: str = "renormalized", settings: dict | None = None,
                  full: bool = False) -> NoisyFederationConfig:
    """The benchmark's configuration of ``regime``: the quick one (or :data:`FULL`, ``full``), the regime's settings,
    :data:`QUICK` for a smoke run, then ``settings``."""
    made = {**FULL_REGIMES[regime], **FULL} if full else REGIMES[regime]
    config = NoisyFederationConfig(seed=seed, seeds=seeds, policies=policies, coalition_rule=coalition_rule,
                                   **{**made, **(QUICK if quick else {}), **(settings or {})})
    check_config(config)
    return config


def parse_settings(pairs: list[str]) -> dict:
    """``--set name=value`` pairs as config fields: a value is read as JSON (numbers, null, lists), else as
    text; ValueError naming ``--set`` for a pair without ``=`` or a name the benchmark has not."""
    fields = {f.name for f in dataclasses.fields(NoisyFederationConfig)} - {"seed", "seeds", "policies", "engine"}
    settings = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or name not in fields:
            raise ValueError(f"--set: expected name=value with a name from {sorted(fields)}; got {pair!r}.")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        settings[name] = tuple(value) if isinstance(value, list) else value
    return settings


def gather(out: Path, regimes: list[str],
           configs: dict[str, NoisyFederationConfig]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Every regime's summary and paired tables and its accuracy by round (mean and 95% half-width over seeds,
    :func:`~simulations.experiments.noisy_federation.measures.accuracy_bands`), from its done cells, with a regime
    column."""
    summaries, paired, bands = [], [], []
    for regime in regimes:
        tables = write_tables(configs[regime], out / regime)
        if not tables["per_cell"].empty:
            summaries.append(tables["summary"].assign(regime=regime))
            paired.append(tables["paired"].assign(regime=regime))
            bands.append(accuracy_bands(tables["curves"], by="round").rename(columns={"x": "round"})
                         .assign(regime=regime))
    first = lambda frames: (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())  # noqa: E731
    summary, pairs, curves = first(summaries), first(paired), first(bands)
    for frame in (summary, pairs, curves):
        if not frame.empty:
            frame.insert(0, "regime", frame.pop("regime"))
    return summary, pairs, curves


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.regimes", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--out", type=Path, required=True, help="folder of the regimes' benchmark runs (resumable)")
    parser.add_argument("--seed", type=int, default=1, help="first seed")
    parser.add_argument("--seeds", type=int, default=5, help="number of seeds")
    parser.add_argument("--regimes", help="comma-separated, from " + ",".join(REGIMES) + "; with --full from "
                        + ",".join(FULL_REGIMES) + " (default: every one)")
    parser.add_argument("--full", action="store_true", help="the full configuration (120 rounds, a final window of "
                        "10, 2,000 validation images, 200 evaluations a round); results files get a _full suffix")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated benchmark policies")
    parser.add_argument("--coalition-rule", default="renormalized", help="the round game the valuing policies value "
                        "with: renormalized or fixed-weight")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny federations, 3 rounds")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a benchmark setting for every regime (repeatable), e.g. guard_explore=0.3: tuning runs")
    parser.add_argument("--results", type=Path, help="folder to write regimes_summary.csv, regimes_paired.csv and "
                        "regimes_curves.csv (accuracy by round) to")
    args = parser.parse_args(argv)
    known = FULL_REGIMES if args.full else REGIMES
    regimes = list(known) if args.regimes is None else [r for r in args.regimes.split(",") if r]
    unknown = [r for r in regimes if r not in known]
    if unknown or not regimes:
        parser.error(f"--regimes: expected names from {list(known)}; got {args.regimes!r}")
    policies = tuple(p for p in args.policies.split(",") if p)
    try:
        settings = parse_settings(args.set)
        configs = {r: regime_config(r, seed=args.seed, seeds=args.seeds, policies=policies, quick=args.quick,
                                    coalition_rule=args.coalition_rule, settings=settings, full=args.full) for r in regimes}
    except ValueError as error:
        parser.error(str(error))
    started = time.perf_counter()
    failed = []
    for seed in range(args.seed, args.seed + args.seeds):
        for regime in regimes:
            try:
                run_benchmark(dataclasses.replace(configs[regime], seed=seed, seeds=1), args.out / regime)
            except Exception as error:  # noqa: BLE001 - one regime's failure is reported; the others still run
                failed.append(f"seed {seed} {regime}: {type(error).__name__}: {error}")
                print(f"seed {seed} {regime}: FAILED {type(error).__name__}: {error}", flush=True)
                continue
            print(f"seed {seed} {regime}: done ({time.perf_counter() - started:.0f}s)", flush=True)
    summary, paired, curves = gather(args.out, regimes, configs)
    columns = ["regime", "policy", "seeds", "final_accuracy_diff", "final_accuracy_diff_ci", "auc_diff", "auc_diff_ci",
               "rounds_to_95_diff", "rounds_to_95_diff_ci", "seconds_ratio", "seconds_ratio_ci"]
    if not paired.empty:
        print(paired[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    seeds = f"{args.seed}-{args.seed + args.seeds - 1}"
    print(f"{len(regimes)} regimes x seeds {seeds} in {time.perf_counter() - started:.0f}s"
          + (f"; {len(failed)} failed: " + "; ".join(failed) if failed else ""))
    if args.results is not None:
        args.results.mkdir(parents=True, exist_ok=True)
        note = results_header(f"python -m bench.regimes {' '.join(argv if argv is not None else sys.argv[1:])}")
        suffix = ("" if args.coalition_rule == "renormalized" else "_" + args.coalition_rule.replace("-", "_")) \
            + ("_full" if args.full else "")
        for name, frame in ((f"regimes_summary{suffix}.csv", summary), (f"regimes_paired{suffix}.csv", paired),
                            (f"regimes_curves{suffix}.csv", curves)):
            (args.results / name).write_text(note + frame.to_csv(index=False))

