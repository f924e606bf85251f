"""The benchmark's figures: test accuracy against rounds and against wall-clock seconds, one line
per policy (mean over seeds) with its 95% band, one row per noisy federation, one file per model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simulations.experiments.noisy_federation.measures import accuracy_bands

#: Value-driven policies drawn solid, the others dashed; the references dotted.
VALUE_DRIVEN = ("greedyfed", "value-ucb", "value-guard", "topk-ads", "topk-loo", "value-weighted")
REFERENCES = ("oracle", "clean")
GRID_POINTS = 200


def _style(policy: str) -> dict:
    if policy in REFERENCES:
        return {"linestyle": ":", "linewidth": 1.5}
    return {"linestyle": "-" if policy in VALUE_DRIVEN else "--", "linewidth": 2.0 if policy in ("value-ucb", "value-guard")
            else 1.2}


def _panel(ax, bands: pd.DataFrame, colors: dict, xlabel: str, title: str) -> None:
    for policy, rows in bands.groupby("policy", sort=False):
        ax.plot(rows["x"], rows["mean"], color=colors[policy], label=policy, **_style(policy))
        half = rows["ci"].fillna(0.0)
        ax.fill_between(rows["x"], rows["mean"] - half, rows["mean"] + half, color=colors[policy], alpha=0.15)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)


def accuracy_figures(curves: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One PNG per model in ``out_dir`` (``accuracy-<model>.png``); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    policies = list(dict.fromkeys(curves["policy"]))
    cmap = plt.get_cmap("tab20")
    colors = {p: cmap(k % 20) for k, p in enumerate(policies)}
    for model, of_model in curves.groupby("model", sort=False):
        clean = of_model[of_model["federation"] == "clean"]
        feds = [f for f in dict.fromkeys(of_model["federation"]) if f != "clean"]
        fig, axes = plt.subplots(len(feds), 2, figsize=(13, 4.5 * len(feds)), squeeze=False)
        for row, fed in enumerate(feds):
            rows = pd.concat([of_model[of_model["federation"] == fed], clean])
            horizon = rows.groupby(["policy", "seed"])["seconds"].sum().median()
            grid = np.linspace(0.0, float(horizon), GRID_POINTS)
            seeds = rows["seed"].nunique()
            _panel(axes[row][0], accuracy_bands(rows, by="round"), colors, "round",
                   f"{model}, flip probability {fed[1:]} ({seeds} seeds)")
            _panel(axes[row][1], accuracy_bands(rows, by="seconds", grid=grid), colors, "wall-clock seconds",
                   f"{model}, flip probability {fed[1:]}: against time (valuation included)")
        axes[0][1].legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        path = Path(out_dir) / f"accuracy-{model}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
