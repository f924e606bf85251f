"""The attack study of docs/faults-and-audit.md: manipulation gain per attack and book, with and
without the defences, over seeds, IID and Dirichlet data, FedAvg and FedMedian.

    python -m bench.attack_study --out DIR            # the quick configuration (hours on 2 shared cores)
    python -m bench.attack_study --out DIR --full     # the full one (a bigger machine)
    python -m bench.attack_study --out DIR --tables   # only combine what the parts wrote

Each (partition, strategy) is one ``fedvalue run attacks`` child process writing DIR/<partition>-<strategy>/
(FedAvg over 20 seeds, FedMedian over 5 in the quick configuration; the KNN-ADS group split one
more, DIR/group-split/; the norm cap on crafted updates two more, DIR/<partition>-fedavg-norm-cap/,
tabled apart in DIR/norm-cap-table.md; the defence that also aggregates only one update per
near-duplicate cluster and no free-rider's, ``--defences 2``, four more, DIR/<partition>-<strategy>-aggregation/,
tabled in DIR/aggregation-table.md); a part that already wrote its gains.csv is
skipped, and a part whose Ray engine fails to start (a loaded machine) is tried again, so the
command can be run again until every part is done. Then the parts' totals.csv and runs.csv are
combined into DIR/gains.csv, DIR/honest_cost.csv, DIR/shells.csv and DIR/table.md (the docs'
tables).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from simulations.experiments.attacks.gains import gains_table, honest_cost

ATTACKS = ("none,sybil-split-2,sybil-split-4,sybil-split-8,sybil-replica-2,sybil-replica-4,sybil-replica-8,"
           "colluding-free-riders,delta-weights,dynamic-free-rider,crafted-update")
QUICK = ["--dataset", "fashion-mnist", "--num-clients", "6", "--train-examples", "3000", "--holdout-examples", "1000",
         "--rounds", "3", "--local-epochs", "2", "--learning-rate", "0.1", "--defences", "1",
         "--valuation-budget", "1000", "--craft-steps", "30"]
FULL = ["--dataset", "fashion-mnist", "--num-clients", "10", "--train-examples", "20000", "--holdout-examples",
        "2000", "--rounds", "5", "--local-epochs", "5", "--learning-rate", "0.1", "--defences", "1"]
#: Seeds per inner strategy: FedAvg's runs take seconds once the engine is up, FedMedian's a minute
#: (every coalition aggregated by its own code), so FedAvg gets more (tighter intervals on non-IID data).
SEEDS = {"quick": {"fedavg": 20, "fedmedian": 5}, "full": {"fedavg": 20, "fedmedian": 10}}
PARTS = [(p, s) for p in ("iid", "dirichlet") for s in ("fedavg", "fedmedian")]
#: The defence that also changes the aggregation (--defences 2: one update per near-duplicate cluster,
#: no free-rider's), for the attacks it can drop anything of; the others' runs would be the books-only ones.
AGGREGATION = ("none,sybil-replica-2,sybil-replica-4,sybil-replica-8,colluding-free-riders,delta-weights,"
               "dynamic-free-rider")
#: The norm cap (crafted updates), FedAvg only (the cap clips in weighted-mean rounds): its own parts.
CAPPED = ("none,crafted-update", ["--norm-cap", "1.25"])
TRIES = 3
#: The goal: no attack earns more than 1.05 times the honest earnings with the defences on.
GOAL = 1.05


def run_part(out: Path, name: str, options: list[str]) -> bool:
    """One ``fedvalue run attacks`` child (tried again when it fails); whether it finished."""
    target = out / name
    done_file = "shells.csv" if name == "group-split" else "gains.csv"
    for attempt in range(1, TRIES + 1):
        if (target / done_file).exists():
            return True
        command = [sys.executable, "-m", "simulations.cli", "run", "attacks", *options, "--out", str(target),
                   "--overwrite"]
        print(f"{name}: try {attempt}: {' '.join(command[2:])}", flush=True)
        subprocess.run(command, check=False)
    return (target / done_file).exists()


def combine(out: Path, names: list[str], prefix: str = "") -> None:
    """DIR/<prefix>gains.csv, honest_cost.csv and table.md from the parts that finished."""
    parts = [out / n for n in names if (out / n / "totals.csv").exists()]
    if parts:
        totals = pd.concat([pd.read_csv(p / "totals.csv") for p in parts], ignore_index=True)
        runs = pd.concat([pd.read_csv(p / "runs.csv") for p in parts], ignore_index=True)
        gains, cost = gains_table(totals, runs), honest_cost(totals)
        gains.to_csv(out / f"{prefix}gains.csv", index=False)
        cost.to_csv(out / f"{prefix}honest_cost.csv", index=False)
        (out / f"{prefix}table.md").write_text(markdown(gains, cost, runs))
    if not prefix and (out / "group-split" / "shells.csv").exists():
        shells = pd.read_csv(out / "group-split" / "shells.csv")
        shells.to_csv(out / "shells.csv", index=False)
        with open(out / "table.md", "a") as handle:
            handle.write("\n" + shells_markdown(shells))


def _interval(row: pd.Series, prefix: str) -> str:
    gain, low, high = row[f"{prefix}gain"], row[f"{prefix}gain_low"], row[f"{prefix}gain_high"]
    if not np.isfinite(gain) or not row[f"{prefix}honest_positive"]:
        return "n/a (honest ≈ 0)"
    return f"{gain:.2f} [{low:.2f}, {high:.2f}]" + (" ✗" if gain > GOAL else "")


def markdown(gains: pd.DataFrame, cost: pd.DataFrame, runs: pd.DataFrame) -> str:
    """The gains table (one line per partition, strategy, attack; a column pair per book) and the cost table."""
    lines = ["| data | strategy | attack | ADS | ADS defended | LOO | LOO defended | outflow | outflow defended "
             "| paid (ADS) | paid defended | accuracy change |", "|" + "---|" * 12]
    for (scheme, strategy, attack), group in gains.groupby(["partition", "strategy", "attack"], sort=False):
        by_book = group.set_index("book")
        ads = by_book.loc["ads"]
        cells = [scheme, strategy, attack]
        for book in ("ads", "loo", "tracin_outflow"):
            cells += [_interval(by_book.loc[book], ""), _interval(by_book.loc[book], "defended_")]
        cells += [f"{ads['paid']:.3f} ({ads['paid_honest']:.3f})",
                  f"{ads['defended_paid']:.3f} ({ads['defended_paid_honest']:.3f})",
                  f"{ads['accuracy_change']:+.3f} [{ads['accuracy_change_low']:+.3f}, {ads['accuracy_change_high']:+.3f}]"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| data | strategy | book | mean change of an honest client's paid share | largest | free-rider "
              "flags | clustered rows |", "|---|---|---|---|---|---|---|"]
    clean = runs[runs["attack"] == "none"].groupby(["partition", "strategy"])["clustered_rows"].sum()
    for _, row in cost.iterrows():
        lines.append(f"| {row['partition']} | {row['strategy']} | {row['book']} | {row['mean_share_change']:.4f} | "
                     f"{row['max_share_change']:.4f} | {row['free_rider_flags']} | "
                     f"{clean.get((row['partition'], row['strategy']), 0)} |")
    return "\n".join(lines) + "\n"


def shells_markdown(shells: pd.DataFrame) -> str:
    table = shells.groupby(["shells", "method"], sort=False)["gain"].agg(["mean", "min", "max"]).reset_index()
    lines = ["| shells | method | gain (mean over seeds) | min | max |", "|---|---|---|---|---|"]
    lines += [f"| {r['shells']} | {r['method']} | {r['mean']:.3f} | {r['min']:.3f} | {r['max']:.3f} |"
              for _, r in table.iterrows()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--full", action="store_true", help="the full configuration instead of the quick one")
    parser.add_argument("--tables", action="store_true", help="only combine the parts already written")
    args = parser.parse_args()
    options, seeds = (FULL, SEEDS["full"]) if args.full else (QUICK, SEEDS["quick"])
    args.out.mkdir(parents=True, exist_ok=True)
    names = [f"{p}-{s}" for p, s in PARTS]
    capped = [f"{p}-fedavg-norm-cap" for p in ("iid", "dirichlet")]
    aggregated = [f"{name}-aggregation" for name in names]
    if not args.tables:
        for (partition, strategy), name in zip(PARTS, names):
            run_part(args.out, name, ["--attacks", ATTACKS, *options, "--partitions", partition,
                                      "--strategies", strategy, "--seeds", str(seeds[strategy])])
        run_part(args.out, "group-split", ["--attacks", "group-split", "--dataset", "fashion-mnist",
                                           "--seeds", str(seeds["fedmedian"]), "--quiet"])
        for partition, name in zip(("iid", "dirichlet"), capped):
            run_part(args.out, name, ["--attacks", CAPPED[0], *options, *CAPPED[1], "--partitions", partition,
                                      "--strategies", "fedavg", "--seeds", str(seeds["fedavg"])])
        for (partition, strategy), name in zip(PARTS, aggregated):
            run_part(args.out, name, ["--attacks", AGGREGATION, *options, "--defences", "2", "--partitions",
                                      partition, "--strategies", strategy, "--seeds", str(seeds[strategy])])
    combine(args.out, names)
    combine(args.out, capped, prefix="norm-cap-")
    combine(args.out, aggregated, prefix="aggregation-")
    print((args.out / "table.md").read_text() if (args.out / "table.md").exists() else "no part finished")


if __name__ == "__main__":
    main()
