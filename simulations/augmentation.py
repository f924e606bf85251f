"""Valuing synthetic data: remove/add augmentations by their value ([ADS] §6.1.1, Figure 2).

Each run draws originals and one synthetic instance per original (image augmentation on
digits or MNIST; Borderline-SMOTE rows on breast cancer; :mod:`simulations.synthetic_data`),
takes σ = (originals, synthetic) and a K-NN model, and values the synthetic instances by

* ``knn-ads``: exact KNN-ADS ([ADS] Thm 5.1) with σ; ``mc-ads``: MC-ADS ([ADS] Alg. 1) with σ,
  ``permutations`` permutations, by the incremental KNN utility;
* ``knn-ds``: exact KNN-Shapley ([KNNSV]), one group; ``mc-ds``: MC Data Shapley, one group;
* ``loo``: v(D) − v(D ∖ {i}) on the full set; ``random``: a random ranking.

Ties in value (common: far instances are worth exactly 0) are broken at random. Then, for
fractions 0 … ``max_fraction`` of the synthetic instances, the four panels of Figure 2:
(a) remove the lowest valued from the full set, (b) remove the highest, (c) add the lowest
to the originals, (d) add the highest. The model is refit (a K-NN majority vote in the
same neighbour order, ties to the smallest label) and its test accuracy divided by the baseline's: the full set for (a)/(b),
the originals for (c)/(d). The valued utility (KNN likelihood of the right label) is
recorded beside it. Runs use seeds seed, seed+1, ...; the figure shows the mean and a 95%
t-interval over runs.

A valuation that tracks incremental value ranks ADS first: the highest relative accuracy in
(a) and (d), the lowest in (b) and (c). ``orderings.csv`` holds, per panel, each method's
mean relative accuracy over the non-zero fractions and whether ADS beats DS and LOO.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedvalue.knn_ads import knn_ads
from fedvalue.knn_mc import knn_loo, knn_mc_ads
from fedvalue.knn_utility import KnnUtility
from simulations.settings import check_integers, check_numbers
from simulations.synthetic_data import DATASETS, OriginalsAndSynthetic, originals_and_synthetic

METHODS = ("knn-ads", "mc-ads", "knn-ds", "mc-ds", "loo", "random")
PANELS = {
    "a": ("remove", "lowest"),
    "b": ("remove", "highest"),
    "c": ("add", "lowest"),
    "d": ("add", "highest"),
}
#: Direction in which a panel's relative accuracy is better for a valuation that tracks value.
BETTER = {"a": "higher", "b": "lower", "c": "lower", "d": "higher"}


@dataclass(frozen=True)
class AugmentationConfig:
    seed: int = 0
    runs: int = 10
    dataset: str = "digits"
    mnist_path: str = ""
    train_per_class: int = 50
    test_per_class: int = 50
    rotation: float = 45.0
    shift: float = 0.0625
    scale: float = 0.1
    imbalance: float = 0.25
    smote_neighbors: int = 3
    k: int = 5
    permutations: int = 500
    max_fraction: float = 0.3
    fraction_steps: int = 6

    def check(self) -> None:
        check_integers(self, ("runs", "train_per_class", "test_per_class", "smote_neighbors", "k", "permutations",
                              "fraction_steps"))
        check_integers(self, ("seed",), minimum=0)
        check_numbers(self, ("rotation", "shift", "scale"), zero_ok=True)
        check_numbers(self, ("imbalance", "max_fraction"))
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset: expected one of {list(DATASETS)}; got {self.dataset!r}.")
        if self.dataset == "mnist" and not self.mnist_path:
            raise ValueError("mnist_path: expected a directory of MNIST IDX files or an .npz for the mnist dataset "
                             "(MNIST is never downloaded); got none.")
        if self.max_fraction > 1:
            raise ValueError(f"max_fraction: expected a share of the synthetic instances in (0, 1]; got "
                             f"{self.max_fraction!r}.")
        if self.scale >= 1:
            raise ValueError(f"scale: expected a zoom range 1 ± scale with scale < 1; got {self.scale!r}.")
        if self.imbalance > 1:
            raise ValueError(f"imbalance: expected the minority share of the majority count, in (0, 1]; got "
                             f"{self.imbalance!r}.")


def value_synthetic(data: OriginalsAndSynthetic, k: int, permutations: int,
                    rng: np.random.Generator) -> pd.DataFrame:
    """Every method's value of every training instance (rows: instances; columns: METHODS)."""
    x, y, x_test, y_test = data.x_train, data.y_train, data.x_test, data.y_test
    n, n_original = len(y), data.num_original
    sigma = [np.arange(n_original), np.arange(n_original, n)]
    everyone = [np.arange(n)]
    mc_seeds = rng.spawn(2)
    columns = {
        "knn-ads": knn_ads(x, y, x_test, y_test, sigma, k=k).instances.values,
        "mc-ads": knn_mc_ads(x, y, x_test, y_test, sigma, k=k, num_permutations=permutations, seed=mc_seeds[0]).values,
        "knn-ds": knn_ads(x, y, x_test, y_test, everyone, k=k).instances.values,
        "mc-ds": knn_mc_ads(x, y, x_test, y_test, everyone, k=k, num_permutations=permutations,
                            seed=mc_seeds[1]).values,
        "loo": knn_loo(x, y, x_test, y_test, k=k).values,
    }
    frame = pd.DataFrame({name: values.sort_index().to_numpy(float) for name, values in columns.items()})
    frame["random"] = rng.random(n)
    frame.index.name = "instance"
    frame.insert(0, "group", np.where(frame.index < n_original, "original", "synthetic"))
    return frame


def intervention_curves(data: OriginalsAndSynthetic, values: pd.DataFrame, config: AugmentationConfig,
                        rng: np.random.Generator) -> pd.DataFrame:
    """Relative accuracy of the four Figure 2 interventions for every method and fraction."""
    x, y = data.x_train, data.y_train
    n, n_original = len(y), data.num_original
    synthetic = np.arange(n_original, n)
    utility = KnnUtility(x, y, data.x_test, data.y_test, config.k)

    def scores(members: np.ndarray) -> tuple[float, float]:
        return utility.accuracy(members), utility(members)

    baselines = {"remove": scores(np.arange(n)), "add": scores(np.arange(n_original))}
    fractions = np.linspace(0.0, config.max_fraction, config.fraction_steps + 1)
    tie_breaker = rng.random(len(synthetic))
    rows = []
    for method in METHODS:
        # Ascending by value, ties in random order.
        ranked = synthetic[np.lexsort((tie_breaker, values[method].to_numpy()[synthetic]))]
        for panel, (action, end) in PANELS.items():
            for fraction in fractions:
                count = int(round(fraction * len(synthetic)))
                chosen = ranked[:count] if end == "lowest" else ranked[len(ranked) - count:]
                if action == "remove":
                    members = np.setdiff1d(np.arange(n), chosen)
                else:
                    members = np.concatenate([np.arange(n_original), np.sort(chosen)])
                accuracy, knn_utility = scores(members)
                base_accuracy, base_utility = baselines[action]
                rows.append({"method": method, "panel": panel, "action": action, "which": end,
                             "fraction": float(fraction), "count": count, "accuracy": accuracy,
                             "relative_accuracy": accuracy / base_accuracy, "knn_utility": knn_utility,
                             "relative_utility": knn_utility / base_utility})
    return pd.DataFrame(rows)


def summarize(curves: pd.DataFrame) -> pd.DataFrame:
    """Mean and 95% t-interval over runs of the relative accuracy, per method, panel, fraction."""
    from scipy import stats

    grouped = curves.groupby(["panel", "method", "fraction"], sort=True)["relative_accuracy"]
    summary = grouped.agg(["mean", "std", "count"]).reset_index()
    t = np.array([stats.t.ppf(0.975, c - 1) if c > 1 else np.nan for c in summary["count"]])
    half = t * summary["std"].fillna(0.0) / np.sqrt(summary["count"])
    summary["ci_low"], summary["ci_high"] = summary["mean"] - half, summary["mean"] + half
    return summary


def orderings(curves: pd.DataFrame) -> pd.DataFrame:
    """Per panel: each method's mean relative accuracy over fractions > 0, and whether ADS (exact
    and MC) beats DS and LOO in the panel's better direction."""
    later = curves[curves["fraction"] > 0]
    table = later.groupby(["panel", "method"])["relative_accuracy"].mean().unstack("method")[list(METHODS)]
    verdicts = []
    for panel, row in table.iterrows():
        def beats(ads: str, ds: str) -> bool:
            if BETTER[panel] == "higher":
                return bool(row[ads] > max(row[ds], row["loo"]))
            return bool(row[ads] < min(row[ds], row["loo"]))

        verdicts.append({"panel": panel, "better": BETTER[panel],
                         "knn_ads_beats_knn_ds_and_loo": beats("knn-ads", "knn-ds"),
                         "mc_ads_beats_mc_ds_and_loo": beats("mc-ads", "mc-ds")})
    return table.reset_index().merge(pd.DataFrame(verdicts), on="panel")


def plot(summary: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {"a": "(a) remove lowest", "b": "(b) remove highest", "c": "(c) add lowest", "d": "(d) add highest"}
    figure, axes = plt.subplots(1, 4, figsize=(16, 3.8), constrained_layout=True)
    for axis, panel in zip(axes, PANELS):
        for method in METHODS:
            part = summary[(summary["panel"] == panel) & (summary["method"] == method)]
            percent = 100 * part["fraction"].to_numpy()
            axis.plot(percent, part["mean"], marker="o", markersize=3, label=method)
            if part["ci_low"].notna().all():
                axis.fill_between(percent, part["ci_low"], part["ci_high"], alpha=0.15)
        axis.set_title(titles[panel])
        axis.set_xlabel("% of synthetic instances")
    axes[0].set_ylabel("relative accuracy")
    axes[-1].legend(fontsize=8)
    figure.suptitle(title)
    figure.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(figure)


def run_augmentation(config: AugmentationConfig, out: str | Path, *, overwrite: bool = False,
                     on_stage: Callable[[str], None] | None = None) -> str:
    """Run every seed, write values.csv, curves.csv, summary.csv, orderings.csv, figure2.png
    and config.json to ``out``; return the orderings table as text."""
    from fedvalue.ledger import write_json

    config.check()
    out = prepare_out(out, overwrite)
    say = on_stage or (lambda line: None)
    all_values, all_curves = [], []
    for run in range(config.runs):
        seed = config.seed + run
        data_rng, value_rng, curve_rng = np.random.default_rng(seed).spawn(3)
        started = time.perf_counter()
        data = originals_and_synthetic(config.dataset, config.mnist_path, config.train_per_class,
                                       config.test_per_class, data_rng, rotation=config.rotation, shift=config.shift,
                                       scale=config.scale, imbalance=config.imbalance,
                                       smote_neighbors=config.smote_neighbors)
        say(f"run {run + 1}/{config.runs} (seed {seed}): {data.num_original} originals + {len(data.y_synthetic)} "
            f"synthetic, {len(data.y_test)} test ({time.perf_counter() - started:.1f}s)")
        started = time.perf_counter()
        values = value_synthetic(data, config.k, config.permutations, value_rng)
        say(f"run {run + 1}/{config.runs}: values by {', '.join(METHODS)} ({config.permutations} permutations for MC) "
            f"({time.perf_counter() - started:.1f}s)")
        started = time.perf_counter()
        curves = intervention_curves(data, values, config, curve_rng)
        say(f"run {run + 1}/{config.runs}: interventions, {len(curves)} refits ({time.perf_counter() - started:.1f}s)")
        all_values.append(values.reset_index().assign(seed=seed))
        all_curves.append(curves.assign(seed=seed))
    curves = pd.concat(all_curves, ignore_index=True)
    summary = summarize(curves)
    table = orderings(curves)
    pd.concat(all_values, ignore_index=True).to_csv(out / "values.csv", index=False)
    curves.to_csv(out / "curves.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    table.to_csv(out / "orderings.csv", index=False)
    write_json(out / "config.json", {"simulation": "augmentation", **dataclasses.asdict(config)})
    plot(summary, out / "figure2.png", f"{config.dataset}: relative accuracy, mean of {config.runs} run(s), K = {config.k}")
    say(f"wrote values.csv, curves.csv, summary.csv, orderings.csv, figure2.png to {out}")
    return format_orderings(table)


def format_orderings(table: pd.DataFrame) -> str:
    lines = ["mean relative accuracy over fractions > 0 (better: (a), (d) higher; (b), (c) lower)",
             f"{'panel':<6}" + "".join(f"{m:>9}" for m in METHODS) + "   ADS beats DS and LOO (knn / mc)"]
    for _, row in table.iterrows():
        lines.append(f"{row['panel']:<6}" + "".join(f"{row[m]:>9.4f}" for m in METHODS)
                     + f"   {'yes' if row['knn_ads_beats_knn_ds_and_loo'] else 'no'} / "
                       f"{'yes' if row['mc_ads_beats_mc_ds_and_loo'] else 'no'}")
    return "\n".join(lines)


def prepare_out(out: str | Path, overwrite: bool) -> Path:
    """``out`` as a directory to write into; an existing non-empty one only with ``overwrite``."""
    if out is None or str(out) == "":
        raise ValueError("out: expected an output directory (--out DIR); got none.")
    path = Path(out).expanduser()
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise ValueError(f"out: {path} already holds files; pass --overwrite to replace them or choose another "
                         "directory.")
    path.mkdir(parents=True, exist_ok=True)
    return path


__all__ = ["AugmentationConfig", "METHODS", "PANELS", "run_augmentation"]


def cli_main(config, options) -> int:
    """``fedvalue run augmentation``: the runs, the table and the figure."""
    table = run_augmentation(config, options.out, overwrite=options.overwrite, on_stage=options.say())
    print(table)
    print(f"done in {options.elapsed():.1f}s; tables and figure in {options.out}")
    return 0
