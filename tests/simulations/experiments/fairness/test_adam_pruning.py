"""[FAIRINFL] §6.1's retraining (Adam at 0.001 for a stated number of epochs) beside the exact
minimizer of Eq. 10, and the pruning table built with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedvalue.scoring.fairness.ntk import fit_regularized, regularized_objective
from fedvalue.scoring.influence_curvature import BinaryScoreModel
from simulations.experiments.fairness.adam_fit import fit_regularized_adam
from simulations.experiments.fairness.central import (
    FairnessCentralConfig,
    run_fairness_central,
)
from simulations.experiments.fairness.data import toy_rows


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


def test_slid_pruning_with_adam_writes_the_pruning_table():
    config = FairnessCentralConfig(experiment="tabular", seeds=2, lams=2, prune_fractions=(0.5,),
                                   prune_optimizer="adam", prune_epochs=2, prune_gamma=0.1)
    tables = run_fairness_central(config)
    pruning = tables["pruning"].set_index(["keep", "order"])
    assert set(pruning.index) == {(1.0, "erm"), (1.0, "full"), (0.5, "fairness"), (0.5, "accuracy"), (0.5, "random")}
    assert np.isfinite(pruning.loc[(0.5, "fairness"), "test_dp_gap_vs_random"])
    exact = run_fairness_central(FairnessCentralConfig(**{**config.__dict__, "prune_optimizer": "lbfgs"}))
    assert not np.allclose(tables["pruning_runs"]["test_dp_gap"], exact["pruning_runs"]["test_dp_gap"])
    with pytest.raises(ValueError, match="prune_optimizer"):
        FairnessCentralConfig(prune_optimizer="sgd").check()
