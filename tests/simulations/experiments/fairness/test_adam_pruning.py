"""[FAIRINFL] §6.1's retraining (Adam at 0.001 for a stated number of epochs) beside the exact
minimizer of Eq. 10, and the pruning table built with it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fedvalue.scoring.fairness.ntk import fit_regularized, regularized_objective
from fedvalue.scoring.influence_curvature import BinaryScoreModel
from simulations.experiments.fairness.adam_fit import fit_regularized_adam
from simulations.experiments.fairness.central import (
    FairnessCentralConfig,
    pruning_seed,
    pruning_summary,
)
from simulations.experiments.fairness.data import slid_frame, toy_rows


def _toy(n: int = 400):
    x, y, z = toy_rows(n, np.random.default_rng(0))
    layer = torch.nn.Linear(1, 1)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()
    return BinaryScoreModel(layer), x, y, z


@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_adam_run_long_enough_reaches_the_minimizer_of_eq_10(gamma):
    model, x, y, z = _toy()
    exact = fit_regularized(model, x, y, z, gamma=gamma)
    adam = fit_regularized_adam(model, x, y, z, gamma=gamma, epochs=300, learning_rate=0.05, batch_size=400)
    objective = regularized_objective(model, x, y, z, gamma=gamma)
    assert float(objective(adam)) == pytest.approx(float(objective(exact)), abs=1e-4)
    # At the paper's 0.001 and a few epochs it is still far from it: the regime §6.1's figures are in.
    short = fit_regularized_adam(model, x, y, z, gamma=gamma, epochs=3, learning_rate=1e-3, batch_size=64)
    assert float(objective(short)) > float(objective(exact)) + 1e-2


def test_adam_retraining_is_seeded_and_skips_one_group_batches():
    model, x, y, z = _toy(50)
    first = fit_regularized_adam(model, x, y, z, gamma=1.0, epochs=2, seed=3, batch_size=8)
    assert torch.equal(first, fit_regularized_adam(model, x, y, z, gamma=1.0, epochs=2, seed=3, batch_size=8))
    assert not torch.equal(first, fit_regularized_adam(model, x, y, z, gamma=1.0, epochs=2, seed=4, batch_size=8))
    only_group_one = np.ones_like(z)
    assert torch.equal(fit_regularized_adam(model, x, y, only_group_one, gamma=1.0, epochs=2), model.theta0)
    with pytest.raises(ValueError, match="epochs"):
        fit_regularized_adam(model, x, y, z, gamma=1.0, epochs=0)


def test_slid_pruning_with_adam_gives_the_pruning_table():
    config = FairnessCentralConfig(experiment="tabular", seeds=2, prune_fractions=(0.5,), prune_optimizer="adam",
                                   prune_epochs=2, prune_gamma=0.1)
    frame = slid_frame()
    runs = pd.DataFrame(pruning_seed(config, 0, frame) + pruning_seed(config, 1, frame))
    pruning = pruning_summary(runs, 0.95).set_index(["keep", "order"])
    assert set(pruning.index) == {(1.0, "erm"), (1.0, "full"), (0.5, "fairness"), (0.5, "accuracy"), (0.5, "random")}
    assert np.isfinite(pruning.loc[(0.5, "fairness"), "test_dp_gap_vs_random"])
    exact = pd.DataFrame(pruning_seed(FairnessCentralConfig(**{**config.__dict__, "prune_optimizer": "lbfgs"}), 0,
                                      frame))
    adam = runs[runs["seed"] == 0].reset_index(drop=True)
    assert adam.loc[0, "test_dp_gap"] == exact.loc[0, "test_dp_gap"]  # the same ERM model
    assert not np.allclose(adam["test_dp_gap"][1:], exact["test_dp_gap"][1:])  # retrained differently
    with pytest.raises(ValueError, match="prune_optimizer"):
        FairnessCentralConfig(prune_optimizer="sgd").check()
