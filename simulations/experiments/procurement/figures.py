"""Figures 5 and 6 of [ADS] §6.3 for the ``procurement`` simulation (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

RULE_COLORS = {"ads": "tab:blue", "loo": "tab:orange", "random": "tab:green"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure5(path: Path, summary: pd.DataFrame, confidence: float, seeds: int) -> None:
    """AvgErr per stage and rule: mean over seeds with its confidence band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for rule, rows in summary.groupby("rule", sort=False):
        color = RULE_COLORS.get(rule)
        ax.plot(rows["stage"], rows["mean"], marker="o", markersize=3, color=color, label=rule.upper())
        ax.fill_between(rows["stage"], rows["ci_low"], rows["ci_high"], color=color, alpha=0.2)
    ax.set_xlabel("stage (0: the biased initial model)")
    ax.set_ylabel("AvgErr of the OLS part-worths")
    ax.set_title(f"staged procurement: mean over {seeds} seeds, {confidence:.0%} band")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def figure6(path: Path, shares: pd.DataFrame, seeds: int) -> None:
    """Share of purchases by the offer's noise share, per stage: one stacked-bar panel per rule."""
    plt = _pyplot()
    rules = list(dict.fromkeys(shares["rule"]))
    fig, axes = plt.subplots(1, len(rules), figsize=(5 * len(rules), 4), squeeze=False)
    levels = sorted(shares["noise_share"].unique())
    colors = plt.get_cmap("viridis_r")([0.1 + 0.8 * k / max(1, len(levels) - 1) for k in range(len(levels))])
    for ax, rule in zip(axes[0], rules):
        rows = shares[shares["rule"] == rule].pivot(index="stage", columns="noise_share", values="share")
        bottom = None
        for color, level in zip(colors, levels):
            ax.bar(rows.index, rows[level], bottom=bottom, color=color, width=0.9, label=f"{level:.0%} noisy")
            bottom = rows[level] if bottom is None else bottom + rows[level]
        ax.set_ylim(0, 1)
        ax.set_xlabel("stage")
        ax.set_ylabel(f"share of purchases over {seeds} seeds")
        ax.set_title(f"purchases by {rule.upper()}")
    axes[0][-1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
