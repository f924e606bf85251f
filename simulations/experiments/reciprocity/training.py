"""The healthcare models of [RECIP] §5.2 trained on one split, with TracIn and Marginal flows.

**Model and training** (§5.2, footnote 4; workshop §5.2). Logistic regression (breast
cancer) or linear regression on the squared error (diabetes) with an intercept, on features
standardized with the training split's mean and variance, trained by T full-batch
gradient-descent steps on the mean training loss, w ← w − (η/|Z|) Σ_{z∈Z} ∇ℓ_z(w). Per-example
losses, with x̃ = (x, 1):

    ℓ_z = −y log σ(x̃·w) − (1−y) log(1−σ(x̃·w)),   ∇ℓ_z = (σ(x̃·w) − y) x̃,
    ℓ_z = (x̃·w − y)²,                               ∇ℓ_z = 2(x̃·w − y) x̃         (``linear``),
    ℓ_z = ½(x̃·w − y)²,                              ∇ℓ_z = (x̃·w − y) x̃           (``linear-half``).

§5.2 says "squared error" without a factor; App. A writes the ½ on its matrix-factorization
loss. The ½ halves every gradient, so at the same η the model moves half as far per step and
both the flows and their signs over training change (``linear-half`` is the option).

**Initialization.** ``average-label`` (the default of the simulation): the workshop version
says "we initialize the model parameters in such a way that it predicts the average
training label (by setting the bias term to a constant and other parameters to zero)":
intercept ȳ (linear) or log(ȳ/(1−ȳ)) (logistic, so σ = ȳ), weights 0. ``zero``: w = 0.

**TracIn** (Eqs. 1, 2, 4). An individual is one example, in Z or in Z' (§5.2), so

    O_u = Σ_t (η/|Z|) ∇ℓ_u(w_t) · Σ_{z'∈Z'} ∇ℓ_{z'}(w_t)   (u ∈ Z),
    I_v = Σ_t (η/|Z|) Σ_{z∈Z} ∇ℓ_z(w_t) · ∇ℓ_v(w_t)       (v ∈ Z'),

computed by :func:`fedvalue.flows.round_flows.tracin_round_flows` (the O(n·p) form of §4) step by step,
with the cumulative flows kept every ``checkpoint_every`` steps (reciprocity along
training, workshop Fig. 6).

**Marginal** (Eq. 3). M_{Z∖{z}} is the whole training pipeline rerun without z: the
standardization statistics of Z∖{z}, its initialization, T steps on its mean loss. All |Z|
removal models and the full model are trained at once as one batch of weight vectors
(:func:`marginal_split`); ``tests/simulations/experiments/reciprocity/test_reciprocity.py`` checks the batch
against one-at-a-time retraining through :func:`fedvalue.flows.marginal.marginal_losses`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedvalue import tracin_round_flows

__all__ = ["SplitFlows", "fit_losses", "marginal_split", "tracin_split"]


def standardized(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(x − mean)/std with the statistics of ``rows`` (ddof 0; a constant column kept as is), plus
    an intercept column of ones."""
    mean, std = x[rows].mean(axis=0), x[rows].std(axis=0)
    return np.hstack([(x - mean) / np.where(std > 0, std, 1.0), np.ones((len(x), 1))])


def initial_weights(model: str, y_train: np.ndarray, num_columns: int, initialization: str) -> np.ndarray:
    """w_0: zeros, or zeros with the intercept set so the model predicts the mean training label."""
    w = np.zeros(num_columns)
    if initialization == "average-label":
        mean = float(np.mean(y_train))
        if model == "logistic":
            mean = min(max(mean, 1e-12), 1 - 1e-12)
            w[-1] = math.log(mean / (1.0 - mean))
        else:
            w[-1] = mean
    return w


def residual(model: str, scores: np.ndarray, y: np.ndarray) -> np.ndarray:
    """dℓ/d(x̃·w) per example: σ(x̃·w) − y (logistic), 2(x̃·w − y) (squared error) or x̃·w − y (half of it)."""
    if model == "logistic":
        return 0.5 * (1.0 + np.tanh(0.5 * scores)) - y  # σ, overflow-free
    return (scores - y) if model == "linear-half" else 2.0 * (scores - y)


def example_losses(model: str, scores: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ℓ per example (the losses the flows are reductions of)."""
    if model == "logistic":
        return np.logaddexp(0.0, scores) - y * scores
    return (0.5 if model == "linear-half" else 1.0) * (scores - y) ** 2


def quality(model: str, scores: np.ndarray, y: np.ndarray) -> float:
    """Inference accuracy (logistic) or RMSE (linear)."""
    if model == "logistic":
        return float(np.mean((scores > 0) == (y > 0.5)))
    return float(np.sqrt(np.mean((scores - y) ** 2)))


@dataclass(frozen=True)
class SplitFlows:
    """TracIn flows of one split: outflows of the training rows, inflows of the inference rows
    (in the order of ``train`` and ``infer``), and the same summed over the first
    ``checkpoints[k]`` steps."""

    outflow: np.ndarray
    inflow: np.ndarray
    checkpoints: np.ndarray
    cumulative_outflow: np.ndarray
    cumulative_inflow: np.ndarray
    first_order_gap: float
    quality: float


def tracin_split(model: str, x: np.ndarray, y: np.ndarray, train: np.ndarray, infer: np.ndarray, *, steps: int,
                 learning_rate: float, initialization: str = "average-label", checkpoint_every: int = 0) -> SplitFlows:
    """Train on ``train`` for ``steps`` GD steps and book TracIn flows (module docstring)."""
    design = standardized(x, train)
    a, b, ya, yb = design[train], design[infer], y[train], y[infer]
    w = initial_weights(model, ya, design.shape[1], initialization)
    step_size = learning_rate / len(train)  # η_t of Eq. 4 for GD on the mean loss
    # Running sums over individuals 0..m−1 (training rows) and m..m+k−1 (inference rows): a flow
    # book's per-client bookkeeping and frames would be paid every step for these fixed ids.
    outflow, inflow, total = np.zeros(len(train) + len(infer)), np.zeros(len(train) + len(infer)), 0.0
    loss_before = float(example_losses(model, b @ w, yb).sum())
    m = len(train)
    marks = set(range(checkpoint_every, steps + 1, checkpoint_every)) if checkpoint_every else set()
    marks.add(steps)
    checkpoints, cumulative_out, cumulative_in = [], [], []
    if steps == 0:
        checkpoints, cumulative_out, cumulative_in = [0], [np.zeros(m)], [np.zeros(len(infer))]
    for t in range(steps):
        train_gradients = residual(model, a @ w, ya)[:, None] * a
        flows = tracin_round_flows(train_gradients, residual(model, b @ w, yb)[:, None] * b, step_size=step_size)
        outflow += flows.outflow
        inflow += flows.inflow
        total += flows.total
        w = w - step_size * train_gradients.sum(axis=0)
        if t + 1 in marks:
            checkpoints.append(t + 1)
            cumulative_out.append(outflow[:m].copy())
            cumulative_in.append(inflow[m:].copy())
    actual = loss_before - float(example_losses(model, b @ w, yb).sum())
    gap = abs(total - actual) / abs(actual) if actual else math.nan
    return SplitFlows(outflow=cumulative_out[-1], inflow=cumulative_in[-1], checkpoints=np.array(checkpoints),
                      cumulative_outflow=np.array(cumulative_out), cumulative_inflow=np.array(cumulative_in),
                      first_order_gap=gap, quality=quality(model, b @ w, yb))


def fit_losses(model: str, x: np.ndarray, y: np.ndarray, kept: np.ndarray, infer: np.ndarray, *, steps: int,
               learning_rate: float, initialization: str = "average-label") -> np.ndarray:
    """ℓ on ``infer`` of the pipeline trained on the rows ``kept`` alone (one retraining)."""
    design = standardized(x, kept)
    a, ya = design[kept], y[kept]
    w = initial_weights(model, ya, design.shape[1], initialization)
    for _ in range(steps):
        w = w - (learning_rate / len(kept)) * (residual(model, a @ w, ya) @ a)
    return example_losses(model, design[infer] @ w, y[infer])


def marginal_split(model: str, x: np.ndarray, y: np.ndarray, train: np.ndarray, infer: np.ndarray, *, steps: int,
                   learning_rate: float, initialization: str = "average-label") -> tuple[np.ndarray, np.ndarray]:
    """ℓ(M_Z, z') and ℓ(M_{Z∖{z}}, z') for every z ∈ Z (rows, in ``train`` order), z' ∈ ``infer``.

    The |Z| + 1 pipelines differ only in which training row is left out: each standardizes
    with its own rows' statistics (sums minus the left-out row), starts from its own
    initialization and takes T steps on its own mean loss; they are trained together as a
    (|Z| + 1) × p batch of weights.
    """
    xa, ya = x[train], y[train]
    m = len(train)
    kept = ~np.eye(m + 1, m, dtype=bool)  # row k leaves out training row k; the last row keeps all
    counts = kept.sum(axis=1).astype(np.float64)
    sums, squares = kept @ xa, kept @ (xa * xa)
    means = sums / counts[:, None]
    std = np.sqrt(np.maximum(squares / counts[:, None] - means**2, 0.0))
    std = np.where(std > 0, std, 1.0)

    def design(rows: np.ndarray) -> np.ndarray:
        scaled = (rows[None, :, :] - means[:, None, :]) / std[:, None, :]
        return np.concatenate([scaled, np.ones((m + 1, len(rows), 1))], axis=2)

    a = design(xa)  # (|Z|+1) × |Z| × p: each model's view of the training rows
    weights = np.stack([initial_weights(model, ya[row], a.shape[2], initialization) for row in kept])
    mask = kept.astype(np.float64)
    step = learning_rate / counts
    for _ in range(steps):
        scores = np.einsum("kjp,kp->kj", a, weights)
        gradient = np.einsum("kjp,kj->kp", a, residual(model, scores, ya[None, :]) * mask)
        weights -= step[:, None] * gradient
    losses = example_losses(model, np.einsum("kjp,kp->kj", design(x[infer]), weights), y[infer][None, :])
    return losses[m], losses[:m]
