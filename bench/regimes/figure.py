"""The regimes' figure: test accuracy by round in every regime of bad clients, made from the results file alone.

One panel a regime, one line a policy (the mean over seeds) with its 95% band, from ``regimes_curves.csv``
(``python -m bench.regimes ... --results DIR``); value-driven policies solid, value-guard and value-ucb thick,
the others dashed, the oracle and the clean federation dotted (the benchmark's own figure's styles).

    python -m bench.regimes.figure docs/results/regimes_curves.csv --out docs/figures/regimes-quick-mlp.png
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from simulations.experiments.noisy_federation.figures import VALUE_DRIVEN, REFERENCES

COLUMNS = ("regime", "model", "federation", "policy", "round", "mean", "ci")
PANELS_PER_ROW = 4


def line_style(policy: str) -> dict:
    if policy in REFERENCES:
        return {"linestyle": ":", "linewidth": 1.5}
    return {"linestyle": "-" if policy in VALUE_DRIVEN else "--",
            "linewidth": 2.2 if policy in ("value-ucb", "value-guard") else 1.2}


def read_curves(path: Path) -> pd.DataFrame:
    """``regimes_curves.csv`` as a frame, ValueError naming the file when a column is missing."""
    curves = pd.read_csv(path, comment="#")
    missing = [c for c in COLUMNS if c not in curves.columns]
    if missing:
        raise ValueError(f"curves: expected the columns {list(COLUMNS)} of regimes_curves.csv; {path} lacks {missing}.")
    return curves


def regimes_figure(curves: pd.DataFrame, out: Path, *, seeds: str = "") -> Path:
    """A PNG at ``out``: one panel a regime (in the file's order), its lines :func:`line_style`'s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(dict.fromkeys(curves["regime"]))
    policies = list(dict.fromkeys(curves["policy"]))
    cmap = plt.get_cmap("tab20")
    colors = {p: cmap(k % 20) for k, p in enumerate(policies)}
    rows = math.ceil(len(regimes) / PANELS_PER_ROW)
    fig, axes = plt.subplots(rows, PANELS_PER_ROW, figsize=(4.2 * PANELS_PER_ROW, 3.4 * rows), squeeze=False,
                             sharex=True, sharey=True)
    for k, regime in enumerate(regimes):
        ax = axes[k // PANELS_PER_ROW][k % PANELS_PER_ROW]
        for policy, line in curves[curves["regime"] == regime].groupby("policy", sort=False):
            ax.plot(line["round"], line["mean"], color=colors[policy], label=policy, **line_style(policy))
            half = line["ci"].fillna(0.0)
            ax.fill_between(line["round"], line["mean"] - half, line["mean"] + half, color=colors[policy], alpha=0.12)
        ax.set_title(regime, fontsize=10)
        ax.grid(alpha=0.3)
    for k in range(len(regimes), rows * PANELS_PER_ROW):
        axes[k // PANELS_PER_ROW][k % PANELS_PER_ROW].axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("round")
    for row in axes:
        row[0].set_ylabel("test accuracy")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower right", fontsize=8, ncol=2)
    fig.suptitle(f"test accuracy by round, every regime of bad clients{seeds} (mean, 95% band)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.regimes.figure", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("curves", type=Path, help="regimes_curves*.csv")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--seeds", default="", help="the seeds, for the title (e.g. 1-5)")
    args = parser.parse_args(argv)
    if not args.curves.is_file():
        parser.error(f"curves: expected a results file; got {str(args.curves)!r}")
    try:
        curves = read_curves(args.curves)
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote {regimes_figure(curves, args.out, seeds=f', seeds {args.seeds}' if args.seeds else '')}")


if __name__ == "__main__":
    main()
