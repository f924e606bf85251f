"""Client-level fairness influence with curvature (fedvalue.scoring.fairness.curvature) against its
references: the clients' loss gradients and Fisher diagonals are the central per-example
quantities of [FAIRIJ] App. A split by client; the influence is the central influence of
upweighting the client's examples with the same damped diagonal; it is the first-order
change of F along the damped step −(D + δ)⁻¹G_u (finite differences); the scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients.training import loss_gradient_and_fisher
from fedvalue.scoring.fairness.curvature import curvature_influences, drop_scores
from fedvalue.scoring.fairness.objectives import GroupFairness, fedavg_weight_derivatives
from fedvalue.scoring.influence_curvature import BinaryScoreModel, DiagonalSolver, WeightedRisk
from simulations.datasets.models import make_linear_model


def setting(seed=0, clients=4, per_client=15, features=3):
    rng = np.random.default_rng(seed)
    module = make_linear_model(features, 2, seed=seed)
    with torch.no_grad():  # away from the initial point, where gradients are informative
        for p in module.parameters():
            p.add_(torch.as_tensor(rng.normal(scale=0.5, size=tuple(p.shape)), dtype=p.dtype))
    xs = [rng.normal(size=(per_client, features)) + rng.normal(size=features) for _ in range(clients)]
    ys = [(x[:, 0] + rng.normal(size=per_client) > 0).astype(np.int64) for x in xs]
    x_test = rng.normal(size=(200, features))
    z_test = (x_test[:, 1] > 0).astype(np.int64)
    y_test = (x_test[:, 0] > 0).astype(np.int64)
    objective = GroupFairness(module, x_test, y_test, z_test, gap="dp")
    arrays = {k: v.detach().numpy().astype(np.float64) for k, v in module.state_dict().items()}
    return module, xs, ys, objective, arrays


def client_quantities(module, xs, ys):
    sent = [loss_gradient_and_fisher(module, x.astype(np.float32), y) for x, y in zip(xs, ys)]
    return {u: g for u, (g, _) in enumerate(sent)}, {u: d for u, (_, d) in enumerate(sent)}


def test_clients_send_the_central_per_example_gradients_summed_and_squared():
    module, xs, ys, _, _ = setting()
    gradients, fishers = client_quantities(module, xs, ys)
    central = BinaryScoreModel(module)
    for u, (x, y) in enumerate(zip(xs, ys)):
        risk = WeightedRisk(central, x.astype(np.float32).astype(np.float64), y)
        g = risk.per_example_gradients(central.theta0)  # rows g_n, flat in named_parameters order
        flat_sent = np.concatenate([gradients[u][k].ravel() for k in central.names])
        flat_fisher = np.concatenate([fishers[u][k].ravel() for k in central.names])
        np.testing.assert_allclose(flat_sent, g.sum(dim=0).numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(flat_fisher, risk.fisher_diagonal(central.theta0).numpy(), rtol=1e-10, atol=1e-12)


def test_the_federated_influence_is_the_central_one_of_upweighting_the_clients_examples():
    module, xs, ys, objective, arrays = setting(seed=1)
    gradients, fishers = client_quantities(module, xs, ys)
    damping = 0.3
    got = curvature_influences(objective.gradient(arrays), gradients, fishers, damping=damping)
    central = BinaryScoreModel(module)
    pooled = WeightedRisk(central, np.concatenate(xs).astype(np.float32).astype(np.float64), np.concatenate(ys))
    solver = DiagonalSolver(pooled.fisher_diagonal(central.theta0), damping=damping)
    grad_f = torch.as_tensor(np.concatenate([objective.gradient(arrays)[k].ravel() for k in central.names]))
    per_example = pooled.per_example_gradients(central.theta0)
    start = 0
    for u, x in enumerate(xs):
        g_u = per_example[start:start + len(x)].sum(dim=0)
        start += len(x)
        # [FAIRIJ] Eq. 6 summed over u's examples: −∇Fᵀ M⁻¹ Σ_{n∈u} g_n, M the damped diagonal Fisher.
        assert got[u] == pytest.approx(-float(grad_f @ solver.solve(g_u)), rel=1e-9, abs=1e-14)


def test_the_influence_is_the_first_order_change_of_the_gap_along_the_damped_step():
    module, xs, ys, objective, arrays = setting(seed=2)
    gradients, fishers = client_quantities(module, xs, ys)
    damping = 0.5
    got = curvature_influences(objective.gradient(arrays), gradients, fishers, damping=damping)
    diagonal = {k: sum(fishers[u][k] for u in fishers) + damping for k in arrays}
    for u in gradients:
        step = {k: -gradients[u][k] / diagonal[k] for k in arrays}
        eps = 1e-5
        plus = objective.relaxed_gap({k: arrays[k] + eps * step[k] for k in arrays})
        minus = objective.relaxed_gap({k: arrays[k] - eps * step[k] for k in arrays})
        assert got[u] == pytest.approx((plus - minus) / (2 * eps), rel=1e-5, abs=1e-10)
    assert len({np.sign(v) for v in got.values()}) == 2  # the instance has clients on both sides


def test_scores_renormalize_and_the_exact_score_is_minus_loo():
    influences = {"a": 0.3, "b": -0.1, "c": 0.05}
    weights = {"a": 10.0, "b": 30.0, "c": 20.0}
    curvature = {"a": -0.2, "b": 0.4}  # c sent none: counts as 0
    renormalized = drop_scores("renormalized", influences=influences, weights=weights)
    assert renormalized == fedavg_weight_derivatives(influences, weights)
    assert sum(renormalized.values()) == pytest.approx(0.0, abs=1e-15)
    with_curvature = drop_scores("curvature", influences=influences, weights=weights, curvature=curvature)
    assert with_curvature["c"] == pytest.approx(-20 / 60 * 0.2)
    assert drop_scores("exact", influences=influences, weights=weights,
                       loo_fairness={"a": 0.1, "b": -0.2, "c": 0.0}) == {"a": -0.1, "b": 0.2, "c": -0.0}
    with pytest.raises(ValueError, match="score: 'exact' needs LOO"):
        drop_scores("exact", influences=influences, weights=weights)
    with pytest.raises(ValueError, match="score: expected one of"):
        drop_scores("second-order", influences=influences, weights=weights)
    with pytest.raises(ValueError, match="damping"):
        curvature_influences({"w": np.ones(2)}, {"a": {"w": np.ones(2)}}, {"a": {"w": np.ones(2)}}, damping=0.0)
