"""[RECIP] §5.1 on the installed dslabs MovieLens ratings (`.ci/run` installs r-cran-dslabs)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedvalue.flows.mf_flows import MfTraining, mf_flows
from fedvalue.flows.reciprocity_measures import reciprocity
from simulations.experiments.reciprocity.movielens import MOVIELENS, load_movielens, run_movielens_reciprocity, split_ratings
from simulations.experiments.reciprocity.centralized import ReciprocityConfig, format_table


def test_the_stand_in_has_the_numbers_the_docs_give():
    everything = load_movielens(1)
    assert (len(everything.ratings), everything.num_users, everything.num_items) == (
        MOVIELENS["ratings"], MOVIELENS["users"], MOVIELENS["movies"]) == (100_004, 671, 9_066)
    assert np.bincount(everything.users).min() >= 20  # every user has at least 20 ratings, as in 100K
    filtered = load_movielens(10)
    assert (len(filtered.ratings), filtered.num_users, filtered.num_items) == (81_915, 671, 2_245)
    assert np.bincount(filtered.items).min() >= 10
    # Ids map back: the filtered frame's (user, movie, rating) triples are rows of the whole one.
    whole = set(zip(everything.user_ids[everything.users], everything.movie_ids[everything.items],
                    everything.ratings))
    sample = np.random.default_rng(0).choice(len(filtered.ratings), 200, replace=False)
    assert all((filtered.user_ids[filtered.users[k]], filtered.movie_ids[filtered.items[k]], filtered.ratings[k])
               in whole for k in sample)


def test_split_is_an_80_20_partition_of_the_ratings():
    data = load_movielens(50)
    train, infer = split_ratings(data, 0.8, np.random.default_rng(1))
    assert len(train) + len(infer) == len(data.ratings)
    assert len(train) == round(0.8 * len(data.ratings))
    pairs = lambda side: set(zip(side.users.tolist(), side.items.tolist()))  # noqa: E731
    assert not pairs(train) & pairs(infer)


CONFIG = ReciprocityConfig(dataset="movielens", repetitions=2, initializations=2, steps=12, checkpoint_every=4,
                           influence="both", marginal_users=6, min_item_ratings=50)


@pytest.fixture(scope="module")
def small_run():
    return run_movielens_reciprocity(CONFIG)


def test_single_split_is_the_mean_of_its_runs_and_all_splits_of_every_run(small_run):
    # Recompute split 0's first run from the documented seeds, flows by fedvalue.flows.mf_flows.
    data = load_movielens(50)
    root = np.random.SeedSequence([0, 2])
    split_sequences, _ = root.spawn(2)
    split_sequence, *inits = split_sequences.spawn(2)[0].spawn(3)
    train, infer = split_ratings(data, 0.8, np.random.default_rng(split_sequence))
    runs = [mf_flows(train, infer, num_users=data.num_users, num_items=data.num_items,
                     training=MfTraining(steps=12), seed=np.random.default_rng(s)) for s in inits]
    single = reciprocity(np.mean([r.inflow for r in runs], axis=0), np.mean([r.outflow for r in runs], axis=0))
    np.testing.assert_allclose(small_run.single.inflow.to_numpy(), single.inflow.to_numpy(), rtol=1e-12)
    assert small_run.single.alpha == pytest.approx(single.alpha)
    table = small_run.individuals
    again = reciprocity(table["inflow_all_splits"], table["outflow_all_splits"])
    assert small_run.splits.alpha == pytest.approx(again.alpha)
    assert small_run.alpha_by_step["step"].tolist() == [4, 8, 12]
    assert small_run.alpha_by_step["all_splits"].iloc[-1] == pytest.approx(small_run.splits.alpha)
    assert len(small_run.inference_rmse) == 4 and len(small_run.first_order_p80) == 4


def test_marginal_subsample_and_the_table(small_run, tmp_path):
    marginal = small_run.marginal
    assert marginal["users"] == 6
    assert marginal["marginal"].num_individuals == marginal["tracin"].num_individuals == 6
    frame = small_run.to_frame()
    assert frame.loc["tracin alpha (single split)", "paper"] == 0.16
    assert frame.loc["tracin alpha (all splits)", "paper"] == 0.58
    assert frame.loc["subsample marginal outflow_snr_p90", "paper"] == 0.49
    assert "2 splits x 2 initializations" in format_table(small_run)
    small_run.write(tmp_path)
    assert pd.read_csv(tmp_path / "movielens-alpha-by-step.csv").shape == (3, 3)
    assert (tmp_path / "movielens-figure1.png").stat().st_size > 10_000


def test_same_seed_same_flows(small_run):
    again = run_movielens_reciprocity(ReciprocityConfig(**{**CONFIG.as_dict(), "influence": "tracin"}))
    pd.testing.assert_frame_equal(again.individuals, small_run.individuals)


def test_federated_per_user_extension_runs_and_says_so():
    config = ReciprocityConfig(dataset="movielens", repetitions=1, initializations=1, steps=6, local_steps=3,
                               min_item_ratings=50)
    result = run_movielens_reciprocity(config)
    assert "federated per user, 6 rounds of 3 local steps" in result.head()
    assert result.splits.num_individuals == load_movielens(50).num_users
    assert result.single.inflow.sum() == pytest.approx(result.single.outflow.sum(), rel=1e-9)


def test_the_results_files_hold_the_prefixes_and_alpha_along_training(small_run, tmp_path):
    """--results' frames of a real (small) run: the figures with the run's shape, the figures over the first k splits
    (the first the single split's, the last all splits'), α along training; the docs' tables render from them."""
    from simulations.experiments.reciprocity.markdown import (
        MOVIELENS_ALPHA_BY_STEP,
        MOVIELENS_PREFIXES,
        movielens_prefixes_table,
        results_frames,
    )
    from simulations.runner import read_results, write_results
    from tests.simulations.experiments.reciprocity.test_markdown import MOVIELENS_PAPER_FIGURES

    frames = results_frames([small_run])
    assert list(frames) == ["reciprocity_movielens_figures.csv", MOVIELENS_PREFIXES, MOVIELENS_ALPHA_BY_STEP]
    write_results(tmp_path, frames, "fedvalue run reciprocity --dataset movielens --results FOLDER")
    figures, prefixes, steps = (read_results(tmp_path / name) for name in frames)
    assert set(MOVIELENS_PAPER_FIGURES) <= set(figures["metric"])
    shape = figures.set_index("metric").loc[["splits", "initializations per split"]]
    assert shape["measured"].tolist() == [2, 2] and shape["paper"].tolist() == [10, 10]
    assert prefixes[["splits", "initializations"]].values.tolist() == [[1, 2], [2, 2]]
    for row, report in ((0, small_run.single), (1, small_run.splits)):
        assert prefixes.loc[row, "alpha"] == pytest.approx(report.alpha)
        assert prefixes.loc[row, "negative_outflow_share"] == pytest.approx(report.negative_outflow_share)
    assert steps.columns.tolist() == ["step", "single_split", "all_splits"] and len(steps) == 3
    rows = movielens_prefixes_table(prefixes, figures)
    assert rows[2].startswith("| 1 × 2 (the paper's \"single split\"; paper: 0.16, 0.89, 0.7 %, 19.6 %) | ")
    assert rows[3].startswith("| **2 × 2** (the paper's \"all splits\"; paper: 0.58, 0.98, 0.1 %, 8 %) | **")
