"""Coalition scoring on Ray actors equals the single-process path (real Ray, 2 actors)."""

from __future__ import annotations

import numpy as np
import pytest

from fedvalue.valuation.round_game import fedavg_round_game, value_round, weighted_mean
from fedvalue.scoring.torch_utilities import TorchModelUtility
from simulations.datasets.models import make_mlp
from simulations.runner.parallel import RayParallelUtility


@pytest.fixture(scope="module")
def round_inputs():
    rng = np.random.default_rng(0)
    model = make_mlp(12, 4, hidden=(24,), seed=0)
    x = rng.normal(size=(500, 12)).astype(np.float32)
    y = rng.integers(0, 4, 500)
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    clients = [{k: (v + 0.3 * rng.normal(size=v.shape)).astype(np.float32) for k, v in start.items()}
               for _ in range(7)]
    weights = rng.integers(5, 50, 7).astype(float)
    return model, x, y, start, clients, weights


@pytest.mark.timeout(300)
def test_ray_actors_give_the_single_process_values(round_inputs):
    model, x, y, start, clients, weights = round_inputs
    utility = TorchModelUtility(model, x, y, batch_size=128)
    ids = list(range(7))
    local = value_round(fedavg_round_game(ids, start, clients, weights, utility), ("ads", "loo"))
    with RayParallelUtility(utility, num_workers=2, min_states=8) as parallel:
        game = fedavg_round_game(ids, start, clients, weights, parallel)
        scaled = value_round(game, ("ads", "loo"))
        assert game.num_evaluations == 2**7
        batch = parallel.batch(clients * 5)  # 35 states: over min_states, split across actors
    for method in ("ads", "loo"):
        np.testing.assert_array_equal(scaled.results[method].values, local.results[method].values)
    np.testing.assert_array_equal(batch, [utility(c) for c in clients] * 5)
    assert scaled.utility_after == utility(weighted_mean(clients, weights))


def test_bad_parallel_options_name_the_parameter(round_inputs):
    model, x, y, *_ = round_inputs
    with pytest.raises(TypeError, match="utility: expected a fedvalue TorchModelUtility"):
        RayParallelUtility(lambda arrays: 0.0)
    with pytest.raises(ValueError, match="num_workers"):
        RayParallelUtility(TorchModelUtility(model, x, y), num_workers=0)
