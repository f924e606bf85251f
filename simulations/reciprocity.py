"""Centralized TracIn reciprocity on the healthcare data sets ([RECIP] §5.2).

Reproduces "the diabetes model is (0.75, 0.76)-TracIn-reciprocal ... the breast cancer
model is (0.75, 0.93)-TracIn-reciprocal" of [RECIP] (Sundararajan & Krichene).

**Setup** (§5.2 and its footnote 4). One individual per example (569 for breast cancer,
442 for diabetes). Breast cancer: logistic regression, T = 600 full-batch gradient-descent
steps, η = 0.1; diabetes: linear regression on the mean squared error, T = 200, η = 0.01.
Features are standardized with the mean and variance of the training split (footnote 4);
the diabetes target is left in its units (the paper normalizes features only;
``target="standardized"`` is offered). Both models have an intercept and start at w = 0
(the paper does not say; the losses are convex). Per-example losses:
ℓ_z = −y log σ(x̃·w) − (1−y) log(1−σ(x̃·w)), ∇ℓ_z = (σ(x̃·w) − y) x̃, and
ℓ_z = (x̃·w − y)², ∇ℓ_z = 2(x̃·w − y) x̃, with x̃ = (x, 1). A step on the mean training loss is
w ← w − (η/|Z|) Σ_{z∈Z} ∇ℓ_z(w), i.e. η_t = η/|Z| per example in TracIn's Eq. 4. float64.

**Splits** (§5, Theorem 3.2 / Assumption 3.1). Each repetition splits the data at random
into a training half Z and an inference half Z'; for an odd count the extra example goes
to either side with probability 1/2, so every example is in Z with probability exactly 1/2.

**Flows in one split** (Eqs. 1, 2, 4). An individual is a single example, so it is in
exactly one of Z, Z' (§5.2: "individuals in the training set only have outflows and
individuals in the inference set only have inflows"), and has no self-influence:

    O_u = Σ_t (η/|Z|) ∇ℓ_u(w_t) · Σ_{z'∈Z'} ∇ℓ_{z'}(w_t)      (u ∈ Z),
    I_v = Σ_t (η/|Z|) Σ_{z∈Z} ∇ℓ_z(w_t) · ∇ℓ_v(w_t)         (v ∈ Z'),

computed step by step by :func:`fedvalue.flows.tracin_round_flows` (the O(n·p) form of §4,
the same core as the federated books) and accumulated in a :class:`fedvalue.flow_book.FlowBook`.

**Averaging over splits** ("measuring reciprocity is only possible in expectation over
random train/test splits ... we average measurements over 100 random splits"). With
``averaging="conditional"`` (default) an individual's outflow is the mean of O_u over the
splits that put u in Z, and its inflow the mean of I_u over the splits that put u in Z':
estimates of E[O_u | u ∈ Z] and E[I_u | u ∈ Z'], whose ratio equals E[O_u]/E[I_u] because
P(u ∈ Z) = P(u ∈ Z') = 1/2. ``averaging="all-splits"`` averages over all repetitions
(0 when on the other side) — the same quantity in expectation, but its ratio carries the
binomial noise of how often u landed on each side (≈ ±10% at 100 splits, which alone caps
α(0.75) near 0.8); the paper's 0.93 is only reachable with the conditional mean, which
is why it is the default. Individuals that never landed on one side (possible with few
repetitions) are left out and counted in ``num_left_out``.

**Figures** (Def. 2.1, §2.2): α at p = 0.75 (:func:`fedvalue.reciprocity.alpha_at`),
Pearson and Spearman correlation of inflow and outflow, shares of negative inflows and
outflows, next to the paper's values (only α is reported in §5.2); plus the first-order
check of Appendix C.1: the relative gap between the summed flows (predicted reduction of
the inference loss) and the actual reduction, averaged over splits.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedvalue._checks import check_choice, check_integer, check_number, check_unit_interval
from fedvalue.flow_book import FlowBook
from fedvalue.flows import tracin_round_flows
from fedvalue.reciprocity import ReciprocityReport, reciprocity

__all__ = [
    "DATASETS",
    "PAPER",
    "CentralizedReciprocityResult",
    "ReciprocityConfig",
    "check",
    "format_table",
    "run_centralized_reciprocity",
]

DATASETS = ("breast-cancer", "diabetes")
AVERAGINGS = ("conditional", "all-splits")
TARGETS = ("raw", "standardized")

#: [RECIP] §5.2 and footnote 4: model, steps T, learning rate η, and the reported
#: (0.75, α) for TracIn (and Marginal, not reproduced here); Pearson is not reported.
PAPER = {
    "breast-cancer": {"model": "logistic", "steps": 600, "learning_rate": 0.1, "alpha": 0.93,
                      "marginal_alpha": 0.48, "repetitions": 100},
    "diabetes": {"model": "linear", "steps": 200, "learning_rate": 0.01, "alpha": 0.76,
                 "marginal_alpha": 0.36, "repetitions": 100},
}


@dataclass
class ReciprocityConfig:
    """Every number of the centralized reproduction ([RECIP] §5.2).

    ``steps = 0`` and ``learning_rate = 0`` (or None) mean the paper's values for the
    dataset (600 / 0.1 for breast-cancer, 200 / 0.01 for diabetes).
    """

    seed: int = 0
    dataset: str = "breast-cancer"
    repetitions: int = 100
    steps: int = 0
    learning_rate: float = 0.0
    averaging: str = "conditional"
    target: str = "raw"
    p: float = 0.75

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def steps_used(self) -> int:
        return int(self.steps) if self.steps else PAPER[self.dataset]["steps"]

    @property
    def learning_rate_used(self) -> float:
        return float(self.learning_rate) if self.learning_rate else PAPER[self.dataset]["learning_rate"]


def check(config: ReciprocityConfig) -> None:
    """ValueError naming the first bad field of ``config``."""
    if not isinstance(config, ReciprocityConfig):
        raise TypeError(f"config: expected a ReciprocityConfig; got {type(config).__name__}.")
    check_integer("seed", config.seed, 0)
    check_choice("dataset", config.dataset, DATASETS)
    check_integer("repetitions", config.repetitions)
    check_integer("steps", config.steps, 0, none_ok=True, why="0 or None = the paper's")
    check_number("learning_rate", config.learning_rate, low=0.0, none_ok=True, why="0 or None = the paper's")
    check_choice("averaging", config.averaging, AVERAGINGS)
    check_choice("target", config.target, TARGETS)
    if config.target == "standardized" and config.dataset != "diabetes":
        raise ValueError(f"target: 'standardized' applies to the diabetes regression only; got dataset "
                         f"{config.dataset!r}.")
    check_unit_interval("p", config.p)


def _load(dataset: str, target: str) -> tuple[np.ndarray, np.ndarray]:
    """Raw features and labels/targets in float64.

    Not :func:`simulations.data.load_dataset`: that standardizes with whole-data
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


def _residual(model: str, x: np.ndarray, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """dℓ/d(x̃·w) per example: σ(x̃·w) − y (logistic) or 2(x̃·w − y) (squared error)."""
    score = x @ w
    if model == "logistic":
        return 0.5 * (1.0 + np.tanh(0.5 * score)) - y  # σ, overflow-free
    return 2.0 * (score - y)


def _loss(model: str, x: np.ndarray, w: np.ndarray, y: np.ndarray) -> float:
    """Σ ℓ_z over the rows (summed, as the flows are)."""
    score = x @ w
    if model == "logistic":
        return float(np.sum(np.logaddexp(0.0, score) - y * score))
    return float(np.sum((score - y) ** 2))


def _quality(model: str, x: np.ndarray, w: np.ndarray, y: np.ndarray) -> float:
    """Inference accuracy (logistic) or RMSE (linear)."""
    score = x @ w
    if model == "logistic":
        return float(np.mean((score > 0) == (y > 0.5)))
    return float(np.sqrt(np.mean((score - y) ** 2)))


@dataclass(frozen=True)
class CentralizedReciprocityResult:
    """Outcome of :func:`run_centralized_reciprocity`.

    Attributes
    ----------
    config
        The configuration run.
    report
        Reciprocity figures of the split-averaged flows (:class:`ReciprocityReport`).
    individuals
        Per individual (index: row of the dataset): ``inflow``, ``outflow`` (averaged
        as configured), ``ratio`` r_u, ``times_train``, ``times_inference``.
    num_left_out
        Individuals never in one of the two splits (left out of ``report``).
    first_order_gap
        Mean over splits of |predicted − actual| / |actual| for the reduction of the
        summed inference loss over training (predicted: Σ of all flows; App. C.1).
    inference_quality
        Mean over splits of the final inference accuracy (breast cancer) or RMSE
        (diabetes).
    seconds
        Wall time of the run.
    """

    config: ReciprocityConfig
    report: ReciprocityReport
    individuals: pd.DataFrame
    num_left_out: int
    first_order_gap: float
    inference_quality: float
    seconds: float

    def to_frame(self) -> pd.DataFrame:
        """The figures next to the paper's: index metric, columns ``measured``, ``paper``."""
        paper = PAPER[self.config.dataset]
        quality = "inference_accuracy" if paper["model"] == "logistic" else "inference_rmse"
        rows = {
            f"alpha_at_p={self.report.p:g}": (self.report.alpha, paper["alpha"] if self.report.p == 0.75 else math.nan),
            "pearson": (self.report.pearson, math.nan),
            "spearman": (self.report.spearman, math.nan),
            "negative_inflow_share": (self.report.negative_inflow_share, math.nan),
            "negative_outflow_share": (self.report.negative_outflow_share, math.nan),
            "median_ratio": (self.report.median_ratio, math.nan),
            "individuals": (float(self.report.num_individuals), float(len(self.individuals))),
            "repetitions": (float(self.config.repetitions), float(paper["repetitions"])),
            "first_order_gap": (self.first_order_gap, math.nan),
            quality: (self.inference_quality, math.nan),
        }
        frame = pd.DataFrame.from_dict(rows, orient="index", columns=["measured", "paper"])
        frame.index.name = "metric"
        return frame

    def to_dict(self) -> dict:
        return {
            "config": self.config.as_dict(),
            **self.report.to_dict(),
            "paper_alpha": PAPER[self.config.dataset]["alpha"],
            "num_left_out": self.num_left_out,
            "first_order_gap": self.first_order_gap,
            "inference_quality": self.inference_quality,
            "seconds": self.seconds,
        }


def _split(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A uniformly random half/half split; for odd n the extra example's side is a coin flip."""
    order = rng.permutation(n)
    cut = n // 2 + (int(rng.integers(2)) if n % 2 else 0)
    return order[:cut], order[cut:]


def _one_split(model: str, x: np.ndarray, y: np.ndarray, train: np.ndarray, infer: np.ndarray,
               steps: int, learning_rate: float) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Outflows of ``train``, inflows of ``infer``, first-order gap and final quality."""
    mean, std = x[train].mean(axis=0), x[train].std(axis=0)
    scaled = (x - mean) / np.where(std > 0, std, 1.0)  # training-split statistics (footnote 4)
    design = np.hstack([scaled, np.ones((len(x), 1))])
    a, b, ya, yb = design[train], design[infer], y[train], y[infer]
    w = np.zeros(design.shape[1])
    step_size = learning_rate / len(train)  # η_t of Eq. 4 for GD on the mean loss
    book = FlowBook(keep_rounds=False)
    loss_before = _loss(model, b, w, yb)
    for _ in range(steps):
        ra, rb = _residual(model, a, w, ya), _residual(model, b, w, yb)
        train_gradients = ra[:, None] * a
        # Individuals 0..m−1 are the training rows, m..m+k−1 the inference rows.
        book.add(tracin_round_flows(train_gradients, rb[:, None] * b, step_size=step_size))
        w = w - step_size * train_gradients.sum(axis=0)
    totals = book.totals()
    m = len(train)
    outflow = totals["outflow"].to_numpy()[:m]
    inflow = totals["inflow"].to_numpy()[m:]
    actual = loss_before - _loss(model, b, w, yb)
    gap = abs(book.total - actual) / abs(actual) if actual else math.nan
    return outflow, inflow, gap, _quality(model, b, w, yb)


def run_centralized_reciprocity(config: ReciprocityConfig | None = None) -> CentralizedReciprocityResult:
    """[RECIP] §5.2 on one dataset: TracIn flows averaged over random half/half splits.

    Parameters
    ----------
    config
        The run (default: ``ReciprocityConfig()``, breast cancer, 100 repetitions).

    Returns
    -------
    CentralizedReciprocityResult
        ``to_frame()`` puts the figures next to the paper's; :func:`format_table` prints.

    Raises
    ------
    ValueError
        A bad field of ``config`` (named in the message).
    """
    config = ReciprocityConfig() if config is None else config
    check(config)
    started = time.perf_counter()
    model = PAPER[config.dataset]["model"]
    x, y = _load(config.dataset, config.target)
    n = len(y)
    rng = np.random.default_rng(np.random.SeedSequence([int(config.seed), DATASETS.index(config.dataset)]))
    out_sum, in_sum = np.zeros(n), np.zeros(n)
    times_train, times_infer = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    gaps, qualities = [], []
    for _ in range(config.repetitions):
        train, infer = _split(rng, n)
        outflow, inflow, gap, quality = _one_split(model, x, y, train, infer, config.steps_used,
                                                   config.learning_rate_used)
        out_sum[train] += outflow
        in_sum[infer] += inflow
        times_train[train] += 1
        times_infer[infer] += 1
        gaps.append(gap)
        qualities.append(quality)
    with np.errstate(invalid="ignore", divide="ignore"):
        if config.averaging == "conditional":
            outflow, inflow = out_sum / times_train, in_sum / times_infer
        else:
            outflow, inflow = out_sum / config.repetitions, in_sum / config.repetitions
    seen = (times_train > 0) & (times_infer > 0)
    index = pd.RangeIndex(n, name="individual")
    report = reciprocity(pd.Series(inflow[seen], index=index[seen]), pd.Series(outflow[seen], index=index[seen]),
                         p=config.p)
    individuals = pd.DataFrame({
        "inflow": np.where(seen, inflow, np.nan), "outflow": np.where(seen, outflow, np.nan),
        "ratio": report.ratio.reindex(index), "times_train": times_train, "times_inference": times_infer,
    }, index=index)
    return CentralizedReciprocityResult(
        config=config,
        report=report,
        individuals=individuals,
        num_left_out=int(n - seen.sum()),
        first_order_gap=float(np.nanmean(gaps)),
        inference_quality=float(np.mean(qualities)),
        seconds=time.perf_counter() - started,
    )


def format_table(*results: CentralizedReciprocityResult) -> str:
    """A plain-text table of one or more results, measured next to the paper's values."""
    if not results:
        raise ValueError("results: expected at least one CentralizedReciprocityResult; got none.")
    blocks = []
    for result in results:
        if not isinstance(result, CentralizedReciprocityResult):
            raise TypeError(f"results: expected CentralizedReciprocityResult values; got {type(result).__name__}.")
        c = result.config
        head = (f"{c.dataset}: {PAPER[c.dataset]['model']} regression, T={c.steps_used}, "
                f"eta={c.learning_rate_used:g}, {c.repetitions} splits ({c.averaging} mean), seed {c.seed}, "
                f"{result.seconds:.1f}s")
        frame = result.to_frame()
        lines = [head, f"  {'metric':<24}{'measured':>12}{'paper':>10}"]
        for metric, row in frame.iterrows():
            paper = "-" if math.isnan(row["paper"]) else f"{row['paper']:g}"
            lines.append(f"  {metric:<24}{row['measured']:>12.4g}{paper:>10}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def cli_main(config: ReciprocityConfig, options) -> int:
    """``fedvalue run reciprocity``: the centralized reproduction table (both datasets with --dataset all)."""
    from pathlib import Path

    from fedvalue.ledger import write_json

    if config.dataset not in (*DATASETS, "all"):
        raise ValueError(f"dataset: expected one of {[*DATASETS, 'all']}; got {config.dataset!r}.")
    datasets = list(DATASETS) if config.dataset == "all" else [config.dataset]
    out = None if options.out is None else Path(options.out)
    if out is not None and out.exists() and any(out.iterdir()) and not options.overwrite:
        raise ValueError(f"out: {out} already holds files; pass --overwrite to replace them or choose another "
                         "directory.")
    results = [run_centralized_reciprocity(dataclasses.replace(config, dataset=d)) for d in datasets]
    print(format_table(*results))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for result in results:
            name = result.config.dataset
            result.to_frame().to_csv(out / f"{name}-figures.csv")
            result.individuals.to_csv(out / f"{name}-individuals.csv")
            result.report.curve().to_csv(out / f"{name}-alpha-curve.csv", index=False)
        write_json(out / "reciprocity.json", {"simulation": "reciprocity", "results": [r.to_dict() for r in results]})
    print(f"done in {options.elapsed():.1f}s" + ("" if out is None else f"; tables in {out}"))
    return 0
