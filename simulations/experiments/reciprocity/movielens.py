"""TracIn (and Marginal) reciprocity of matrix factorization on MovieLens ([RECIP] §5.1, App. A, C).

**Data.** [RECIP] uses MovieLens 100K (943 users, 1,682 movies, 100,000 ratings on 1–5, every
user ≥ 20 ratings). It is not installable offline; the stand-in is the ``movielens`` data
frame of the R package dslabs (Debian ``r-cran-dslabs``, read by
:func:`simulations.datasets.r_data.read_r_data_frame`): 100,004 ratings by 671 users of 9,066
movies, on 0.5–5 in half stars, every user ≥ 20 ratings, each (user, movie) pair once. Its
long tail of rarely rated movies (3,063 with one rating; 11 ratings per movie on average
against 59 in 100K) makes the paper's hyperparameters overfit: on all of it the test RMSE
after 1,000 steps is about 1.19, worse than predicting the mean rating (1.06). Keeping the movies
with at least ``min_item_ratings`` = 10 ratings (2,245 movies, 81,915 ratings, all 671
users) gives a matrix shaped like 100K on which the same hyperparameters reach the paper's
quality (RMSE about 0.90 against the workshop version's 0.925): that default is chosen to
pass the paper's sanity check, not to hit a reciprocity figure; ``min_item_ratings=1``
runs on everything.

**Protocol** (§5.1 and footnote 3). Ratings split at random 80:20 into training Z and
inference Z'; matrix factorization with d = 16, λ = 1, full-batch gradient descent for
T = 1,000 steps at η = 2e-4 on App. A's loss with the regularization split over the
training examples (:mod:`fedvalue.flows.mf_flows`, which books every step's TracIn flows per user
in O((|Z| + |Z'|) d)); embeddings start with N(0, ``init_scale``²) entries (the paper says
"randomly initialize" without a scale). Ten splits, ten random initializations each: the
*single split* figures average the flows of split 0's ten runs, the *ten splits* figures
average all hundred runs (Fig. 1, top and bottom rows).

**Figures.** α at p = 0.75, Pearson, shares of negative inflows and outflows (§5.1),
reciprocity along training (Fig. 1c: α of the cumulative flows every ``checkpoint_every``
steps), the first-order discrepancy per step (App. C.1, Fig. 5: its 80th percentile),
the test RMSE, and the outflow signal-to-noise ratio |mean|/std across the splits'
averaged flows (App. C.2, Fig. 6); and α, Pearson and the negative shares over the first k
splits for every k (how they move as more splits are averaged).

**Federated per user** (the extension; ``local_steps`` = E ≥ 1). Every user is a client that
keeps its embedding p_u to itself; in each of ``steps`` rounds it takes E local gradient
steps on its own ratings from the server's item embeddings and sends its item update, and
the server adds them (:func:`fedvalue.flows.mf_flows.mf_flows`). The flows are the federated form
F_t(u→v) = −s_u · g_v of :mod:`fedvalue.flows.round_flows`; with E = 1 they are exactly the centralized
ones, so E > 1 isolates what local training does to reciprocity. It runs in process, not
through Flower: the project's ClientApp keeps no per-client state between rounds, which a
private user embedding needs.

**Marginal** (App. C.2; ``influence="marginal"`` or ``"both"``). Retraining once per
individual on all 671 users costs 672 fits of 1,000 steps per run, so the Marginal
experiment runs on the ratings of ``marginal_users`` users drawn at random (stated in the
output): per split (one initialization each, shared by every retraining so that removal
alone differs), the full model and one model per user with all of that user's training
ratings removed (the paper's "removing all of user u's examples simultaneously"), and the
TracIn flows of the same runs beside them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedvalue import (
    MfTraining,
    Ratings,
    ReciprocityReport,
    alpha_at,
    marginal_flows,
    mf_fit,
    mf_flows,
    reciprocity,
    reciprocity_ratio,
)
from simulations.experiments.reciprocity.config import DATASETS, MOVIELENS_PAPER, check

__all__ = ["MOVIELENS", "PAPER", "MovieLensData", "MovieLensResult", "load_movielens", "run_movielens_reciprocity",
           "split_prefixes"]

PAPER = MOVIELENS_PAPER

#: What the stand-in is: the dslabs data frame's own numbers, next to MovieLens 100K's.
MOVIELENS = {"package": "dslabs", "frame": "movielens", "ratings": 100_004, "users": 671, "movies": 9_066,
             "paper_ratings": 100_000, "paper_users": 943, "paper_movies": 1_682}


@dataclass(frozen=True)
class MovieLensData:
    """Ratings as index arrays (users 0..U−1, items 0..I−1) with the original ids."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    user_ids: np.ndarray
    movie_ids: np.ndarray

    @property
    def num_users(self) -> int:
        return len(self.user_ids)

    @property
    def num_items(self) -> int:
        return len(self.movie_ids)

    def subset(self, keep: np.ndarray) -> MovieLensData:
        """The ratings ``keep`` (boolean), users and items re-indexed to those left."""
        users, user_index = np.unique(self.users[keep], return_inverse=True)
        items, item_index = np.unique(self.items[keep], return_inverse=True)
        return MovieLensData(user_index.astype(np.int64), item_index.astype(np.int64), self.ratings[keep],
                             self.user_ids[users], self.movie_ids[items])


def load_movielens(min_item_ratings: int = 1) -> MovieLensData:
    """The dslabs ``movielens`` ratings, keeping movies with at least ``min_item_ratings`` ratings."""
    from simulations.datasets import read_r_data_frame

    frame = read_r_data_frame(MOVIELENS["package"], MOVIELENS["frame"])
    user_ids, users = np.unique(frame["userId"].to_numpy(dtype=np.int64), return_inverse=True)
    movie_ids, items = np.unique(frame["movieId"].to_numpy(dtype=np.int64), return_inverse=True)
    data = MovieLensData(users.astype(np.int64), items.astype(np.int64), frame["rating"].to_numpy(np.float64),
                         user_ids, movie_ids)
    if min_item_ratings > 1:
        counts = np.bincount(data.items, minlength=data.num_items)
        data = data.subset(counts[data.items] >= min_item_ratings)
    return data


def split_ratings(data: MovieLensData, train_fraction: float, rng: np.random.Generator) -> tuple[Ratings, Ratings]:
    """A uniformly random train_fraction : (1 − train_fraction) split of the ratings."""
    order = rng.permutation(len(data.ratings))
    cut = int(round(train_fraction * len(order)))
    sides = []
    for rows in (order[:cut], order[cut:]):
        sides.append(Ratings.of(data.users[rows], data.items[rows], data.ratings[rows], num_users=data.num_users,
                                num_items=data.num_items))
    return sides[0], sides[1]


def _training(config) -> MfTraining:
    return MfTraining(dimension=config.dimension, regularization=config.regularization,
                      learning_rate=config.learning_rate_used, steps=config.steps_used, init_scale=config.init_scale)


def _figures(report: ReciprocityReport) -> dict:
    return {"alpha": report.alpha, "pearson": report.pearson, "spearman": report.spearman,
            "negative_inflow_share": report.negative_inflow_share,
            "negative_outflow_share": report.negative_outflow_share}


def split_prefixes(inflow: np.ndarray, outflow: np.ndarray, initializations: int, p: float = 0.75,
                   user_ids: np.ndarray | None = None) -> pd.DataFrame:
    """The figures over the first k splits, for every k: ``inflow`` and ``outflow`` are the per-split mean flows
    (splits × users, as ``movielens-splits.npz`` keeps them), each split the mean of its ``initializations`` runs.
    The first row is the single split's figures, the last the all-splits ones."""
    index = pd.Index(np.arange(inflow.shape[1]) if user_ids is None else user_ids, name="user_id")
    rows = []
    for k in range(1, len(inflow) + 1):
        report = reciprocity(pd.Series(np.mean(inflow[:k], axis=0), index=index),
                             pd.Series(np.mean(outflow[:k], axis=0), index=index), p=p)
        rows.append({"splits": k, "initializations": initializations, **_figures(report)})
    return pd.DataFrame(rows)


def _percentile(values: np.ndarray, q: float) -> float:
    """The q-th percentile of the finite values; NaN when there are none (one split: no spread)."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(np.percentile(finite, q)) if finite.size else float("nan")


def _snr(values: np.ndarray) -> np.ndarray:
    """|mean| / std (ddof 1) over the rows (runs or splits), per column (user)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.abs(values.mean(axis=0)) / values.std(axis=0, ddof=1)


@dataclass(frozen=True)
class MovieLensResult:
    """Outcome of :func:`run_movielens_reciprocity`.

    ``single`` and ``splits`` are the reports of split 0's averaged runs and of all runs, ``prefixes`` the
    figures over the first k splits for every k (:func:`split_prefixes`);
    ``alpha_by_step`` holds α along training for both; ``first_order`` per step the median
    and 80th percentile over runs of the first-order discrepancy, ``first_order_p80`` per run
    the 80th percentile over its steps (App. C.1's figure); ``marginal`` (when run) the
    Marginal and TracIn reports of the user subsample with their SNR.
    """

    config: object
    data_shape: dict
    single: ReciprocityReport
    splits: ReciprocityReport
    individuals: pd.DataFrame
    alpha_by_step: pd.DataFrame
    first_order: pd.DataFrame
    inference_rmse: np.ndarray
    train_rmse: np.ndarray
    first_order_p80: np.ndarray
    tracin_outflow_snr: np.ndarray
    marginal: dict | None
    seconds: float
    prefixes: pd.DataFrame

    @property
    def report(self) -> ReciprocityReport:
        return self.splits

    def head(self) -> str:
        c, shape = self.config, self.data_shape
        training = (f"T={c.steps_used}" if not c.local_steps else
                    f"federated per user, {c.steps_used} rounds of {c.local_steps} local steps")
        return (f"movielens (dslabs stand-in: {shape['ratings']} ratings, {shape['users']} users, {shape['movies']} "
                f"movies with >= {c.min_item_ratings} ratings): MF d={c.dimension}, lambda={c.regularization:g}, "
                f"{training}, eta={c.learning_rate_used:g}, {c.repetitions_used} splits x "
                f"{self.initializations} initializations, seed {c.seed}, {self.seconds:.1f}s")

    @property
    def initializations(self) -> int:
        return len(self.inference_rmse) // max(1, self.config.repetitions_used)

    def to_frame(self) -> pd.DataFrame:
        """Measured figures next to the paper's (ICML version; workshop figures in :data:`PAPER`)."""
        p = self.config.p == 0.75
        rows = {}
        for name, report in (("single", self.single), ("splits", self.splits)):
            for key, value in _figures(report).items():
                published = PAPER.get(f"{key.replace('_share', '')}_{name}", math.nan)
                rows[f"tracin {key} ({'single split' if name == 'single' else 'all splits'})"] = (
                    value, published if (p or key != "alpha") else math.nan)
        rows["first_order_discrepancy_p80 (median run)"] = (float(np.median(self.first_order_p80)),
                                                            PAPER["first_order_p80"])
        rows["tracin outflow_snr_p10 (across splits)"] = (_percentile(self.tracin_outflow_snr, 10),
                                                          PAPER["tracin_outflow_snr_p10"])
        rows["inference_rmse (mean)"] = (float(np.mean(self.inference_rmse)), PAPER["inference_rmse"])
        rows["inference_rmse (std)"] = (float(np.std(self.inference_rmse)), 0.009)
        rows["train_rmse (mean)"] = (float(np.mean(self.train_rmse)), math.nan)
        rows["splits"] = (float(self.config.repetitions_used), float(PAPER["repetitions"]))
        rows["initializations per split"] = (float(self.initializations), float(PAPER["initializations"]))
        if self.marginal is not None:
            m = self.marginal
            for influence in ("marginal", "tracin"):
                for key, value in _figures(m[influence]).items():
                    rows[f"subsample {influence} {key}"] = (value, math.nan)
                rows[f"subsample {influence} outflow_snr_p90"] = (
                    _percentile(m[f"{influence}_snr"], 90),
                    PAPER["marginal_outflow_snr_p90"] if influence == "marginal" else math.nan)
            rows["subsample users"] = (float(m["users"]), math.nan)
        frame = pd.DataFrame.from_dict(rows, orient="index", columns=["measured", "paper"])
        frame.index.name = "metric"
        return frame

    def to_dict(self) -> dict:
        return {"config": self.config.as_dict(), "data": self.data_shape, **self.splits.to_dict(),
                "figures": {k: (None if math.isnan(v) else v) for k, v in self.to_frame()["measured"].items()},
                "seconds": self.seconds}

    def write(self, out) -> None:
        """Tables and Figure 1 (``movielens-*.csv``, ``movielens-figure1.png``)."""
        self.to_frame().to_csv(out / "movielens-figures.csv")
        self.individuals.to_csv(out / "movielens-individuals.csv")
        self.alpha_by_step.to_csv(out / "movielens-alpha-by-step.csv", index=False)
        self.first_order.to_csv(out / "movielens-first-order.csv", index=False)
        self.prefixes.to_csv(out / "movielens-prefixes.csv", index=False)
        pd.DataFrame({"run": np.arange(len(self.inference_rmse)), "inference_rmse": self.inference_rmse,
                      "train_rmse": self.train_rmse}).to_csv(out / "movielens-rmse.csv", index=False)
        figure1(self, out / "movielens-figure1.png")


def _marginal_subsample(data: MovieLensData, config, rng_sequence: np.random.SeedSequence,
                        say: Callable[[str], None]) -> dict:
    """App. C.2's Marginal flows (removing all of a user's training ratings) on a user subsample,
    with the TracIn flows of the same runs, over ``repetitions`` splits (one initialization each)."""
    pick, *runs = rng_sequence.spawn(1 + config.repetitions_used)
    chosen = np.sort(np.random.default_rng(pick).choice(data.num_users, size=min(config.marginal_users,
                                                                               data.num_users), replace=False))
    sub = data.subset(np.isin(data.users, chosen))
    training = dict(num_users=sub.num_users, num_items=sub.num_items, training=_training(config))
    marginal_runs, tracin_runs = [], []
    for s, sequence in enumerate(runs):
        split_rng, init_rng = (np.random.default_rng(q) for q in sequence.spawn(2))
        train, infer = split_ratings(sub, config.train_fraction or PAPER["train_fraction"], split_rng)
        start = (init_rng.normal(0.0, config.init_scale, (sub.num_users, config.dimension)),
                 init_rng.normal(0.0, config.init_scale, (sub.num_items, config.dimension)))
        started = time.perf_counter()

        def losses(fitted) -> np.ndarray:
            users, items = fitted
            return 0.5 * (np.einsum("nd,nd->n", users[infer.users], items[infer.items]) - infer.ratings) ** 2

        full = losses(mf_fit(train, initial=start, **training))
        removed = np.empty((sub.num_users, len(infer)))
        for u in range(sub.num_users):
            keep = train.users != u
            removed[u] = losses(mf_fit(Ratings(train.users[keep], train.items[keep], train.ratings[keep]),
                                       initial=start, **training))
        inflow, outflow, _ = marginal_flows(full, removed, np.arange(sub.num_users), infer.users,
                                            num_individuals=sub.num_users)
        marginal_runs.append((inflow, outflow))
        tracin = mf_flows(train, infer, initial=start, **training)
        tracin_runs.append((tracin.inflow, tracin.outflow))
        say(f"movielens Marginal split {s + 1}/{len(runs)}: {sub.num_users} users, {len(train)} training ratings, "
            f"{sub.num_users + 1} fits ({time.perf_counter() - started:.1f}s)")
    result = {"users": sub.num_users, "ratings": len(sub.ratings)}
    for name, per_run in (("marginal", marginal_runs), ("tracin", tracin_runs)):
        inflows, outflows = np.array([r[0] for r in per_run]), np.array([r[1] for r in per_run])
        result[name] = reciprocity(inflows.mean(axis=0), outflows.mean(axis=0), p=config.p)
        result[f"{name}_snr"] = _snr(outflows) if len(per_run) > 1 else np.full(sub.num_users, np.nan)
    return result


def run_movielens_reciprocity(config, on_run: Callable[[str], None] | None = None,
                              on_split: Callable[[dict], None] | None = None) -> MovieLensResult:
    """[RECIP] §5.1 (module docstring); ``config`` is a :class:`simulations.experiments.reciprocity.centralized.ReciprocityConfig`.

    ``on_split``, when given, receives after every split the per-split mean flows so far
    (``inflow`` and ``outflow``: splits × users; ``user_id``; ``inference_rmse`` per run), so
    that a run stopped before its last split still leaves the splits it finished.
    """
    check(config)
    say = on_run or (lambda line: None)
    started = time.perf_counter()
    data = load_movielens(config.min_item_ratings)
    shape = {"ratings": int(len(data.ratings)), "users": data.num_users, "movies": data.num_items}
    splits, inits = config.repetitions_used, config.initializations or PAPER["initializations"]
    fraction = config.train_fraction or PAPER["train_fraction"]
    root = np.random.SeedSequence([int(config.seed), DATASETS.index("movielens")])
    split_sequences, marginal_sequence = root.spawn(2)
    training = dict(num_users=data.num_users, num_items=data.num_items, training=_training(config),
                    checkpoint_every=config.checkpoint_every_used, local_steps=config.local_steps)
    per_split_in, per_split_out, cumulative, discrepancies, rmse, train_rmse = [], [], [], [], [], []
    for s, sequence in enumerate(split_sequences.spawn(splits)):
        split_sequence, *init_sequences = sequence.spawn(1 + inits)
        train, infer = split_ratings(data, fraction, np.random.default_rng(split_sequence))
        runs_in, runs_out, runs_cumulative = [], [], []
        for k, init_sequence in enumerate(init_sequences):
            run_started = time.perf_counter()
            run = mf_flows(train, infer, seed=np.random.default_rng(init_sequence), **training)
            runs_in.append(run.inflow)
            runs_out.append(run.outflow)
            runs_cumulative.append((run.cumulative_inflow, run.cumulative_outflow))
            discrepancies.append(run.first_order_discrepancy())
            rmse.append(run.inference_rmse)
            train_rmse.append(run.train_rmse)
            say(f"movielens split {s + 1}/{splits}, initialization {k + 1}/{inits}: test RMSE "
                f"{run.inference_rmse:.4f} ({time.perf_counter() - run_started:.1f}s)")
        per_split_in.append(np.mean(runs_in, axis=0))
        per_split_out.append(np.mean(runs_out, axis=0))
        if on_split is not None:
            on_split({"inflow": np.array(per_split_in), "outflow": np.array(per_split_out),
                      "user_id": data.user_ids, "inference_rmse": np.array(rmse)})
        cumulative.append((np.mean([c[0] for c in runs_cumulative], axis=0),
                           np.mean([c[1] for c in runs_cumulative], axis=0)))
        checkpoints = run.checkpoints
    index = pd.Index(data.user_ids, name="user_id")
    single = reciprocity(pd.Series(per_split_in[0], index=index), pd.Series(per_split_out[0], index=index), p=config.p)
    everything = reciprocity(pd.Series(np.mean(per_split_in, axis=0), index=index),
                             pd.Series(np.mean(per_split_out, axis=0), index=index), p=config.p)
    all_cumulative_in = np.mean([c[0] for c in cumulative], axis=0)
    all_cumulative_out = np.mean([c[1] for c in cumulative], axis=0)
    alpha_rows = [{"step": int(step),
                   "single_split": alpha_at(reciprocity_ratio(cumulative[0][0][k], cumulative[0][1][k]), config.p),
                   "all_splits": alpha_at(reciprocity_ratio(all_cumulative_in[k], all_cumulative_out[k]), config.p)}
                  for k, step in enumerate(checkpoints)]
    stacked = np.array(discrepancies)
    first_order = pd.DataFrame({"step": np.arange(1, stacked.shape[1] + 1),
                                "median": [_percentile(column, 50) for column in stacked.T],
                                "p80": [_percentile(column, 80) for column in stacked.T]})
    individuals = pd.DataFrame({
        "ratings": np.bincount(data.users, minlength=data.num_users),
        "inflow_single_split": single.inflow, "outflow_single_split": single.outflow, "ratio_single_split": single.ratio,
        "inflow_all_splits": everything.inflow, "outflow_all_splits": everything.outflow,
        "ratio_all_splits": everything.ratio,
    }, index=index)
    marginal = None
    if "marginal" in config.influences:
        marginal = _marginal_subsample(data, config, marginal_sequence, say)
    return MovieLensResult(
        config=config, data_shape=shape, single=single, splits=everything, individuals=individuals,
        alpha_by_step=pd.DataFrame(alpha_rows), first_order=first_order, inference_rmse=np.array(rmse),
        train_rmse=np.array(train_rmse), first_order_p80=np.array([_percentile(row, 80) for row in stacked]),
        tracin_outflow_snr=_snr(np.array(per_split_out)) if splits > 1 else np.full(data.num_users, np.nan),
        marginal=marginal, seconds=time.perf_counter() - started,
        prefixes=split_prefixes(np.array(per_split_in), np.array(per_split_out), inits, config.p, data.user_ids),
    )


def figure1(result: MovieLensResult, path) -> None:
    """[RECIP] Fig. 1's panels: (a) inflow vs outflow, (b) reciprocity across users, (c) α along
    training; top row split 0 averaged over its runs, bottom row all runs of all splits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 3, figsize=(14, 8), constrained_layout=True)
    for row, (name, report, column) in enumerate((("single split", result.single, "single_split"),
                                                  ("all splits", result.splits, "all_splits"))):
        a, b, c = axes[row]
        a.scatter(report.outflow, report.inflow, s=6, alpha=0.6)
        low = float(min(report.outflow.min(), report.inflow.min()))
        high = float(max(report.outflow.max(), report.inflow.max()))
        a.plot([low, high], [low, high], color="grey", linewidth=0.8)
        a.set_xscale("symlog", linthresh=1e-3)
        a.set_yscale("symlog", linthresh=1e-3)
        a.set_xlabel("outflow")
        a.set_ylabel("inflow")
        a.set_title(f"(a) inflow vs outflow, {name}")
        ratios = report.ratio.to_numpy()
        positive = ratios[ratios > 0]
        if positive.size:
            b.hist(positive, bins=np.logspace(np.log10(max(positive.min(), 1e-4)), 0, 40))
        b.set_xscale("log")
        b.set_xlabel(f"reciprocity r_u ({int((ratios == 0).sum())} users at 0, not shown)")
        b.set_ylabel("users")
        b.set_title(f"(b) reciprocity across users, alpha(0.75) = {report.alpha:.2f}")
        c.plot(result.alpha_by_step["step"], result.alpha_by_step[column])
        c.set_xlabel("gradient-descent step")
        c.set_ylabel("alpha at p = 0.75")
        c.set_title(f"(c) reciprocity along training, {name}")
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)
