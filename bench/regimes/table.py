"""The regimes' table of docs/reproductions.md, made from the results files alone.

Each row is one policy in one regime: random's final accuracy, the policy's paired differences from random (final
accuracy, AUC, rounds to 95% of the clean accuracy) with their 95% t-intervals, the ratio of its wall-clock to 95%
to random's over the seeds where both reached it (their count in brackets), and its share of training slots given
to bad clients (random's in brackets). The docs quote this output verbatim: ``python -m bench.docs_tables``
renders each of the docs' regimes tables again from the files (:func:`docs_table`) and puts it in its place.

    python -m bench.regimes.table docs/results/regimes_paired.csv docs/results/regimes_summary.csv
    python -m bench.regimes.table ... --policies value-guard,value-ucb,greedyfed     # those policies' rows only
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

HEADER = ("| regime | policy | final acc (random) | Δ final acc | Δ AUC | Δ rounds→95% | s→95% ÷ random's "
          "| bad share trained |\n|---|---|---|---|---|---|---|---|")


def with_interval(value: float, half: float, digits: int = 3, signed: bool = True) -> str:
    """``value [value − half, value + half]`` (– for no value; no interval for an undefined half-width)."""
    if value is None or math.isnan(value):
        return "–"
    form = f"{{:{'+' if signed else ''}.{digits}f}}"
    text = form.format(value)
    if half is not None and not math.isnan(half):
        text += f" [{form.format(value - half)}, {form.format(value + half)}]"
    return text


def table_rows(paired: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """One markdown row a (regime, policy) of ``paired``, in its order."""
    rows = []
    for _, pair in paired.iterrows():
        of = summary[summary["regime"] == pair["regime"]].set_index("policy")
        base, mine = of.loc["random"], of.loc[pair["policy"]]
        rows.append(f"| {pair['regime']} | {pair['policy']} | {base['final_accuracy']:.3f} | "
                    f"{with_interval(pair['final_accuracy_diff'], pair['final_accuracy_diff_ci'])} | "
                    f"{with_interval(pair['auc_diff'], pair['auc_diff_ci'])} | "
                    f"{with_interval(pair['rounds_to_95_diff'], pair['rounds_to_95_diff_ci'], 1)} | "
                    f"{with_interval(pair['seconds_ratio'], pair['seconds_ratio_ci'], 2, False)} "
                    f"({int(pair['seconds_ratio_n'])}) | "
                    f"{mine['bad_trained_share']:.2f} ({base['bad_trained_share']:.2f}) |")
    return rows


def docs_table(paired: pd.DataFrame, summary: pd.DataFrame, policies: tuple[str, ...] = ()) -> list[str]:
    """The docs' table of ``paired`` (its ``policies``' rows only, when given: in the file's order), header first."""
    chosen = paired[paired["policy"].isin(policies)] if policies else paired
    return [*HEADER.splitlines(), *table_rows(chosen, summary)]


def read_results(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, comment="#")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.regimes.table", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("paired", type=Path, help="regimes_paired*.csv")
    parser.add_argument("summary", type=Path, help="regimes_summary*.csv")
    parser.add_argument("--policies", help="comma-separated: only these policies' rows (default: every policy)")
    args = parser.parse_args(argv)
    for name in ("paired", "summary"):
        if not getattr(args, name).is_file():
            parser.error(f"{name}: expected a results file; got {str(getattr(args, name))!r}")
    paired = read_results(args.paired)
    if args.policies is not None:
        chosen = [p for p in args.policies.split(",") if p]
        unknown = sorted(set(chosen) - set(paired["policy"]))
        if unknown or not chosen:
            parser.error(f"--policies: expected policies of {args.paired.name} ({sorted(set(paired['policy']))}); "
                         f"got {args.policies!r}")
        paired = paired[paired["policy"].isin(chosen)]
    print("\n".join(docs_table(paired, read_results(args.summary))))


if __name__ == "__main__":
    main()
