"""Client-level fairness influence with curvature, FedAvg's renormalization, and the scores
the federated drop rules act on (this project's extension of [FAIRIJ] to federated rounds).

**What clients send.** With the query on, every sampled client answers at the state it
received, A_{t−1}, with its training loss gradient and the diagonal of its empirical Fisher,

    G_u = Σ_{n∈u} ∇ℓ_n(A_{t−1}),        d_u = Σ_{n∈u} ∇ℓ_n(A_{t−1}) ⊙ ∇ℓ_n(A_{t−1}),

(:func:`clients.training.loss_gradient_and_fisher`): two vectors of the model's size, the
diagonal Fisher of [FAIRIJ] App. A split by client, so the server sums d = Σ_v d_v over the
round's valid replies without seeing an example. (Why not the full Hessian, or Hessian-vector
products by extra rounds of messages: the Hessian is p×p per client, and an iterative solve
needs a round trip per iteration; the diagonal is one reply, the paper's own approximation.)

**Curvature influence** ([FAIRIJ] Eq. 6 at client level, App. A's damped diagonal Fisher).
Upweighting client u's risk in the round's risk Σ_v ω_v L_v(θ) moves its minimizer by
∂θ*/∂ω_u = −H⁻¹ G_u ([FAIRIJ] Eq. 3, sum form), so

    I^H_t(u) = −∇F(A_{t−1})ᵀ (D + δI)⁻¹ G_u,     D = diag(Σ_v d_v),

the first-order change of the relaxed gap F when u's data weigh more (> 0: u raises the gap).
The influence is taken at A_{t−1}, not at a fitted model: federated rounds are not at a
minimizer, which is why the renormalization below matters.

**Renormalized derivative.** FedAvg aggregates with weights n_u / Σ_v n_v; reweighting one
client renormalizes all of them, so the derivative the drop rules act on is
∂F/∂ω_u = I(u) − p_u Σ_v I(v) (:func:`fedvalue.scoring.fairness.objectives.fedavg_weight_derivatives`),
for I the first-order step influence I^F_t or the curvature influence I^H_t.

**Scores** (:data:`SCORES`; each maps a client to how much it raises the gap, > 0: dropping
it should lower the gap): ``first-order`` I^F_t(u), ``renormalized`` its renormalized
derivative, ``curvature`` the renormalized derivative of I^H_t, and ``exact`` the exact drop
effect F(Agg(I_t)) − F(Agg(I_t ∖ {u})) = −loo_fairness(u): the reference every first-order
score is judged against.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import numpy as np

from fedvalue._checks import check_choice, check_number
from fedvalue.scoring.fairness.objectives import fedavg_weight_derivatives
from fedvalue.scoring.influence_curvature import DiagonalSolver
from fedvalue.scoring.projection import flatten

#: The scores a drop rule may act on (module docstring).
SCORES = ("first-order", "renormalized", "curvature", "exact")
#: Scores that need the clients' loss gradients and Fisher diagonals.
CURVATURE_SCORES = ("curvature",)


def curvature_influences(
    fairness_gradient: Mapping[str, np.ndarray],
    loss_gradients: Mapping[Hashable, Mapping[str, np.ndarray]],
    fisher_diagonals: Mapping[Hashable, Mapping[str, np.ndarray]],
    *,
    damping: float,
) -> dict[Hashable, float]:
    """I^H_t(u) = −∇Fᵀ (Σ_v d_v + δ)⁻¹ G_u of every client of ``loss_gradients`` (module docstring).

    Parameters
    ----------
    fairness_gradient
        ∇F(A_{t−1}), keyed like the model's state (its keys fix the flattening order).
    loss_gradients, fisher_diagonals
        Client -> G_u and d_u (same clients, same keys as ``fairness_gradient``).
    damping
        δ > 0 added to the summed diagonal ([FAIRIJ] App. A's dampener).

    Returns
    -------
    dict
        Client -> I^H_t(u), in the order of ``loss_gradients``.
    """
    damping = check_number("damping", damping, low=0.0, low_open=True)
    if set(loss_gradients) != set(fisher_diagonals):
        raise ValueError(f"fisher_diagonals: expected the clients of loss_gradients {list(loss_gradients)}; got "
                         f"{list(fisher_diagonals)}.")
    if not loss_gradients:
        return {}
    keys = list(fairness_gradient)
    g = flatten(fairness_gradient, keys=keys, name="fairness_gradient")
    diagonal = sum(flatten(fisher_diagonals[c], keys=keys, name=f"fisher_diagonals[{c!r}]") for c in loss_gradients)
    if not (np.isfinite(diagonal).all() and (diagonal >= 0).all()):
        raise ValueError("fisher_diagonals: expected finite non-negative diagonals (sums of squared gradients).")
    direction = DiagonalSolver(diagonal, damping=damping).solve(g).numpy()  # (D + δ)⁻¹ ∇F: D is symmetric
    return {c: -float(flatten(grad, keys=keys, name=f"loss_gradients[{c!r}]") @ direction)
            for c, grad in loss_gradients.items()}


def drop_scores(score: str, *, influences: Mapping[Hashable, float], weights: Mapping[Hashable, float],
                curvature: Mapping[Hashable, float] | None = None,
                loo_fairness: Mapping[Hashable, float] | None = None) -> dict[Hashable, float]:
    """Client -> how much it raises the gap, by ``score`` (:data:`SCORES`, module docstring).

    ``influences`` are the first-order I^F_t, ``weights`` the FedAvg weights n_u,
    ``curvature`` the I^H_t (``curvature`` score; a valid reply that sent no loss gradient
    and Fisher diagonal counts as I^H = 0, so a client cannot stop the round by withholding
    them), ``loo_fairness`` the round's LOO values in the game U = −F (``exact`` score; it
    must cover every client of ``influences``).
    """
    score = str(check_choice("score", score, SCORES))
    if score == "first-order":
        return dict(influences)
    if score == "renormalized":
        return fedavg_weight_derivatives(influences, weights)
    if score == "curvature":
        if curvature is None:
            raise ValueError("score: 'curvature' needs the clients' loss gradients and Fisher diagonals (the run "
                             "must ask for them).")
        return fedavg_weight_derivatives({c: float(curvature.get(c, 0.0)) for c in influences}, weights)
    if loo_fairness is None or any(c not in loo_fairness for c in influences):
        raise ValueError("score: 'exact' needs LOO on fairness (methods must include 'loo').")
    return {c: -float(loo_fairness[c]) for c in influences}
