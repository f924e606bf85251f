"""[FAIRINFL]'s constraint influence through the NTK: Lemma 3.3 and Eq. 12, 35 against the
counterfactual gradient step they approximate, the corollaries' closed forms, pruning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedvalue.scoring.fairness import ntk as fair_ntk
from fedvalue.scoring.fairness.objectives import JOINT_GAPS, joint_gap_of_scores
from fedvalue.scoring.influence_curvature import BinaryScoreModel
from tests.fedvalue.scoring.fairness.test_objectives import one_thread  # noqa: F401 - one torch thread, as there



def setting(n: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 2, n)
    y = rng.integers(0, 2, n)
    x = np.column_stack([rng.normal(y + 0.7 * z, 1.0), rng.normal(size=n)])
    torch.manual_seed(seed)
    model = BinaryScoreModel(torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)))
    return model, model.theta0, torch.as_tensor(x), y, z


def linear_relaxation(model, theta, x, factors):
    """(1/n)Σ a_j f(x_j; θ): φ̂ without its absolute value, signs fixed at θ_0 (Eq. 15)."""
    return float(torch.as_tensor(factors) @ model.score(theta, x).detach()) / len(factors)


@pytest.mark.parametrize("constraint", JOINT_GAPS)
def test_relaxations_decompose_into_the_per_example_terms(constraint):
    model, theta, x, y, z = setting()
    f = model.score(theta, x).detach()
    factors = fair_ntk.constraint_factors(f.numpy(), y, z, constraint)
    value = float(joint_gap_of_scores(f, torch.as_tensor(y), torch.as_tensor(z), constraint))
    # Assumption 3.2 with the signs taken at θ_0: φ̂(f) = (1/n) Σ_i a_i f(x_i).
    assert value == pytest.approx(float(factors @ f.numpy()) / len(f), rel=1e-12)
    # a_i = ∂φ̂/∂f_i, by autograd through the absolute value.
    scores = f.clone().requires_grad_(True)
    joint_gap_of_scores(scores, torch.as_tensor(y), torch.as_tensor(z), constraint).backward()
    assert np.allclose(scores.grad.numpy() * len(f), factors, atol=1e-12)


@pytest.mark.parametrize("constraint", ["dp", "eo", "cov"])
def test_eq35_and_eq12_match_the_counterfactual_step_they_linearize(constraint):
    model, theta, x, y, z = setting()
    n = len(y)
    factors = fair_ntk.constraint_factors(model.score(theta, x).detach().numpy(), y, z, constraint)
    jacobian = model.score_jacobian(theta, x)
    lam, lr = 2.0, 1e-4
    scores = fair_ntk.constraint_influence(jacobian, factors, lam=lam, lr=lr)
    pairwise = fair_ntk.pairwise_constraint_influence(jacobian, jacobian, factors, lam=lam, lr=lr)
    # Eq. 35 is the (1/n) a_j-weighted sum of Eq. 12 (the closed form through the n×n NTK).
    assert np.allclose(scores, pairwise @ factors / n, rtol=1e-10, atol=1e-18)
    base = linear_relaxation(model, theta, x, factors)
    for i in (0, 5, 17):
        # Remove example i's constraint term from one step of rate η: θ' = θ_0 + (η/n) λ a_i ∇f(x_i).
        moved = theta + lr / n * lam * factors[i] * jacobian[i]
        assert linear_relaxation(model, moved, x, factors) - base == pytest.approx(scores[i], rel=1e-3, abs=1e-15)
        change = (model.score(moved, x) - model.score(theta, x)).detach().numpy()
        assert np.allclose(change, pairwise[i], rtol=1e-3, atol=1e-12)


def test_lemma_3_3_adds_the_loss_term():
    model, theta, x, y, z = setting()
    n, lr, lam = len(y), 1e-4, 0.5
    f = model.score(theta, x).detach().numpy()
    factors = fair_ntk.constraint_factors(f, y, z, "dp")
    loss_derivatives = fair_ntk.logistic_loss_derivatives(f, y)
    jacobian = model.score_jacobian(theta, x)
    i = 3
    kernel = (jacobian @ jacobian[i]).numpy()
    # Eq. 11: (η/n) Θ (∂ℓ/∂f + λ ∂φ̂/∂f) against the step that removes both of i's terms.
    target = lr / n * kernel * (loss_derivatives[i] + lam * factors[i])
    moved = theta + lr / n * (loss_derivatives[i] + lam * factors[i]) * jacobian[i]
    change = (model.score(moved, x) - model.score(theta, x)).detach().numpy()
    assert np.allclose(change, target, rtol=1e-3, atol=1e-12)
    aggregated = fair_ntk.loss_influence(jacobian, loss_derivatives, lr=lr)
    assert aggregated[i] == pytest.approx(lr / n ** 2 * loss_derivatives[i] * (kernel @ loss_derivatives), rel=1e-10)


def test_corollaries_4_1_and_4_2():
    rng = np.random.default_rng(3)
    n = 50
    z = np.repeat([0, 1], n // 2)  # z̄ = 1/2 exactly
    y = rng.integers(0, 2, n)
    f = rng.normal(size=n) + 1.5 * z  # group 1 higher on both y = 1 and y = 0
    dp = fair_ntk.constraint_factors(f, y, z, "dp")
    # Cor. 4.1: one group ahead on TPR and FPR terms -> S_EO = S_DP (same factors).
    assert np.array_equal(fair_ntk.constraint_factors(f, y, z, "eo"), dp)
    # Cor. 4.2: binary z with z̄ = 1/2 -> S_cov = S_DP / 2.
    assert np.allclose(fair_ntk.constraint_factors(f, y, z, "cov"), dp / 2)
    # The sign follows the favoured group ("reverse the sign of α_z", after Eq. 17).
    assert np.array_equal(fair_ntk.constraint_factors(-f, y, z, "dp"), -dp)


def test_pruning_orders_of_section_6_1():
    fairness = np.array([0.5, -0.1, 0.0, 2.0, -3.0])
    loss = np.array([1.0, -5.0, 0.2, 0.3, 0.0])
    assert fair_ntk.kept_examples("fairness", 3, fairness_scores=fairness).tolist() == [0, 3, 4]
    assert fair_ntk.kept_examples("accuracy", 2, loss_scores=loss).tolist() == [2, 4]
    kept = fair_ntk.kept_examples("random", 3, fairness_scores=fairness, seed=0)
    assert len(set(kept.tolist())) == 3 and kept.tolist() == fair_ntk.kept_examples(
        "random", 3, fairness_scores=fairness, seed=0).tolist()
    with pytest.raises(ValueError, match="keep"):
        fair_ntk.kept_examples("fairness", 6, fairness_scores=fairness)
    with pytest.raises(ValueError, match="loss_scores"):
        fair_ntk.kept_examples("accuracy", 2, fairness_scores=fairness)


def test_regularized_retraining_lowers_the_relaxed_gap():
    model, theta, x, y, z = setting(n=80, seed=4)
    plain = fair_ntk.fit_regularized(model, x.numpy(), y, z, gamma=0.0, max_iter=200)
    fair = fair_ntk.fit_regularized(model, x.numpy(), y, z, gamma=1.0, max_iter=200)
    relaxed = lambda t: float(joint_gap_of_scores(model.score(t, x).detach(), torch.as_tensor(y),  # noqa: E731
                                                  torch.as_tensor(z), "dp"))
    assert relaxed(fair) < 0.5 * relaxed(plain)
