"""Fairness influence of training examples and the reweighting rules of [FAIRIJ].

**Fairness influence** ([FAIRIJ] Eq. 6). With F = F^Δa_{D_val}(θ) a relaxed gap on validation
data ([FAIRIJ] Eq. 5, :func:`fedvalue.scoring.fairness.objectives.gap_of_scores`: conditional means of the
probability h_θ), θ̂ the fitted model and H the Hessian of the weighted risk
(:class:`fedvalue.scoring.influence_curvature.WeightedRisk`, sum form, where Eq. 3 is exact),

    I_F,n = ∂F(θ*(w))/∂w_n |_{w=1} = −∇_θF(θ̂)ᵀ H⁻¹ g_n,

one solve s = H⁻¹∇F and one dot product per example (H symmetric): O(N·p) after the solve.
Any solver of :mod:`fedvalue.scoring.influence_curvature` stands in for H⁻¹ (exact, the damped
diagonal empirical Fisher of App. A, conjugate gradients, none).

**Reweighting** ([FAIRIJ] Eq. 9): w* = argmin_w F + I_Fᵀ(w − 1) + (1/λ) D(w, 1), solved in
closed form for each (W, D):

* Fair-IJ / drop-K (Prop. 3.1; W = {0,1}, D Hamming): the objective is a sum of independent
  terms I_n(w_n − 1) + |w_n − 1|/λ, so w_n = 0 exactly where I_n > 1/λ: K(λ) = #{n : I_n > 1/λ}
  examples are dropped, those of largest positive influence. (The proof's wording, "until the
  K-th instance such that K/λ > Σ_{n≤K} I_n", stops where the *mean* of the top K falls below
  1/λ, which drops at least as many; the minimizer is the threshold, and that is what is
  built and tested against brute force over {0,1}^N.)
* drop-K / upweight-M (Prop. C.1; W = {0,1,2}): w_n = 0 where I_n > 1/λ, 2 where I_n < −1/λ.
* I-JACK (Prop. 3.2; W = ℝ, D = ½‖w − 1‖²): w = 1 − λ I_F.
* SIM-JACK (Prop. 3.3; D = ½(w − 1)ᵀC⁻¹(w − 1)): w = 1 − λ C I_F, C = ΦΦᵀ + εI with Φ (N×P)
  one feature row per example (§3.2); C I_F = Φ(Φᵀ I_F) + ε I_F, never the N×N matrix.

**Update** ([FAIRIJ] Eq. 4, the infinitesimal jackknife): θ_fair = θ̂ − H⁻¹ G(w − 1),
G = [g_1 … g_N]; with the rules' weights this is Eq. 10 (Fair-IJ: θ̂ + Σ_m H⁻¹g_m), Eq. 11
(I-JACK: θ̂ − H⁻¹(λ Σ_n g_n g_nᵀ)H⁻¹∇F) and Eq. 12 (SIM-JACK). The alternative of [FAIRIJ] §3
is to retrain with the weights (:meth:`~fedvalue.scoring.influence_curvature.WeightedRisk.fit`).
"""

from __future__ import annotations

import numpy as np
import torch

from fedvalue._checks import check_choice, check_number
from fedvalue.scoring.fairness.objectives import GAPS, gap_of_scores
from fedvalue.scoring.influence_curvature import BinaryScoreModel

#: The closed-form rules of [FAIRIJ] Eq. 9.
RULES = ("fair-ij", "drop-upweight", "ijack", "simjack")


def _vector(name: str, value) -> np.ndarray:
    v = np.asarray(value.detach().numpy() if isinstance(value, torch.Tensor) else value, dtype=np.float64)
    if v.ndim != 1 or not np.isfinite(v).all():
        raise ValueError(f"{name}: expected a finite vector (one value per training example); got shape {v.shape}.")
    return v


def validation_gap(model: BinaryScoreModel, theta: torch.Tensor, x, y, z, gap: str = "dp") -> torch.Tensor:
    """F^Δa_{D_val}(θ) of [FAIRIJ] Eq. 5: the gap between the groups' mean probabilities h_θ
    (``gap`` "dp", "eop" = ΔDEO, "eo"), differentiable in θ."""
    check_choice("gap", gap, GAPS)
    h = model.probability(theta, torch.as_tensor(np.asarray(x, dtype=np.float64)))
    return gap_of_scores(h, torch.as_tensor(np.asarray(y)), torch.as_tensor(np.asarray(z)), gap)


def validation_gap_gradient(model: BinaryScoreModel, theta: torch.Tensor, x, y, z, gap: str = "dp") -> torch.Tensor:
    """g_a = ∇_θ F^Δa_{D_val}(θ) ([FAIRIJ] Eq. 6)."""
    return torch.func.grad(lambda t: validation_gap(model, t, x, y, z, gap))(theta)


def fairness_influences(per_example_gradients, gap_gradient, solver) -> np.ndarray:
    """I_F,n = −g_aᵀ M⁻¹ g_n for every row g_n of ``per_example_gradients`` ([FAIRIJ] Eq. 6),
    M⁻¹ given by ``solver.solve`` (one solve; M symmetric)."""
    g = torch.as_tensor(per_example_gradients, dtype=torch.float64)
    g_a = torch.as_tensor(gap_gradient, dtype=torch.float64)
    if g.ndim != 2 or g_a.shape != (g.shape[1],):
        raise ValueError(f"gap_gradient: expected a vector of the {g.shape[-1]} parameters the per-example gradients "
                         f"have (rows of shape (N, p)); got gradients {tuple(g.shape)} and gap_gradient "
                         f"{tuple(g_a.shape)}.")
    return -(g @ solver.solve(g_a)).numpy()


# -------------------------------------------------------------------------- rules


def fair_ij_weights(influences, lam: float) -> np.ndarray:
    """Prop. 3.1 (drop-K / Fair-IJ): w_n = 0 where I_n > 1/λ, else 1 (module docstring)."""
    i = _vector("influences", influences)
    lam = check_number("lam", lam, low=0.0, low_open=True)
    return np.where(i > 1.0 / lam, 0.0, 1.0)


def drop_upweight_weights(influences, lam: float) -> np.ndarray:
    """Prop. C.1 (drop-K / upweight-M): w_n = 0 where I_n > 1/λ, 2 where I_n < −1/λ, else 1."""
    i = _vector("influences", influences)
    lam = check_number("lam", lam, low=0.0, low_open=True)
    return np.where(i > 1.0 / lam, 0.0, np.where(i < -1.0 / lam, 2.0, 1.0))


def ijack_weights(influences, lam: float) -> np.ndarray:
    """Prop. 3.2 (I-JACK): w = 1 − λ I_F."""
    return 1.0 - check_number("lam", lam, low=0.0) * _vector("influences", influences)


def similarity_product(features, vector, epsilon: float) -> np.ndarray:
    """C v with C = ΦΦᵀ + εI ([FAIRIJ] §3.2), Φ = ``features`` (one row per example)."""
    phi = np.asarray(features, dtype=np.float64)
    v = _vector("influences", vector)
    if phi.ndim != 2 or len(phi) != len(v) or not np.isfinite(phi).all():
        raise ValueError(f"features: expected a finite (N, P) matrix with N = {len(v)} rows; got shape {phi.shape}.")
    epsilon = check_number("epsilon", epsilon, low=0.0, low_open=True, why="C = ΦΦᵀ + εI must be invertible")
    return phi @ (phi.T @ v) + epsilon * v


def simjack_weights(influences, lam: float, features, *, epsilon: float = 1e-3) -> np.ndarray:
    """Prop. 3.3 (SIM-JACK): w = 1 − λ C I_F, C = ΦΦᵀ + εI."""
    return 1.0 - check_number("lam", lam, low=0.0) * similarity_product(features, influences, epsilon)


def rule_weights(rule: str, influences, lam: float, *, features=None, epsilon: float = 1e-3) -> np.ndarray:
    """The weights of ``rule`` (one of :data:`RULES`) at strength λ."""
    rule = check_choice("rule", rule, RULES)
    if rule == "fair-ij":
        return fair_ij_weights(influences, lam)
    if rule == "drop-upweight":
        return drop_upweight_weights(influences, lam)
    if rule == "ijack":
        return ijack_weights(influences, lam)
    if features is None:
        raise ValueError("features: expected SIM-JACK's feature rows Φ (one per training example); got None.")
    return simjack_weights(influences, lam, features, epsilon=epsilon)


def proximal_objective(influences, weights, lam: float, distance: str = "hamming", *, features=None,
                       epsilon: float = 1e-3) -> float:
    """[FAIRIJ] Eq. 9 without its constant F(θ̂): I_Fᵀ(w − 1) + (1/λ) D(w, 1), with D the
    Hamming distance, ½‖w − 1‖² ("l2") or ½(w − 1)ᵀC⁻¹(w − 1) ("mahalanobis", C = ΦΦᵀ + εI,
    solved densely: for checks on small N)."""
    i, w = _vector("influences", influences), _vector("weights", weights)
    lam = check_number("lam", lam, low=0.0, low_open=True)
    distance = check_choice("distance", distance, ("hamming", "l2", "mahalanobis"))
    d = w - 1.0
    if distance == "hamming":
        penalty = float(np.count_nonzero(d))
    elif distance == "l2":
        penalty = 0.5 * float(d @ d)
    else:
        phi = np.asarray(features, dtype=np.float64)
        c = phi @ phi.T + epsilon * np.eye(len(i))
        penalty = 0.5 * float(d @ np.linalg.solve(c, d))
    return float(i @ d) + penalty / lam


# -------------------------------------------------------------------------- update


def ij_parameters(theta_hat: torch.Tensor, per_example_gradients, weights, solver) -> torch.Tensor:
    """θ_fair = θ̂ − M⁻¹ Σ_n (w_n − 1) g_n ([FAIRIJ] Eq. 4; Eqs. 10–12 for the rules' weights)."""
    g = torch.as_tensor(per_example_gradients, dtype=torch.float64)
    w = torch.as_tensor(_vector("weights", weights))
    if len(w) != len(g):
        raise ValueError(f"weights: expected one weight per gradient row ({len(g)}); got {len(w)}.")
    return theta_hat - solver.solve((w - 1.0) @ g)
