"""Valuing synthetic data: remove/add augmentations by their value ([ADS] §6.1.1, Figure 2).

Each seed draws originals and one synthetic instance per original (image augmentation on
digits or MNIST; Borderline-SMOTE rows on breast cancer; :mod:`simulations.experiments.synthetic_data.synthetic_data`),
takes σ = (originals, synthetic) and a model, and values the synthetic instances as [ADS]
§6.1 and App. C.1 did:

* ``knn-ads``: exact KNN-ADS ([ADS] Thm 5.1) with σ, on the KNN surrogate utility (the
  likelihood of the right label among the K nearest); ``knn-ds``: exact KNN-Shapley ([KNNSV]);
  both for the K-NN model only;
* ``mc-ads``: MC-ADS ([ADS] Alg. 1) with σ, v(S) = test accuracy of the model retrained on
  S, ``permutations`` σ-respecting permutations (group 2 walked on top of all originals;
  the originals' own values do not enter the figure and are not computed);
* ``tmc-ds``: TMC Data Shapley (Ghorbani & Zou, whose code [ADS] used for MC-DS) on the same
  retrained accuracy, one group, a permutation truncated once |v(D) − v(prefix)| <
  ``truncation_tolerance`` (0: plain MC-DS);
* ``loo``: v(D) − v(D ∖ {i}) by retraining without i ("implemented by retraining without it
  and measuring the test-accuracy drop", App. C.1.1); ``random``: a random ranking.

The model (``model``) is the K-NN majority vote (``knn``: retraining is the vote over the new
set's nearest neighbours) or L2-regularized logistic regression as liblinear fits it
(``logistic``, [ADS]'s non-KNN row, which used Omniglot with DAGAN images; here on the
binary breast-cancer data with Borderline-SMOTE rows), both in
:mod:`simulations.experiments.synthetic_data.models`, refit along permutations by
:func:`fedvalue.valuation.prefix_mc.prefix_mc_ads`. App. C.1 reports that its Monte Carlo estimates
"stabilize after 5,000 / 3,000 / 2,000 permutations" (Adult / MNIST / Omniglot); the default
is 3,000, and ``convergence.csv`` states, per seed and method, the largest standard error of
a synthetic value against the spread of the values.

``utility`` scores the retrained model for MC-ADS, TMC-DS and LOO: the paper's test accuracy,
or (K-NN) the K-NN likelihood of the right label (the surrogate, which moves whenever an
instance enters a test point's K nearest; accuracy moves only when it flips a vote, so most
marginals are exactly 0). ``ties.csv`` gives, per seed and method, the share of synthetic
values equal to another synthetic value, the share exactly 0 and the number of distinct
values (:func:`tie_shares`); ``--results FOLDER`` keeps it as the docs' results file
(:mod:`simulations.experiments.synthetic_data.markdown`), and the tables the run prints as
:data:`PRINTED_RESULTS`.

**Ties** (``ties``). ``unranked`` (the default): tied values are not ordered; a fraction whose
chosen set would split a group of tied values is not measured (NaN in ``curves.csv``, left out
of the means; ``decided`` in ``orderings.csv`` is the share of (seed, fraction) cells that
were), so every plotted point is ordered by the values alone. ``random``: ties broken in a
seeded random order (this simulation's earlier rule; the curves then continue through the
tied block, in random order). Then, for fractions 0 … ``max_fraction`` of the synthetic
instances, the four panels of Figure 2:
(a) remove the lowest valued from the full set, (b) remove the highest, (c) add the lowest
to the originals, (d) add the highest. The model is retrained on each set and its test
accuracy divided by the baseline's: the full set for (a)/(b), the originals for (c)/(d).
With the K-NN model the surrogate utility is recorded beside it. Seeds seed, seed+1, ...,
seed+seeds−1; the figure shows the mean and a 95% t-interval over seeds.

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
from threadpoolctl import threadpool_limits

from fedvalue import KnnUtility, knn_ads, prefix_loo, prefix_mc_ads, prefix_values
from simulations.experiments.synthetic_data.markdown import TIES_RESULTS
from simulations.experiments.synthetic_data.models import MODELS, UTILITIES, prefix_model
from simulations.experiments.synthetic_data.synthetic_data import (
    DATASETS,
    OriginalsAndSynthetic,
    originals_and_synthetic,
)
from simulations.runner import (
    Simulation,
    check_integers,
    check_numbers,
    prepare_run_dir,
    write_results,
    write_run_config,
)

#: Valuation methods per model (module docstring).
METHODS_BY_MODEL = {"knn": ("knn-ads", "mc-ads", "knn-ds", "tmc-ds", "loo", "random"),
                    "logistic": ("mc-ads", "tmc-ds", "loo", "random")}
METHODS = METHODS_BY_MODEL["knn"]
#: ADS against its symmetric counterpart: (ADS method, DS method) pairs compared in orderings.csv.
PAIRS = (("knn-ads", "knn-ds"), ("mc-ads", "tmc-ds"))
PANELS = {
    "a": ("remove", "lowest"),
    "b": ("remove", "highest"),
    "c": ("add", "lowest"),
    "d": ("add", "highest"),
}
#: Direction in which a panel's relative accuracy is better for a valuation that tracks value.
BETTER = {"a": "higher", "b": "lower", "c": "lower", "d": "higher"}

#: Help of the options that are this simulation's own (``fedvalue run augmentation --help``).
AUGMENTATION_HELP = {
    "seeds": "seeds run and averaged in the figure (seed, seed+1, ...)",
    "model": "model retrained by MC-ADS, TMC-DS, LOO and the interventions: knn (majority vote) or logistic "
             "(liblinear-style L2 logistic regression; binary data: breast-cancer)",
    "permutations": "permutations of MC-ADS and TMC-DS per seed ([ADS] App. C.1: 2,000-5,000)",
    "truncation_tolerance": "TMC-DS: a permutation stops once the prefix's accuracy is within this of the full "
                            "set's (0 = plain MC-DS)",
    "utility": "what MC-ADS, TMC-DS and LOO score the retrained model by: accuracy (the paper's) or likelihood "
               "(knn: the K-NN likelihood of the right label, few ties)",
    "ties": "ordering of tied values in the interventions: unranked (a fraction that would split tied values is not "
            "measured) or random (ties in seeded random order)",
}
#: How tied values are ordered in the interventions (module docstring).
TIE_RULES = ("unranked", "random")
#: The results file of the tables the run prints (orderings, then tie shares), which the docs quote as blocks.
PRINTED_RESULTS = "augmentation_printed.txt"


@dataclass(frozen=True)
class AugmentationConfig:
    seed: int = 0
    seeds: int = 10
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
    permutations: int = 3000
    max_fraction: float = 0.3
    fraction_steps: int = 6
    model: str = "knn"
    truncation_tolerance: float = 0.01
    utility: str = "accuracy"
    ties: str = "unranked"

    @property
    def methods(self) -> tuple[str, ...]:
        return METHODS_BY_MODEL[self.model]

    def check(self) -> None:
        check_integers(self, ("seeds", "train_per_class", "test_per_class", "smote_neighbors", "k", "permutations",
                              "fraction_steps"))
        check_integers(self, ("seed",), minimum=0)
        check_numbers(self, ("rotation", "shift", "scale", "truncation_tolerance"), zero_ok=True)
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
        if self.model not in MODELS:
            raise ValueError(f"model: expected one of {list(MODELS)}; got {self.model!r}.")
        if self.utility not in UTILITIES or (self.utility == "likelihood" and self.model != "knn"):
            raise ValueError(f"utility: expected one of {list(UTILITIES)} ('likelihood' with the knn model only); "
                             f"got {self.utility!r} with model {self.model!r}.")
        if self.ties not in TIE_RULES:
            raise ValueError(f"ties: expected one of {list(TIE_RULES)}; got {self.ties!r}.")
        if self.model == "logistic" and self.dataset != "breast-cancer":
            raise ValueError(f"model: 'logistic' is the binary logistic regression; expected dataset 'breast-cancer' "
                             f"(two classes); got {self.dataset!r}.")


def value_synthetic(data: OriginalsAndSynthetic, config: AugmentationConfig,
                    rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every method's value of every training instance (rows: instances; columns: the model's
    methods; NaN where a method values the synthetic group only) and the convergence table."""
    x, y, x_test, y_test = data.x_train, data.y_train, data.x_test, data.y_test
    n, n_original = len(y), data.num_original
    sigma = [np.arange(n_original), np.arange(n_original, n)]
    model = prefix_model(config.model, x, y, x_test, y_test, config.k, config.utility)
    mc_seeds = rng.spawn(2)
    results = {}
    if config.model == "knn":
        results["knn-ads"] = knn_ads(x, y, x_test, y_test, sigma, k=config.k).instances
        results["knn-ds"] = knn_ads(x, y, x_test, y_test, [np.arange(n)], k=config.k).instances
    results["mc-ads"] = prefix_mc_ads(model, sigma, num_permutations=config.permutations, seed=mc_seeds[0],
                                      values_of=[1])
    results["tmc-ds"] = prefix_mc_ads(model, [np.arange(n)], num_permutations=config.permutations, seed=mc_seeds[1],
                                      truncation_tolerance=config.truncation_tolerance)
    results["loo"] = prefix_loo(model)
    frame = pd.DataFrame({name: results[name].values.sort_index().to_numpy(float)
                          for name in config.methods if name != "random"})
    frame["random"] = rng.random(n)
    frame = frame[list(config.methods)]
    frame.index.name = "instance"
    frame.insert(0, "group", np.where(frame.index < n_original, "original", "synthetic"))
    convergence = []
    for name in ("mc-ads", "tmc-ds"):
        stderr = results[name].stderr.sort_index().to_numpy(float)[n_original:]
        values = frame[name].to_numpy(float)[n_original:]
        convergence.append({"method": name, "permutations": config.permutations,
                            "evaluations": results[name].num_evaluations, "max_stderr": float(np.max(stderr)),
                            "median_stderr": float(np.median(stderr)), "value_std": float(np.std(values))})
    return frame, pd.DataFrame(convergence)


def intervention_curves(data: OriginalsAndSynthetic, values: pd.DataFrame, config: AugmentationConfig,
                        rng: np.random.Generator) -> pd.DataFrame:
    """Relative accuracy of the four Figure 2 interventions for every method and fraction, the
    model retrained on every set (with the K-NN model, the surrogate utility beside it)."""
    x, y = data.x_train, data.y_train
    n, n_original = len(y), data.num_original
    synthetic = np.arange(n_original, n)
    fractions = np.linspace(0.0, config.max_fraction, config.fraction_steps + 1)
    tie_breaker = rng.random(len(synthetic))
    rows, masks = [], []
    for method in config.methods:
        # Ascending by value, ties in random order (used only where ``ties`` is random).
        order = np.lexsort((tie_breaker, values[method].to_numpy()[synthetic]))
        ranked, sorted_values = synthetic[order], values[method].to_numpy()[synthetic][order]
        for panel, (action, end) in PANELS.items():
            for fraction in fractions:
                count = int(round(fraction * len(synthetic)))
                cut = count if end == "lowest" else len(ranked) - count
                chosen = ranked[:count] if end == "lowest" else ranked[cut:]
                mask = np.ones(n, dtype=bool) if action == "remove" else np.arange(n) < n_original
                mask[chosen] = action == "add"
                masks.append(mask)
                rows.append({"method": method, "panel": panel, "action": action, "which": end,
                             "fraction": float(fraction), "count": count,
                             "decided": config.ties == "random" or splits_no_tie(sorted_values, cut)})
    baselines = {"remove": np.ones(n, dtype=bool), "add": np.arange(n) < n_original}
    masks = np.array([*masks, baselines["remove"], baselines["add"]])
    accuracy = prefix_values(prefix_model(config.model, x, y, data.x_test, data.y_test, config.k), masks)
    surrogate = np.full(len(masks), np.nan)
    if config.model == "knn":
        utility = KnnUtility(x, y, data.x_test, data.y_test, config.k)
        surrogate = np.array([utility(np.flatnonzero(mask)) for mask in masks])
    base = {"remove": (accuracy[-2], surrogate[-2]), "add": (accuracy[-1], surrogate[-1])}
    for row, acc, knn_utility in zip(rows, accuracy, surrogate):
        base_accuracy, base_utility = base[row["action"]]
        decided = row["decided"]
        row.update(accuracy=float(acc) if decided else np.nan,
                   relative_accuracy=float(acc / base_accuracy) if decided else np.nan,
                   knn_utility=float(knn_utility) if decided else np.nan,
                   relative_utility=float(knn_utility / base_utility) if decided else np.nan)
    return pd.DataFrame(rows)


def splits_no_tie(sorted_values: np.ndarray, cut: int) -> bool:
    """Whether cutting the ascending ``sorted_values`` before position ``cut`` leaves every group
    of equal values on one side (the chosen set is then decided by the values alone)."""
    return cut <= 0 or cut >= len(sorted_values) or bool(sorted_values[cut - 1] != sorted_values[cut])


def tie_shares(values: pd.DataFrame, methods) -> pd.DataFrame:
    """Per method, over the synthetic instances: the share whose value equals another's (``tied``),
    the share exactly 0 (``zero``) and the number of distinct values."""
    synthetic = values[values["group"] == "synthetic"]
    rows = []
    for method in methods:
        v = synthetic[method].to_numpy(float)
        _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
        rows.append({"method": method, "instances": len(v), "tied": float(np.mean(counts[inverse] > 1)),
                     "zero": float(np.mean(v == 0.0)), "distinct": int(len(counts))})
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
    """Per panel: each method's mean relative accuracy over the measured fractions > 0, the share
    of (seed, fraction) cells it was measured at (``{method}_decided``), and whether each ADS
    method beats its symmetric counterpart and LOO in the panel's better direction, over the
    cells where all three were measured (NaN where there are none)."""
    methods = list(dict.fromkeys(curves["method"]))
    later = curves[curves["fraction"] > 0]
    table = later.groupby(["panel", "method"])["relative_accuracy"].mean().unstack("method")[methods]
    cells = later.pivot_table(index=["panel", "seed", "fraction"], columns="method", values="relative_accuracy",
                              dropna=False)
    verdicts = []
    for panel in table.index:
        here = cells.loc[panel]
        verdict = {"panel": panel, "better": BETTER[panel],
                   **{f"{method}_decided": float(here[method].notna().mean()) for method in methods}}
        for ads, ds in PAIRS:
            if ads not in here or ds not in here:
                continue
            common = here[[ads, ds, "loo"]].dropna().mean()
            if common.isna().any():
                verdict[f"{ads}_beats_{ds}_and_loo"] = np.nan
                continue
            rivals = (common[ds], common["loo"])
            verdict[f"{ads}_beats_{ds}_and_loo"] = bool(common[ads] > max(rivals) if BETTER[panel] == "higher"
                                                        else common[ads] < min(rivals))
        verdicts.append(verdict)
    return table.reset_index().merge(pd.DataFrame(verdicts), on="panel")


def plot(summary: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {"a": "(a) remove lowest", "b": "(b) remove highest", "c": "(c) add lowest", "d": "(d) add highest"}
    figure, axes = plt.subplots(1, 4, figsize=(16, 3.8), constrained_layout=True)
    for axis, panel in zip(axes, PANELS):
        for method in dict.fromkeys(summary["method"]):
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
    """Run every seed, write values.csv, curves.csv, summary.csv, orderings.csv, convergence.csv,
    ties.csv, figure2.png and run.json to ``out``; return the orderings table as text."""

    config.check()
    out = prepare_run_dir(out, overwrite=overwrite)
    say = on_stage or (lambda line: None)
    all_values, all_curves, all_convergence, all_ties = [], [], [], []
    with threadpool_limits(1, user_api="blas"):  # small products: extra BLAS threads only spin-wait
        for run in range(config.seeds):
            seed = config.seed + run
            data_rng, value_rng, curve_rng = np.random.default_rng(seed).spawn(3)
            started = time.perf_counter()
            data = originals_and_synthetic(config.dataset, config.mnist_path, config.train_per_class,
                                           config.test_per_class, data_rng, rotation=config.rotation,
                                           shift=config.shift, scale=config.scale, imbalance=config.imbalance,
                                           smote_neighbors=config.smote_neighbors)
            say(f"seed {seed} ({run + 1}/{config.seeds}): {data.num_original} originals + {len(data.y_synthetic)} "
                f"synthetic, {len(data.y_test)} test ({time.perf_counter() - started:.1f}s)")
            started = time.perf_counter()
            values, convergence = value_synthetic(data, config, value_rng)
            say(f"seed {seed}: values by {', '.join(config.methods)} ({config.permutations} permutations, "
                f"{config.model} retrained) ({time.perf_counter() - started:.1f}s)")
            started = time.perf_counter()
            curves = intervention_curves(data, values, config, curve_rng)
            say(f"seed {seed}: interventions, {len(curves)} refits ({time.perf_counter() - started:.1f}s)")
            all_ties.append(tie_shares(values, config.methods).assign(seed=seed))
            all_values.append(values.reset_index().assign(seed=seed))
            all_curves.append(curves.assign(seed=seed))
            all_convergence.append(convergence.assign(seed=seed))
    curves = pd.concat(all_curves, ignore_index=True)
    summary = summarize(curves)
    table = orderings(curves)
    pd.concat(all_values, ignore_index=True).to_csv(out / "values.csv", index=False)
    curves.to_csv(out / "curves.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    table.to_csv(out / "orderings.csv", index=False)
    pd.concat(all_convergence, ignore_index=True).to_csv(out / "convergence.csv", index=False)
    ties = pd.concat(all_ties, ignore_index=True)
    ties.to_csv(out / "ties.csv", index=False)
    write_run_config(out, {"simulation": "augmentation", **dataclasses.asdict(config)})
    model = f"{config.k}-NN" if config.model == "knn" else "logistic regression"
    plot(summary, out / "figure2.png", f"{config.dataset}, {model}: relative accuracy, mean of {config.seeds} seed(s)")
    say(f"wrote values.csv, curves.csv, summary.csv, orderings.csv, convergence.csv, ties.csv, figure2.png to {out}")
    return format_orderings(table) + "\n" + format_ties(ties)


def format_orderings(table: pd.DataFrame) -> str:
    methods = [m for m in METHODS_BY_MODEL["knn"] if m in table.columns]
    pairs = [(a, d) for a, d in PAIRS if f"{a}_beats_{d}_and_loo" in table.columns]
    lines = ["mean relative accuracy over fractions > 0 (better: (a), (d) higher; (b), (c) lower)",
             f"{'panel':<6}" + "".join(f"{m:>9}" for m in methods) + "   ADS beats DS and LOO ("
             + " / ".join(a for a, _ in pairs) + ")"]
    def verdict(value) -> str:
        return "n/a" if pd.isna(value) else "yes" if value else "no"

    for _, row in table.iterrows():
        lines.append(f"{row['panel']:<6}" + "".join(f"{row[m]:>9.4f}" for m in methods) + "   "
                     + " / ".join(verdict(row[f"{a}_beats_{d}_and_loo"]) for a, d in pairs))
    if any(f"{m}_decided" in table for m in methods):
        lines.append("share of (seed, fraction) cells decided by the values alone (ties unranked)")
        for _, row in table.iterrows():
            lines.append(f"{row['panel']:<6}" + "".join(f"{row.get(f'{m}_decided', np.nan):>9.2f}" for m in methods))
    return "\n".join(lines)


def format_ties(ties: pd.DataFrame) -> str:
    """Mean over seeds of each method's tie shares (:func:`tie_shares`)."""
    mean = ties.groupby("method", sort=False)[["tied", "zero", "distinct"]].mean()
    lines = ["synthetic values, mean over seeds: share tied with another value, share exactly 0, distinct values",
             f"{'method':<9}{'tied':>8}{'zero':>8}{'distinct':>10}"]
    lines += [f"{method:<9}{row['tied']:>8.3f}{row['zero']:>8.3f}{row['distinct']:>10.1f}" for method, row in mean.iterrows()]
    return "\n".join(lines)


__all__ = ["AugmentationConfig", "METHODS", "METHODS_BY_MODEL", "PANELS", "run_augmentation"]


def cli_main(config, options) -> int:
    """``fedvalue run augmentation``: the runs, the table and the figure."""
    table = run_augmentation(config, options.out, overwrite=options.overwrite, on_stage=options.say())
    print(table)
    if options.results:
        ties = pd.read_csv(Path(options.out).expanduser() / "ties.csv")
        written = write_results(options.results, {TIES_RESULTS: ties, PRINTED_RESULTS: table}, options.command)
        print(f"results files: {', '.join(map(str, written))}")
    print(f"done in {options.elapsed():.1f}s; tables and figure in {options.out}")
    return 0


#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("augmentation", AugmentationConfig, cli_main, help=AUGMENTATION_HELP,
                        results=(TIES_RESULTS, PRINTED_RESULTS))
