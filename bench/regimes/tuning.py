"""The value-guard policy's tuning table: one tuning run of ``python -m bench.regimes`` per variant, gathered.

Each variant is a folder of ``DIR`` made by ``python -m bench.regimes --seed 100 --seeds 1 --regimes
clean,label-flip-1.0,free-rider,mavericks --policies random,value-guard --set NAME=VALUE ... --out DIR/VARIANT``
(seed 100 is the tuning seed; the reported seeds are 1-5). The table holds, per variant and regime, the guard's
and random's final accuracy, their difference, the rounds each took to 95% of the clean accuracy (T + 1: never)
and the mavericks' class accuracy; the criterion, settled before the variants were compared beyond the first, is
do-no-harm first: the variant whose worst difference from random over the regimes is largest (maximin), ties
by the mean difference.

    python -m bench.regimes.tuning /work/tune --results docs/results      # writes guard_tuning.csv
    python -m bench.regimes.tuning docs/results/guard_tuning.csv --markdown   # the docs' table, from the file
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from bench import results_header
from bench.regimes.table import read_results

GUARD = "value-guard"


#: What a run saved before the option existed ran with (guard_selection came after the first variants).
BEFORE_OPTION = {"guard_selection": "ucb"}


def variant_settings(folder: Path) -> str:
    """The guard's settings a variant ran with, in words (selection, exploration share, probation, weighting,
    estimator and round game), read from the runs' saved settings."""
    saved = {**BEFORE_OPTION, **json.loads(next(folder.glob("*/benchmark.json")).read_text())}
    weighting = saved["guard_weighting_kind"] + (f" τ = {saved['guard_weighting_temperature']:g}"
                                                 if saved["guard_weighting_kind"] == "softmax" else "")
    return (f"{saved['guard_selection']}, explore {saved['guard_explore']:g}, probation {saved['guard_min_rounds']}, "
            f"weighting {weighting}, {saved['guard_ads_method']}, {saved['guard_coalition_rule']}")


def variant_rows(folder: Path) -> list[dict]:
    rows, settings = [], variant_settings(folder)
    for per_cell_file in sorted(folder.glob("*/per_cell.csv")):
        cells = pd.read_csv(per_cell_file).set_index("policy")
        if not {GUARD, "random"} <= set(cells.index):
            continue
        guard, random = cells.loc[GUARD], cells.loc["random"]
        rows.append({"variant": folder.name, "settings": settings, "regime": per_cell_file.parent.name,
                     "seed": int(guard["seed"]), "guard_final": guard["final_accuracy"],
                     "random_final": random["final_accuracy"],
                     "final_diff": guard["final_accuracy"] - random["final_accuracy"],
                     "guard_rounds_to_95": guard["rounds_to_95"], "random_rounds_to_95": random["rounds_to_95"],
                     "guard_maverick_accuracy": guard.get("maverick_accuracy"),
                     "random_maverick_accuracy": random.get("maverick_accuracy")})
    return rows


def tuning_table(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every variant's rows, one row a variant: worst and mean difference, ranked by the criterion)."""
    table = pd.DataFrame([row for folder in sorted(p for p in root.iterdir() if p.is_dir())
                          for row in variant_rows(folder)])
    return table, (table if table.empty else rank(table))


def rank(table: pd.DataFrame) -> pd.DataFrame:
    """One row a variant: its regimes, worst and mean difference from random, best first (module docstring)."""
    return (table.groupby(["variant", "settings"], as_index=False)
            .agg(regimes=("regime", "count"), worst_diff=("final_diff", "min"), mean_diff=("final_diff", "mean"))
            .sort_values(["worst_diff", "mean_diff"], ascending=False, ignore_index=True))


def markdown_rows(table: pd.DataFrame) -> list[str]:
    """The docs' tuning table: one row a variant (best first), its final-accuracy difference from random in each
    regime, the worst and the mean; rendered from guard_tuning.csv alone."""
    regimes = list(dict.fromkeys(table["regime"]))
    header = ["| variant | " + " | ".join(regimes) + " | worst | mean |", "|---" * (len(regimes) + 3) + "|"]
    rows = []
    for (variant, settings), rows_of in table.groupby(["variant", "settings"], sort=False):
        diffs = rows_of.set_index("regime")["final_diff"]
        cells = [f"{diffs[r]:+.3f}" if r in diffs else "–" for r in regimes]
        rows.append((diffs.min(), diffs.mean(), f"| {settings} | " + " | ".join(cells)
                     + f" | {diffs.min():+.3f} | {diffs.mean():+.3f} |"))
    return header + [row for *_, row in sorted(rows, key=lambda r: (-r[0], -r[1]))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.regimes.tuning", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("root", type=Path, help="folder of the variants' tuning runs, one subfolder a variant, or "
                        "a guard_tuning.csv it wrote")
    parser.add_argument("--results", type=Path, help="folder to write guard_tuning.csv to")
    parser.add_argument("--markdown", action="store_true", help="print the docs' table instead of the ranking")
    args = parser.parse_args(argv)
    if args.root.is_file():
        table = read_results(args.root)
        ranking = rank(table)
    elif args.root.is_dir():
        table, ranking = tuning_table(args.root)
    else:
        parser.error(f"root: expected a folder of tuning runs or guard_tuning.csv; got {str(args.root)!r}")
    if table.empty:
        parser.error(f"root: expected tuning runs with random and {GUARD} cells under {args.root}; found none")
    print("\n".join(markdown_rows(table)) if args.markdown
          else ranking.to_string(index=False, float_format=lambda v: f"{v:+.3f}"))
    if args.results is not None:
        args.results.mkdir(parents=True, exist_ok=True)
        note = results_header(f"python -m bench.regimes.tuning {' '.join(argv if argv is not None else sys.argv[1:])}")
        (args.results / "guard_tuning.csv").write_text(note + table.to_csv(index=False))


if __name__ == "__main__":
    main()
