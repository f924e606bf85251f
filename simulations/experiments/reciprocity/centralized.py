"""Centralized reciprocity of [RECIP] §5: the healthcare models (§5.2) and MovieLens (§5.1).

Runs the experiments behind "the diabetes model is (0.75, 0.36)-Marginal-reciprocal, and (0.75, 0.76)-TracIn-
reciprocal. The breast cancer model is (0.75, 0.48)-Marginal-reciprocal and (0.75, 0.93)-
TracIn-reciprocal" (§5.2), the longer-training result of the workshop version ("When the
diabetes model is trained for 1000 steps ... the 75th percentile of reciprocity decreases
from 0.76 to 0.20", its Fig. 6), and, with ``dataset="movielens"``, §5.1
(:mod:`simulations.experiments.reciprocity.movielens`).

**Healthcare setup** (§5.2, footnote 4; the models and their two influences are in
:mod:`simulations.experiments.reciprocity.training`). One individual per example (569 for breast
cancer, 442 for diabetes); the diabetes target is left in its units (the paper normalizes
features only; ``target="standardized"`` is offered). Each repetition splits the data at
random into a training half Z and an inference half Z'; for an odd count the extra example
goes to either side with probability 1/2, so every example is in Z with probability exactly
1/2 (Theorem 3.2, Assumption 3.1). The model starts by predicting the average training
label (the workshop version's initialization; ``initialization="zero"`` starts at w = 0).

**Averaging over splits** ("measuring reciprocity is only possible in expectation over
random train/test splits ... we average measurements over 100 random splits"). The paper
does not say how; both rules are reported side by side. ``conditional``: an individual's
outflow is the mean of O_u over the splits that put u in Z and its inflow the mean of I_u
over the splits that put u in Z' (estimates of E[O_u | u ∈ Z] and E[I_u | u ∈ Z'], whose
ratio is E[O_u]/E[I_u] because P(u ∈ Z) = P(u ∈ Z') = 1/2). ``all-splits``: the mean over
all repetitions (0 when on the other side), the same quantity in expectation, but its ratio
carries the binomial noise of how often u landed on each side (≈ ±10% at 100 splits).
``averaging`` picks the headline and the per-individual table. Individuals that never
landed on one side (possible with few repetitions) are left out (``num_left_out``).

**Figures** (Def. 2.1, §2.2). α at p = 0.75 (:func:`fedvalue.flows.reciprocity_measures.alpha_at`) under
each influence and averaging, Pearson and Spearman correlation of inflow and outflow,
shares of negative inflows and outflows, the signal-to-noise ratio |mean|/std of each
individual's outflow and inflow across the splits that put it on that side (workshop
§5.2.1 reports its 90th percentile for Marginal), α along training (cumulative TracIn flows
every ``checkpoint_every`` steps; workshop Fig. 6), and the first-order check of App. C.1
(relative gap between the summed flows and the actual reduction of the inference loss). ``--results FOLDER``
keeps each data set's figures as the docs' results file (:mod:`simulations.experiments.reciprocity.markdown`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from fedvalue import ReciprocityReport, alpha_at, marginal_flows, reciprocity, reciprocity_ratio
from simulations.experiments.reciprocity.config import (
    AVERAGINGS,
    DATASETS,
    HEALTHCARE,
    PAPER,
    RECIPROCITY_HELP,
    ReciprocityConfig,
    check,
)
from simulations.experiments.reciprocity.markdown import RECIPROCITY_RESULTS, results_frames
from simulations.experiments.reciprocity.movielens import run_movielens_reciprocity
from simulations.experiments.reciprocity.training import marginal_split, tracin_split
from simulations.runner import Simulation, write_results

__all__ = [
    "DATASETS",
    "PAPER",
    "RECIPROCITY_HELP",
    "CentralizedReciprocityResult",
    "ReciprocityConfig",
    "check",
    "format_table",
    "run_centralized_reciprocity",
]

def _load(dataset: str, target: str) -> tuple[np.ndarray, np.ndarray]:
    """Raw features and labels/targets in float64.

    Not :func:`simulations.datasets.loaders.load_dataset`: that standardizes with whole-data
    statistics in float32 and standardizes the diabetes target, while the paper
    standardizes features with the training split's statistics and leaves the target.
    """
    from sklearn import datasets as sk_datasets  # slow import; only needed here

    if dataset == "breast-cancer":
        bunch = sk_datasets.load_breast_cancer()
        return bunch.data.astype(np.float64), bunch.target.astype(np.float64)
    bunch = sk_datasets.load_diabetes(scaled=False)
    y = bunch.target.astype(np.float64)
    if target == "standardized":
        y = (y - y.mean()) / y.std()
    return bunch.data.astype(np.float64), y


def _split(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A uniformly random half/half split; for odd n the extra example's side is a coin flip."""
    order = rng.permutation(n)
    cut = n // 2 + (int(rng.integers(2)) if n % 2 else 0)
    return order[:cut], order[cut:]


class _SideSums:
    """Per individual, sums (and squares) of the per-split outflows and inflows, with counts."""

    def __init__(self, n: int, checkpoints: int = 0) -> None:
        self.out, self.inn = np.zeros(n), np.zeros(n)
        self.out_sq, self.in_sq = np.zeros(n), np.zeros(n)
        self.out_steps, self.in_steps = np.zeros((checkpoints, n)), np.zeros((checkpoints, n))

    def add(self, train, infer, outflow, inflow, cumulative_out=None, cumulative_in=None) -> None:
        self.out[train] += outflow
        self.inn[infer] += inflow
        self.out_sq[train] += outflow**2
        self.in_sq[infer] += inflow**2
        if cumulative_out is not None:
            self.out_steps[:, train] += cumulative_out
            self.in_steps[:, infer] += cumulative_in


def _averaged(total: np.ndarray, times: np.ndarray, repetitions: int, averaging: str) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / times if averaging == "conditional" else total / repetitions


def _snr(total: np.ndarray, squares: np.ndarray, times: np.ndarray) -> np.ndarray:
    """|mean| / standard deviation (ddof 1) over the splits on that side; NaN with fewer than 2."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / times
        variance = (squares - times * mean**2) / (times - 1)
        return np.where(times > 1, np.abs(mean) / np.sqrt(np.maximum(variance, 0.0)), np.nan)


@dataclass(frozen=True)
class CentralizedReciprocityResult:
    """Outcome of :func:`run_centralized_reciprocity` (healthcare data sets).

    Attributes
    ----------
    config
        The configuration run.
    report
        Headline figures: the first influence of ``config.influences`` under ``config.averaging``.
    reports
        Every (influence, averaging) pair: ``reports["marginal", "all-splits"]``.
    individuals
        Per individual (index: row of the dataset): ``{influence}_inflow``, ``_outflow``,
        ``_ratio`` (headline averaging), ``times_train``, ``times_inference``.
    num_left_out
        Individuals never in one of the two splits (left out of the reports).
    snr
        Per influence: the 50th and 90th percentile over individuals of the outflow and
        inflow signal-to-noise ratio across splits.
    alpha_by_step
        TracIn α(p) on the flows summed over the first ``step`` steps, under both averagings.
    first_order_gap
        Mean over splits of |predicted − actual| / |actual| for the reduction of the
        summed inference loss over training (predicted: Σ of all TracIn flows; App. C.1).
    inference_quality
        Mean over splits of the final inference accuracy (breast cancer) or RMSE (diabetes).
    seconds
        Wall time of the run.
    """

    config: ReciprocityConfig
    report: ReciprocityReport
    reports: dict
    individuals: pd.DataFrame
    num_left_out: int
    snr: pd.DataFrame
    alpha_by_step: pd.DataFrame
    first_order_gap: float
    inference_quality: float
    seconds: float

    def head(self) -> str:
        c = self.config
        loss = ", loss 1/2 (f - y)^2" if c.model == "linear-half" else ""
        return (f"{c.dataset}: {PAPER[c.dataset]['model']} regression{loss}, T={c.steps_used}, "
                f"eta={c.learning_rate_used:g}, "
                f"{c.repetitions_used} splits, start {c.initialization_used}, influence {c.influence}, seed {c.seed}, "
                f"{self.seconds:.1f}s")

    def to_frame(self) -> pd.DataFrame:
        """The figures next to the paper's: index metric, columns ``measured``, ``paper``."""
        paper, c = PAPER[self.config.dataset], self.config
        at_p = c.p == 0.75
        rows: dict[str, tuple[float, float]] = {}
        at_paper_steps = c.steps_used == paper["steps"]
        for influence in c.influences:
            # The paper's α belongs to its T; diabetes also has the workshop's 1,000-step figure.
            published = (paper["alpha" if influence == "tracin" else "marginal_alpha"] if at_paper_steps
                         else paper.get(f"alpha_at_{c.steps_used}_steps", math.nan) if influence == "tracin"
                         else math.nan) if at_p else math.nan
            for averaging in AVERAGINGS:
                rows[f"{influence} alpha_at_p={c.p:g} ({averaging})"] = (self.reports[influence, averaging].alpha,
                                                                        published)
            report = self.reports[influence, c.averaging]
            rows[f"{influence} pearson"] = (report.pearson, math.nan)
            rows[f"{influence} spearman"] = (report.spearman, math.nan)
            rows[f"{influence} negative_inflow_share"] = (report.negative_inflow_share, math.nan)
            rows[f"{influence} negative_outflow_share"] = (report.negative_outflow_share, math.nan)
            rows[f"{influence} median_ratio"] = (report.median_ratio, math.nan)
            snr = self.snr.loc[influence]
            rows[f"{influence} outflow_snr_p50"] = (snr["outflow_p50"], math.nan)
            rows[f"{influence} outflow_snr_p90"] = (snr["outflow_p90"], paper.get("marginal_snr_p90", math.nan)
                                                    if influence == "marginal" else math.nan)
        steps = self.alpha_by_step.set_index("step")[c.averaging]
        for step in sorted({paper["steps"], 1000, c.steps_used}):
            if step in steps.index and step != c.steps_used:
                published = paper["alpha"] if step == paper["steps"] else paper.get(f"alpha_at_{step}_steps", math.nan)
                rows[f"tracin alpha at step {step}"] = (steps[step], published if at_p else math.nan)
        quality = "inference_accuracy" if paper["model"] == "logistic" else "inference_rmse"
        rows["individuals"] = (float(self.report.num_individuals), float(len(self.individuals)))
        rows["repetitions"] = (float(c.repetitions_used), float(paper["repetitions"]))
        rows["first_order_gap"] = (self.first_order_gap, math.nan)
        rows[quality] = (self.inference_quality, math.nan)
        frame = pd.DataFrame.from_dict(rows, orient="index", columns=["measured", "paper"])
        frame.index.name = "metric"
        return frame

    def to_dict(self) -> dict:
        return {
            "config": self.config.as_dict(),
            **self.report.to_dict(),
            "figures": {k: (None if math.isnan(v) else v) for k, v in self.to_frame()["measured"].items()},
            "paper_alpha": PAPER[self.config.dataset]["alpha"],
            "num_left_out": self.num_left_out,
            "first_order_gap": self.first_order_gap,
            "inference_quality": self.inference_quality,
            "seconds": self.seconds,
        }

    def write(self, out) -> None:
        """``{dataset}-figures.csv``, ``-individuals.csv``, ``-alpha-curve.csv``, ``-alpha-by-step.csv`` and
        ``-alpha-by-step.png`` (α along training, the workshop version's Fig. 6)."""
        name = self.config.dataset
        self.to_frame().to_csv(out / f"{name}-figures.csv")
        self.individuals.to_csv(out / f"{name}-individuals.csv")
        self.report.curve().to_csv(out / f"{name}-alpha-curve.csv", index=False)
        self.alpha_by_step.to_csv(out / f"{name}-alpha-by-step.csv", index=False)
        self.plot_alpha_by_step(out / f"{name}-alpha-by-step.png")

    def plot_alpha_by_step(self, path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        paper, c = PAPER[self.config.dataset], self.config
        figure, axis = plt.subplots(figsize=(6, 4), constrained_layout=True)
        for averaging in AVERAGINGS:
            axis.plot(self.alpha_by_step["step"], self.alpha_by_step[averaging], label=f"TracIn, {averaging} mean")
        marks = [(paper["steps"], paper["alpha"]), *([(1000, paper["alpha_at_1000_steps"])]
                                                    if "alpha_at_1000_steps" in paper else [])]
        axis.scatter(*zip(*marks), color="black", zorder=3, label="paper")
        axis.set_xlabel("gradient-descent steps")
        axis.set_ylabel(f"alpha at p = {c.p:g}")
        axis.set_title(f"{c.dataset}: reciprocity along training ({c.repetitions_used} splits)")
        axis.legend()
        figure.savefig(path, dpi=100, metadata={"Software": None})
        plt.close(figure)


def run_centralized_reciprocity(config: ReciprocityConfig | None = None) -> CentralizedReciprocityResult:
    """[RECIP] §5.2 on one healthcare dataset: flows averaged over random half/half splits.

    Parameters
    ----------
    config
        The run (default: ``ReciprocityConfig()``, breast cancer, the paper's 100 splits).

    Returns
    -------
    CentralizedReciprocityResult
        ``to_frame()`` puts the figures next to the paper's; :func:`format_table` prints.

    Raises
    ------
    ValueError
        A bad field of ``config`` (named in the message), or ``dataset="movielens"``
        (:func:`simulations.experiments.reciprocity.movielens.run_movielens_reciprocity` runs that one).
    """
    config = ReciprocityConfig() if config is None else config
    check(config)
    if config.dataset not in HEALTHCARE:
        raise ValueError(f"dataset: expected one of {list(HEALTHCARE)} (movielens runs through "
                         f"simulations.experiments.reciprocity.movielens.run_movielens_reciprocity); got {config.dataset!r}.")
    started = time.perf_counter()
    model = config.model
    x, y = _load(config.dataset, config.target)
    n, repetitions, steps = len(y), config.repetitions_used, config.steps_used
    rng = np.random.default_rng(np.random.SeedSequence([int(config.seed), DATASETS.index(config.dataset)]))
    every = config.checkpoint_every_used
    num_checkpoints = len(set(range(every, steps + 1, every)) | {steps}) if steps else 1
    sums = {influence: _SideSums(n, num_checkpoints if influence == "tracin" else 0) for influence in config.influences}
    times_train, times_infer = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    gaps, qualities, checkpoints = [], [], None
    training = dict(steps=steps, learning_rate=config.learning_rate_used, initialization=config.initialization_used)
    with threadpool_limits(1, user_api="blas"):  # small products: extra BLAS threads only spin-wait
        for _ in range(repetitions):
            train, infer = _split(rng, n)
            flows = tracin_split(model, x, y, train, infer, checkpoint_every=every, **training)
            sums["tracin"].add(train, infer, flows.outflow, flows.inflow, flows.cumulative_outflow,
                               flows.cumulative_inflow)
            checkpoints = flows.checkpoints
            if "marginal" in sums:
                full, removed = marginal_split(model, x, y, train, infer, **training)
                # Individuals are the rows: unit k is training row train[k], inference example j is infer[j].
                inflow, outflow, _ = marginal_flows(full, removed, train, infer, num_individuals=n)
                sums["marginal"].add(train, infer, outflow[train], inflow[infer])
            times_train[train] += 1
            times_infer[infer] += 1
            gaps.append(flows.first_order_gap)
            qualities.append(flows.quality)
    seen = (times_train > 0) & (times_infer > 0)
    index = pd.RangeIndex(n, name="individual")
    reports, columns, snr_rows = {}, {}, {}
    for influence, s in sums.items():
        for averaging in AVERAGINGS:
            outflow = _averaged(s.out, times_train, repetitions, averaging)
            inflow = _averaged(s.inn, times_infer, repetitions, averaging)
            reports[influence, averaging] = reciprocity(pd.Series(inflow[seen], index=index[seen]),
                                                        pd.Series(outflow[seen], index=index[seen]), p=config.p)
            if averaging == config.averaging:
                columns[f"{influence}_inflow"] = np.where(seen, inflow, np.nan)
                columns[f"{influence}_outflow"] = np.where(seen, outflow, np.nan)
                columns[f"{influence}_ratio"] = reports[influence, averaging].ratio.reindex(index)
        out_snr, in_snr = _snr(s.out, s.out_sq, times_train), _snr(s.inn, s.in_sq, times_infer)
        snr_rows[influence] = {f"{side}_p{q}": float(np.nanpercentile(values, q)) if np.any(np.isfinite(values))
                               else math.nan for side, values in (("outflow", out_snr), ("inflow", in_snr))
                               for q in (50, 90)}
    steps_rows = []
    for k, step in enumerate(checkpoints):
        row = {"step": int(step)}
        for averaging in AVERAGINGS:
            outflow = _averaged(sums["tracin"].out_steps[k], times_train, repetitions, averaging)[seen]
            inflow = _averaged(sums["tracin"].in_steps[k], times_infer, repetitions, averaging)[seen]
            row[averaging] = alpha_at(reciprocity_ratio(inflow, outflow), config.p)
        steps_rows.append(row)
    return CentralizedReciprocityResult(
        config=config,
        report=reports[config.influences[0], config.averaging],
        reports=reports,
        individuals=pd.DataFrame({**columns, "times_train": times_train, "times_inference": times_infer}, index=index),
        num_left_out=int(n - seen.sum()),
        snr=pd.DataFrame.from_dict(snr_rows, orient="index"),
        alpha_by_step=pd.DataFrame(steps_rows),
        first_order_gap=float(np.nanmean(gaps)),
        inference_quality=float(np.mean(qualities)),
        seconds=time.perf_counter() - started,
    )


def format_table(*results) -> str:
    """A plain-text table of one or more results (healthcare or MovieLens), measured next to the paper's."""
    if not results:
        raise ValueError("results: expected at least one reciprocity result; got none.")
    blocks = []
    for result in results:
        if not hasattr(result, "to_frame") or not hasattr(result, "head"):
            raise TypeError(f"results: expected reciprocity results; got {type(result).__name__}.")
        lines = [result.head(), f"  {'metric':<40}{'measured':>12}{'paper':>10}"]
        for metric, row in result.to_frame().iterrows():
            paper = "-" if math.isnan(row["paper"]) else f"{row['paper']:g}"
            lines.append(f"  {metric:<40}{row['measured']:>12.4g}{paper:>10}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def cli_main(config: ReciprocityConfig, options) -> int:
    """``fedvalue run reciprocity``: the reproduction tables (every dataset with --dataset all)."""
    from pathlib import Path

    from simulations.runner import write_json

    if config.dataset not in (*DATASETS, "all"):
        raise ValueError(f"dataset: expected one of {[*DATASETS, 'all']}; got {config.dataset!r}.")
    datasets = list(DATASETS) if config.dataset == "all" else [config.dataset]
    configs = [dataclasses.replace(config, dataset=d) for d in datasets]
    for each in configs:
        check(each)  # every dataset's settings before the first runs
    out = None if options.out is None else Path(options.out)
    if out is not None and out.exists() and any(out.iterdir()) and not options.overwrite:
        raise ValueError(f"out: {out} already holds files; pass --overwrite to replace them or choose another "
                         "directory.")
    say = options.say() if hasattr(options, "say") else None
    on_split = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        # A long MovieLens run keeps the splits it finished, should it be stopped.
        on_split = lambda flows: np.savez(out / "movielens-splits.npz", **flows)  # noqa: E731
    results = [run_movielens_reciprocity(c, on_run=say, on_split=on_split) if c.dataset == "movielens"
               else run_centralized_reciprocity(c) for c in configs]
    print(format_table(*results))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for result in results:
            result.write(out)
        write_json(out / "reciprocity.json", {"simulation": "reciprocity", "results": [r.to_dict() for r in results]})
    if getattr(options, "results", None):
        written = write_results(options.results, results_frames(results), options.command)
        print(f"results files: {', '.join(map(str, written))}")
    print(f"done in {options.elapsed():.1f}s" + ("" if out is None else f"; tables in {out}"))
    return 0


#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("reciprocity", ReciprocityConfig, cli_main, out_optional=True, help=RECIPROCITY_HELP,
                        results=RECIPROCITY_RESULTS)
