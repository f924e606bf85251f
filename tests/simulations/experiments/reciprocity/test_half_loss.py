"""The diabetes model with App. A's ½ on the squared loss (``squared_loss="half"``).

Reference: ℓ_half = ½ℓ, so ∇ℓ_half = ½∇ℓ and gradient descent on ℓ_half at η follows the
trajectory of gradient descent on ℓ at η/2; every TracIn flow (η/|Z|)Σ ∇ℓ_z·∇ℓ_z' is then
(η/|Z|)·¼Σ ∇ℓ·∇ℓ' = ½ × the plain model's flow at η/2, and every loss is ½ × the plain loss.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulations.experiments.reciprocity.centralized import (
    ReciprocityConfig,
    _load,
    _split,
    check,
    run_centralized_reciprocity,
)
from simulations.experiments.reciprocity.training import marginal_split, tracin_split


def _rows(size: int = 30):
    x, y = _load("diabetes", "raw")
    rows = np.random.default_rng(5).choice(len(y), size=size, replace=False)
    train, infer = _split(np.random.default_rng(6), size)
    return x[rows], y[rows], train, infer


def test_half_loss_flows_are_half_the_plain_flows_at_half_the_step():
    x, y, train, infer = _rows()
    half = tracin_split("linear-half", x, y, train, infer, steps=7, learning_rate=0.02, checkpoint_every=1)
    plain = tracin_split("linear", x, y, train, infer, steps=7, learning_rate=0.01, checkpoint_every=1)
    np.testing.assert_allclose(half.outflow, 0.5 * plain.outflow, rtol=1e-10)
    np.testing.assert_allclose(half.inflow, 0.5 * plain.inflow, rtol=1e-10)
    np.testing.assert_allclose(half.cumulative_outflow, 0.5 * plain.cumulative_outflow, rtol=1e-10)
    assert half.quality == pytest.approx(plain.quality, rel=1e-12)  # the same model: the same RMSE
    full_half, removed_half = marginal_split("linear-half", x, y, train, infer, steps=5, learning_rate=0.02)
    full_plain, removed_plain = marginal_split("linear", x, y, train, infer, steps=5, learning_rate=0.01)
    np.testing.assert_allclose(full_half, 0.5 * full_plain, rtol=1e-10)
    np.testing.assert_allclose(removed_half, 0.5 * removed_plain, rtol=1e-10)


def test_half_loss_changes_the_default_run_and_says_so():
    common = {"dataset": "diabetes", "repetitions": 3, "steps": 20}
    plain = run_centralized_reciprocity(ReciprocityConfig(**common))
    half = run_centralized_reciprocity(ReciprocityConfig(**common, squared_loss="half"))
    assert "1/2 (f - y)^2" in half.head() and "1/2" not in plain.head()
    assert not np.allclose(half.individuals["tracin_outflow"], plain.individuals["tracin_outflow"])


@pytest.mark.parametrize(("changes", "message"), [
    ({"dataset": "breast-cancer", "squared_loss": "half"}, "squared_loss: 'half' applies to the diabetes"),
    ({"dataset": "diabetes", "squared_loss": "quarter"}, "squared_loss"),
])
def test_half_loss_is_refused_where_it_means_nothing(changes, message):
    with pytest.raises(ValueError, match=message):
        check(ReciprocityConfig(**changes))


def test_a_movielens_run_leaves_each_finished_split_behind(tmp_path):
    """The CLI writes the per-split mean flows after every split (what a stopped run keeps); at the
    end they average to the all-splits books."""
    import pandas as pd

    from simulations.cli.main import main

    out = tmp_path / "ml"
    assert main(["run", "reciprocity", "--dataset", "movielens", "--repetitions", "2", "--initializations", "1",
                 "--steps", "6", "--min-item-ratings", "50", "--out", str(out), "--quiet"]) == 0
    splits = np.load(out / "movielens-splits.npz")
    assert splits["inflow"].shape == splits["outflow"].shape == (2, len(splits["user_id"]))
    assert len(splits["inference_rmse"]) == 2
    table = pd.read_csv(out / "movielens-individuals.csv", index_col="user_id")
    np.testing.assert_allclose(table.loc[splits["user_id"], "outflow_all_splits"], splits["outflow"].mean(axis=0),
                               rtol=1e-12)
    np.testing.assert_allclose(table.loc[splits["user_id"], "outflow_single_split"], splits["outflow"][0], rtol=1e-12)
