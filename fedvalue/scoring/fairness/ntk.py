"""Influence of an example's fairness-constraint term through the neural tangent kernel, and
pruning by it ([FAIRINFL] §3–6).

**Setting** ([FAIRINFL] Eq. 10): the model f(x; θ) (a real score, prediction 1[f ≥ 0]) is
trained on (1/n)Σ_i ℓ(f(x_i), y_i) + λ φ̂(f), φ̂ a relaxed constraint that decomposes as
φ̂(f) = (1/n)Σ_i φ̂(f, i) (Assumption 3.2). For the relaxations of §4.1–4.2
(:func:`fedvalue.scoring.fairness.objectives.joint_gap_of_scores`) the per-example term is a_i f(x_i; θ), with
a_i = ∂φ̂(f, i)/∂f:

* ``dp`` (Eq. 16): a_i = s·α_{z_i}, α_z = 1[z=1] − 1[z=0];
* ``eop`` (equal TPR, Eq. 21): s·α_{z_i,y_i}, α_{z,y} = 1[y=1](1[z=1] − 1[z=0]);
* ``fpr`` (Eq. 23–24): s·α̃_{z_i,y_i}, α̃_{z,y} = 1[y=0](1[z=1] − 1[z=0]);
* ``eo`` (Eq. 25): the ``eop`` factor plus the ``fpr`` factor, each with its own sign;
* ``cov`` (Eq. 29): β(z_i − z̄), β = ±1;

where s (and β) is the sign of the quantity inside the absolute value at θ_0 (+1 where the
paper assumes group 1 favoured; "reverse the sign" otherwise, after Eq. 17), +1 at exactly 0.

**Pairwise influence** (Lemma 3.3, Eq. 12, 17): removing example i's constraint term from a
gradient step of rate η (the counterfactual step of §3.1) changes the score of a target j by

    S(i, j) = λ (η/n) Θ(x_i, x_j; θ_0) a_i,     Θ(x_i, x_j; θ) = ∇_θf(x_i)·∇_θf(x_j) (Eq. 7),

the neural tangent kernel; the loss term adds (η/n) Θ ℓ'_i (Eq. 8, 11).

**Aggregated influence** (Eq. 35): S(i) = (1/n)Σ_j a_j S(i, j) = (λη/n²) a_i ∇f(x_i)·Σ_j a_j∇f(x_j),
the first-order change of φ̂ over the training set (the paper's sum index is a typo for j);
O(n·p) with the n×p Jacobian, no n×n kernel. The loss analogue (App. A, Eq. 38 aggregated
the same way; TracIn's first-order score) is S_ℓ(i) = (η/n²) ℓ'_i ∇f(x_i)·Σ_j ℓ'_j∇f(x_j).

**Pruning** (§6.1): with scores from the model trained on all data, "prune by fairness"
removes examples in ascending order of |S(i)|, "prune by accuracy" in descending order of
|S_ℓ(i)|, "random" at random; the kept examples are then trained on with the relaxed
constraint (Eq. 10; the paper uses γ = λ = 1).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fedvalue._checks import check_choice, check_integer, check_number
from fedvalue.scoring.fairness.objectives import JOINT_GAPS, joint_gap_of_scores
from fedvalue.scoring.influence_curvature import BinaryScoreModel, minimize

#: Pruning orders of [FAIRINFL] §6.1.
PRUNINGS = ("fairness", "accuracy", "random")


def _labels(y, z, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    y, z = np.asarray(y), np.asarray(z)
    if len(y) != n or len(z) != n or not np.isin(y, (0, 1)).all() or not np.isin(z, (0, 1)).all():
        raise ValueError(f"y, z: expected {n} labels and {n} groups, all 0/1; got {len(y)} and {len(z)}.")
    return torch.as_tensor(y.astype(np.int64)), torch.as_tensor(z.astype(np.int64))


def _sign(value: torch.Tensor) -> float:
    return -1.0 if float(value) < 0 else 1.0


def constraint_factors(scores, y, z, constraint: str = "dp") -> np.ndarray:
    """a_i = ∂φ̂(f, i)/∂f of every example at the scores f(x_i; θ_0) (module docstring)."""
    constraint = check_choice("constraint", constraint, JOINT_GAPS)
    f = torch.as_tensor(np.asarray(scores, dtype=np.float64))
    yy, zz = _labels(y, z, len(f))
    alpha = (zz == 1).double() - (zz == 0).double()
    if constraint == "cov":
        centred = zz.double() - zz.double().mean()
        return (_sign((centred * f).mean()) * centred).numpy()
    parts = {"dp": [alpha], "eop": [alpha * (yy == 1)], "fpr": [alpha * (yy == 0)],
             "eo": [alpha * (yy == 1), alpha * (yy == 0)]}[constraint]
    return sum(_sign((part * f).mean()) * part for part in parts).numpy()


def pairwise_constraint_influence(train_jacobian, target_jacobian, factors, *, lam: float,
                                  lr: float) -> np.ndarray:
    """S(i, j) = λ(η/n) Θ(x_i, x_j) a_i (Eq. 12), rows i = training examples, columns j =
    targets; n = the number of training rows."""
    j_train = torch.as_tensor(train_jacobian, dtype=torch.float64)
    j_target = torch.as_tensor(target_jacobian, dtype=torch.float64)
    a = torch.as_tensor(np.asarray(factors, dtype=np.float64))
    scale = check_number("lam", lam, low=0.0) * check_number("lr", lr, low=0.0, low_open=True) / len(j_train)
    return (scale * a[:, None] * (j_train @ j_target.T)).numpy()


def constraint_influence(jacobian, factors, *, lam: float = 1.0, lr: float = 1.0) -> np.ndarray:
    """S(i) = (λη/n²) a_i ∇f(x_i)·Σ_j a_j∇f(x_j) (Eq. 35), every training example, O(n·p)."""
    j = torch.as_tensor(jacobian, dtype=torch.float64)
    a = torch.as_tensor(np.asarray(factors, dtype=np.float64))
    if a.shape != (len(j),):
        raise ValueError(f"factors: expected one factor per Jacobian row ({len(j)}); got shape {tuple(a.shape)}.")
    scale = check_number("lam", lam, low=0.0) * check_number("lr", lr, low=0.0, low_open=True) / len(j) ** 2
    return (scale * a * (j @ (a @ j))).numpy()


def loss_influence(jacobian, loss_derivatives, *, lr: float = 1.0) -> np.ndarray:
    """S_ℓ(i) = (η/n²) ℓ'_i ∇f(x_i)·Σ_j ℓ'_j∇f(x_j) (App. A aggregated like Eq. 35)."""
    return constraint_influence(jacobian, loss_derivatives, lam=1.0, lr=lr)


def logistic_loss_derivatives(scores, y) -> np.ndarray:
    """ℓ'_i = ∂ℓ(f, y_i)/∂f at f(x_i) for the logistic loss: σ(f) − y."""
    f = np.asarray(scores, dtype=np.float64)
    return 1.0 / (1.0 + np.exp(-f)) - np.asarray(y, dtype=np.float64)


def kept_examples(order: str, keep: int, *, fairness_scores=None, loss_scores=None,
                  seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Sorted indices of the ``keep`` examples a pruning ``order`` of §6.1 keeps: ``fairness``
    removes ascending |S(i)| (keeps the largest), ``accuracy`` removes descending |S_ℓ(i)|
    (keeps the smallest), ``random`` keeps a uniform subset. Ties: the earlier example first."""
    order = check_choice("order", order, PRUNINGS)
    scores = fairness_scores if order == "fairness" else loss_scores
    if order == "random":
        if fairness_scores is None and loss_scores is None:
            raise ValueError("fairness_scores: expected the scores (or loss_scores) to know n; got None.")
        n = len(fairness_scores if fairness_scores is not None else loss_scores)
    elif scores is None:
        name = "fairness_scores" if order == "fairness" else "loss_scores"
        raise ValueError(f"{name}: expected the scores pruning by {order} ranks; got None.")
    else:
        n = len(scores)
    keep = check_integer("keep", keep, 1)
    if keep > n:
        raise ValueError(f"keep: expected at most the {n} examples; got {keep}.")
    if order == "random":
        return np.sort(np.random.default_rng(seed).choice(n, size=keep, replace=False))
    magnitude = np.abs(np.asarray(scores, dtype=np.float64))
    ranked = np.argsort(-magnitude if order == "fairness" else magnitude, kind="stable")
    return np.sort(ranked[:keep])


def regularized_objective(model: BinaryScoreModel, x, y, z, *, gamma: float,
                          constraint: str = "dp") -> Callable[[torch.Tensor], torch.Tensor]:
    """θ ↦ (1/n)Σ ℓ(f(x_i; θ), y_i) + γ φ̂(f) ([FAIRINFL] Eq. 10, φ̂ the relaxed constraint of
    §4.1–4.2 with its absolute value, :func:`fedvalue.scoring.fairness.objectives.joint_gap_of_scores`)."""
    gamma = check_number("gamma", gamma, low=0.0)
    xs = torch.as_tensor(np.asarray(x, dtype=np.float64))
    yy, zz = _labels(y, z, len(xs))

    def objective(theta: torch.Tensor) -> torch.Tensor:
        f = model.score(theta, xs)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(f, yy.double())
        return loss + gamma * joint_gap_of_scores(f, yy, zz, constraint) if gamma > 0 else loss

    return objective


def fit_regularized(model: BinaryScoreModel, x, y, z, *, gamma: float, constraint: str = "dp",
                    start: torch.Tensor | None = None, tol: float = 1e-9, max_iter: int = 2000) -> torch.Tensor:
    """The minimizer of :func:`regularized_objective` from ``start`` (default θ0), L-BFGS."""
    objective = regularized_objective(model, x, y, z, gamma=gamma, constraint=constraint)
    return minimize(objective, model.theta0 if start is None else start, tol=tol, max_iter=max_iter)
