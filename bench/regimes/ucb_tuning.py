"""The value-driven sampler's tuning table: eleven variants, one ``python -m bench.regimes`` run each, gathered.

A variant is a policy (value-ucb or GreedyFed) and the benchmark settings (``--set``) that make it. Its run is the
tuning seed 100 of the quick configuration in the regimes ``label-flip-1.0`` and ``label-flip-0.5`` (half of the
clients flip labels with p = 1 and p = 0.5), and it writes ``regimes_summary.csv`` under
``docs/results/value_ucb_tuning/VARIANT`` (``--results``): per regime, the policy's rounds to 95% of the clean
federation's final accuracy (the clean run of the same seed, which each regime's folder holds), its area under the
accuracy curve and its final accuracy. The table has one row a variant and p = 1 / p = 0.5 in each cell; the chosen
variant (value-ucb's settings today) in bold. The variants were compared by the rounds to 95% (mean over p), then
the AUC (docs/reproductions.md, "How the value-driven policy was designed and tuned").

    python -m bench.regimes.ucb_tuning --commands DIR      # the eleven runs' commands (their runs under DIR)
    python -m bench.regimes.ucb_tuning docs/results        # the docs' table, from the eleven results files
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.regimes.table import read_results

#: The tuning seed (the reported seeds are 1-5).
SEED = 100
#: The table's federations, p = 1 and p = 0.5, in its order.
REGIMES = ("label-flip-1.0", "label-flip-0.5")
#: The folder of the variants' results files, under the results folder.
FOLDER = "value_ucb_tuning"
SUMMARY = "regimes_summary.csv"
HEADER = ("| variant (value-driven sampler; utility −loss unless said) | rounds to 95%, p = 1 / 0.5 | AUC p = 1 / 0.5 "
          "| final p = 1 / 0.5 |")


@dataclass(frozen=True)
class Variant:
    """One tuning run: its folder's name, its words in the table, the policy it runs and its ``--set`` pairs."""

    name: str
    words: str
    policy: str
    settings: tuple[str, ...] = ()


UNIFORM_FEDAVG = ("elimination_selection=uniform", "elimination_acceptance=all")
ROUND_ROBIN_FEDAVG = ("elimination_warm_start=1", *UNIFORM_FEDAVG)
#: The variants in the table's order; the settings not named are the benchmark's defaults (the chosen variant's).
VARIANTS = (
    Variant("uniform-weighted", "uniform among survivors, value-weighted", "value-ucb",
            ("elimination_selection=uniform",)),
    Variant("uniform-fedavg", "uniform among survivors, plain FedAvg", "value-ucb", UNIFORM_FEDAVG),
    Variant("uniform-fedavg-accuracy", "the same, utility accuracy", "value-ucb", (*UNIFORM_FEDAVG, "utility=accuracy")),
    Variant("round-robin-fedavg", "round-robin first, then uniform, plain FedAvg", "value-ucb", ROUND_ROBIN_FEDAVG),
    Variant("round-robin-fedavg-c0.25", "the same, c = 0.25", "value-ucb",
            (*ROUND_ROBIN_FEDAVG, "elimination_confidence=0.25")),
    Variant("ucb-fedavg", "UCB, plain FedAvg", "value-ucb", ("elimination_acceptance=all",)),
    Variant("ucb-fedavg-c1", "UCB, plain FedAvg, c = 1", "value-ucb",
            ("elimination_acceptance=all", "elimination_confidence=1")),
    Variant("ucb-weighted", "UCB, value-weighted (chosen: value-ucb)", "value-ucb"),
    Variant("greedyfed-mean", "GreedyFed, plain mean", "greedyfed"),
    Variant("greedyfed-average", "GreedyFed, exponential average α = 0.5", "greedyfed", ("greedy_memory=0.5",)),
    Variant("greedyfed-average-accuracy", "GreedyFed, α = 0.5, utility accuracy", "greedyfed",
            ("greedy_memory=0.5", "utility=accuracy")),
)
CHOSEN = "ucb-weighted"


def command(variant: Variant, out: str = "DIR", results: str = "docs/results") -> str:
    """The run of ``variant``: its benchmark folder ``out/NAME``, its results folder ``results/value_ucb_tuning/NAME``."""
    settings = "".join(f" --set {pair}" for pair in variant.settings)
    return (f"python -m bench.regimes --seed {SEED} --seeds 1 --regimes {','.join(REGIMES)} --policies "
            f"{variant.policy}{settings} --out {out}/{variant.name} --results {results}/{FOLDER}/{variant.name}")


def results_files() -> tuple[str, ...]:
    """The variants' summaries under the results folder, in :data:`VARIANTS`' order (:func:`markdown_rows` reads)."""
    return tuple(f"{FOLDER}/{variant.name}/{SUMMARY}" for variant in VARIANTS)


def _rounds(row: pd.Series) -> str:
    value = row["rounds_to_95"]
    return "–" if row.get("rounds_to_95_n", 1) == 0 or math.isnan(value) else f"{round(value, 1):g}"


def _share(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.3f}".removeprefix("0")


def markdown_rows(*summaries: pd.DataFrame) -> list[str]:
    """The docs' table, header first: one row a variant of :data:`VARIANTS` from its ``regimes_summary.csv`` (given
    in that order), each cell p = 1 / p = 0.5 (– for a target never reached), the chosen variant in bold."""
    if len(summaries) != len(VARIANTS):
        raise ValueError(f"summaries: expected one regimes summary a variant ({len(VARIANTS)}); got {len(summaries)}.")
    rows = [HEADER, "|---|---|---|---|"]
    for variant, summary in zip(VARIANTS, summaries):
        mine = summary[summary["policy"] == variant.policy].set_index("regime")
        missing = [regime for regime in REGIMES if regime not in mine.index]
        if missing:
            raise ValueError(f"summaries: expected {variant.policy} rows in the regimes {list(REGIMES)} for the "
                             f"variant {variant.name}; missing {missing}.")
        rounds = " / ".join(_rounds(mine.loc[regime]) for regime in REGIMES)
        auc, final = (" / ".join(_share(float(mine.loc[regime, measure])) for regime in REGIMES)
                      for measure in ("auc", "final_accuracy"))
        words = variant.words
        if variant.name == CHOSEN:
            words, rounds = f"**{words}**", f"**{rounds}**"
        rows.append(f"| {words} | {rounds} | {auc} | {final} |")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.regimes.ucb_tuning", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("results", type=Path, nargs="?", help="results folder holding value_ucb_tuning/: print the "
                        "docs' table")
    parser.add_argument("--commands", metavar="DIR", help="print the variants' commands, their runs under DIR")
    args = parser.parse_args(argv)
    if args.commands is not None:
        print("\n".join(command(variant, args.commands) for variant in VARIANTS))
        return
    if args.results is None:
        parser.error("expected a results folder or --commands DIR")
    missing = [file for file in results_files() if not (args.results / file).is_file()]
    if missing:
        parser.error(f"results: expected the variants' summaries under {args.results}; missing {', '.join(missing)}")
    print("\n".join(markdown_rows(*(read_results(args.results / file) for file in results_files()))))


if __name__ == "__main__":
    main()
