"""[FAIRIJ] Eq. 6 influences against finite differences of the retrained fairness; the
reweighting rules against brute force and their closed forms; the IJ update (Eqs. 4, 10–12)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fedvalue.scoring.fairness import reweighting as fr
from fedvalue.scoring.influence_curvature import (
    BinaryScoreModel,
    ConjugateGradientSolver,
    DiagonalSolver,
    ExactSolver,
    IdentitySolver,
    WeightedRisk,
)
from tests.fedvalue.scoring.fairness.test_objectives import one_thread  # noqa: F401 - one torch thread, as there



def rows(n: int, seed: int):
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 2, n)
    y = (rng.random(n) < 0.3 + 0.4 * z).astype(int)
    x = np.column_stack([rng.normal(y + 0.5 * z, 1.0), rng.normal(size=n), z])
    return x, y, z


def logistic() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def tiny_mlp() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def fitted(module: torch.nn.Module, ridge: float = 0.5):
    x, y, _ = rows(60, 0)
    model = BinaryScoreModel(module)
    risk = WeightedRisk(model, x, y, ridge=ridge)
    theta = risk.fit(newton_steps=30)
    assert float(risk.gradient(theta).abs().max()) < 1e-9
    return model, risk, theta


def validation(model, theta, gap="dp"):
    xv, yv, zv = rows(80, 1)
    return (lambda t: float(fr.validation_gap(model, t, xv, yv, zv, gap)),
            fr.validation_gap_gradient(model, theta, xv, yv, zv, gap))


@pytest.mark.parametrize("module", [logistic, tiny_mlp], ids=["logistic", "mlp"])
@pytest.mark.parametrize("gap", ["dp", "eo"])
def test_eq6_influence_matches_finite_differences_of_the_retrained_gap(module, gap):
    model, risk, theta = fitted(module())
    value, gradient = validation(model, theta, gap)
    influences = fr.fairness_influences(risk.per_example_gradients(theta), gradient,
                                        ExactSolver(risk.hessian(theta)))
    eps = 1e-4
    for n in (0, 7, 31, 59):
        up, down = np.ones(risk.num_examples), np.ones(risk.num_examples)
        up[n] += eps
        down[n] -= eps
        numeric = (value(risk.fit(theta, up, newton_steps=10)) - value(risk.fit(theta, down, newton_steps=10))) / (
            2 * eps)
        assert influences[n] == pytest.approx(numeric, rel=1e-4, abs=1e-9)
    # Dropping the most influential example (w_n: 1 -> 0, a finite step) moves F the predicted way.
    n = int(np.argmax(np.abs(influences)))
    dropped = np.ones(risk.num_examples)
    dropped[n] = 0.0
    change = value(risk.fit(theta, dropped, newton_steps=10)) - value(theta)
    assert np.sign(change) == -np.sign(influences[n]) and abs(change) > 0.5 * abs(influences[n])


def test_conjugate_gradients_and_the_damped_fisher_against_their_definitions():
    model, risk, theta = fitted(tiny_mlp())
    _, gradient = validation(model, theta)
    g = risk.per_example_gradients(theta)
    exact = fr.fairness_influences(g, gradient, ExactSolver(risk.hessian(theta)))
    solver = ConjugateGradientSolver(lambda v: risk.hvp(theta, v), tol=1e-12, max_iter=200)
    assert np.allclose(fr.fairness_influences(g, gradient, solver), exact, rtol=1e-8, atol=1e-12)
    assert 0 < solver.iterations <= risk.model.num_parameters + 5
    # Per-example gradients against a loop of autograd; the Fisher diagonal Σ g_n² (+ ridge).
    loop = torch.stack([torch.func.grad(lambda t: risk.losses(t)[n])(theta) for n in range(risk.num_examples)])
    assert torch.allclose(g, loop, atol=1e-12)
    assert torch.allclose(risk.fisher_diagonal(theta), (loop ** 2).sum(0) + risk.ridge, atol=1e-12)
    damped = DiagonalSolver.empirical_fisher(g, damping=0.3)
    assert torch.allclose(damped.solve(gradient), gradient / ((loop ** 2).sum(0) + 0.3))
    assert torch.allclose(IdentitySolver().solve(gradient), gradient)
    # The Hessian by Hessian-vector products equals torch's dense Hessian.
    dense = torch.func.hessian(lambda t: risk.value(t))(theta)
    assert torch.allclose(risk.hessian(theta, chunk=5), dense, atol=1e-10)


def test_solvers_refuse_non_positive_curvature_with_the_damping_named():
    saddle = torch.diag(torch.tensor([1.0, -2.0], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"damping: .*raise damping above 2"):
        ExactSolver(saddle)
    assert torch.allclose(ExactSolver(saddle, damping=3.0).solve(torch.tensor([4.0, 1.0])),
                          torch.tensor([1.0, 1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="damping"):
        ConjugateGradientSolver(lambda v: saddle @ v).solve(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="damping"):
        DiagonalSolver(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="gap_gradient"):
        fr.fairness_influences(np.ones((4, 3)), np.ones(2), IdentitySolver())
    with pytest.raises(ValueError, match="weights"):
        fr.ij_parameters(torch.zeros(3), np.ones((4, 3)), np.ones(5), IdentitySolver())
    with pytest.raises(ValueError, match="y"):
        WeightedRisk(BinaryScoreModel(torch.nn.Linear(3, 1)), np.ones((4, 3)), [0, 1, 2, 1])


# -------------------------------------------------------------------------- rules


def test_fair_ij_and_drop_upweight_minimize_eq9_by_brute_force():
    rng = np.random.default_rng(5)
    for trial in range(6):
        influences = rng.normal(size=7) * 0.5
        for lam in (0.5, 2.0, 10.0):
            best = min(itertools.product((0.0, 1.0), repeat=7),
                       key=lambda w: fr.proximal_objective(influences, w, lam))
            weights = fr.fair_ij_weights(influences, lam)
            assert fr.proximal_objective(influences, weights, lam) == pytest.approx(
                fr.proximal_objective(influences, best, lam), abs=1e-12)
            # K from λ: the examples with I_n > 1/λ, the largest positive influences.
            assert set(np.flatnonzero(weights == 0)) == set(np.flatnonzero(influences > 1 / lam))
            best3 = min(itertools.product((0.0, 1.0, 2.0), repeat=7),
                        key=lambda w: fr.proximal_objective(influences, w, lam))
            ternary = fr.drop_upweight_weights(influences, lam)
            assert fr.proximal_objective(influences, ternary, lam) == pytest.approx(
                fr.proximal_objective(influences, best3, lam), abs=1e-12)
            assert np.all(ternary[influences < -1 / lam] == 2.0)


def test_ijack_and_simjack_are_the_stationary_points_of_eq9():
    rng = np.random.default_rng(6)
    influences = rng.normal(size=9)
    features = rng.normal(size=(9, 3))
    lam, epsilon = 0.7, 0.05
    c = features @ features.T + epsilon * np.eye(9)
    assert np.allclose(fr.similarity_product(features, influences, epsilon), c @ influences)
    ijack = fr.ijack_weights(influences, lam)
    simjack = fr.simjack_weights(influences, lam, features, epsilon=epsilon)
    # ∇_w Eq. 9 = I + (1/λ) D'(w) = 0, and the (convex) objective is no lower anywhere nearby.
    assert np.allclose(influences + (ijack - 1) / lam, 0)
    assert np.allclose(influences + np.linalg.solve(c, simjack - 1) / lam, 0)
    for weights, distance in ((ijack, "l2"), (simjack, "mahalanobis")):
        at = fr.proximal_objective(influences, weights, lam, distance, features=features, epsilon=epsilon)
        for _ in range(20):
            moved = weights + 0.1 * rng.normal(size=9)
            assert fr.proximal_objective(influences, moved, lam, distance, features=features,
                                         epsilon=epsilon) > at
    # C = εI (no features) collapses SIM-JACK to I-JACK with λε.
    assert np.allclose(fr.simjack_weights(influences, lam, np.zeros((9, 1)), epsilon=epsilon),
                       fr.ijack_weights(influences, lam * epsilon))
    with pytest.raises(ValueError, match="features"):
        fr.rule_weights("simjack", influences, lam)
    with pytest.raises(ValueError, match="lam"):
        fr.fair_ij_weights(influences, 0.0)


def test_ij_update_is_eqs_10_to_12_and_first_order_in_the_retrained_model():
    model, risk, theta = fitted(logistic())
    _, g_a = validation(model, theta)
    g = risk.per_example_gradients(theta)
    h = risk.hessian(theta)
    solver = ExactSolver(h)
    h_inv = torch.linalg.inv(h)
    influences = fr.fairness_influences(g, g_a, solver)
    lam = 3.0
    # Eq. 11: θ̂ − H⁻¹(λ Σ g_n g_nᵀ)H⁻¹ g_a.
    eq11 = theta - h_inv @ (lam * g.T @ g) @ h_inv @ g_a
    assert torch.allclose(fr.ij_parameters(theta, g, fr.ijack_weights(influences, lam), solver), eq11, atol=1e-10)
    # Eq. 12 with C = ΦΦᵀ + εI.
    features = np.random.default_rng(2).normal(size=(risk.num_examples, 2))
    c = torch.as_tensor(features @ features.T + 1e-2 * np.eye(risk.num_examples))
    eq12 = theta - h_inv @ (lam * g.T @ c @ g) @ h_inv @ g_a
    simjack = fr.simjack_weights(influences, lam, features, epsilon=1e-2)
    assert torch.allclose(fr.ij_parameters(theta, g, simjack, solver), eq12, atol=1e-10)
    # Eq. 10: θ̂ + Σ_m H⁻¹ g_m over the dropped examples.
    lam_drop = 2.0 / float(np.max(influences))
    dropped = fr.fair_ij_weights(influences, lam_drop)
    m = np.flatnonzero(dropped == 0)
    assert len(m) >= 1
    assert torch.allclose(fr.ij_parameters(theta, g, dropped, solver), theta + h_inv @ g[m].sum(0), atol=1e-10)
    # Eq. 4 is first order in w − 1: the gap to the retrained model shrinks like ε².
    direction = np.random.default_rng(3).normal(size=risk.num_examples)
    gaps = []
    for eps in (1e-2, 1e-3):
        w = 1 + eps * direction
        gaps.append(float((fr.ij_parameters(theta, g, w, solver) - risk.fit(theta, w, newton_steps=10)).norm()))
    assert gaps[1] < gaps[0] / 50
