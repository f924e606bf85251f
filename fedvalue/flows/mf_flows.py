"""TracIn flows of matrix factorization, computed sparsely per individual ([RECIP] App. A).

**Model** ([RECIP] App. A). User u has an embedding p_u ∈ R^d, item i an embedding
q_i ∈ R^d, and the predicted rating is p_u · q_i. Training minimizes the regularized
squared error with the regularization redistributed over the training examples (App. A's
second display), so that every term of the objective belongs to one example:

    L_z = ½ [ (p_u·q_i − r_ui)² + (λ/|Z_u|) ‖p_u‖² + (λ/|Z_i|) ‖q_i‖² ],   z = (u, i) ∈ Z,

with Z_u = u's training ratings and Z_i = item i's; Σ_{z∈Z} L_z is the objective of App. A's
first display. Full-batch gradient descent w ← w − η Σ_{z∈Z} ∇L_z(w) ([RECIP] §5.1, footnote
3: every example visited at every step), so TracIn's step size (Eq. 4) is η per example. The
loss of an inference example z' = (v, j) ∈ Z' is the squared error ℓ_{z'} = ½ (p_v·q_j − r_vj)²
(the regularizer belongs to the training examples).

**Flows** (Eqs. 1, 2, 4). Step t credits TracIn(z, z') = η ∇L_z(w_t) · ∇ℓ_{z'}(w_t). A
gradient of z = (u, i) is non-zero only in p_u and q_i (2d-sparse, Remark A.2), so for
u ≠ v the dot product is non-zero only through a shared item: flows between individuals pass
through the item embeddings alone (Remark A.1). With e_z = p_u·q_i − r_ui, c_i = λ/|Z_i|,
G_j = Σ_{z∈Z on j} (e_z p_u + c_j q_j) (the training gradient of q_j) and
G'_i = Σ_{z'∈Z' on i} e_{z'} p_v (the inference gradient of q_i), and every (user, item)
pair rated at most once (so u's own inference examples never share an item with its
training examples):

    O_u(t)    = η Σ_{(u,i)∈Z_u} (e_ui p_u + c_i q_i) · G'_i
              = η [ p_u · Σ_{i∈Z_u} e_ui G'_i + Σ_{i∈Z_u} c_i q_i · G'_i ],
    I_v(t)    = η Σ_{(v,j)∈Z'_v} e_vj p_v · G_j = η p_v · Σ_{j∈Z'_v} e_vj G_j,
    self_u(t) = η (∇_{p_u} L_{Z_u}) · (∇_{p_u} ℓ_{Z'_u}),

and Σ_u O_u = Σ_v I_v, Σ_u (O_u + self_u) = η ∇L_Z · ∇ℓ_{Z'}: the first-order reduction of the
summed inference loss over the step (Remark 2.5; [RECIP] App. C.1, Fig. 5 measures the gap
to the actual reduction). Each step costs O((|Z| + |Z'|) d), the cost of the gradient step
itself (Remark A.2): sparse user × item products over the ratings, never the |Z| × |Z'|
pairs. ``tests/fedvalue/flows/test_mf_flows.py`` checks them against the pairwise sum
of full parameter gradients.

All arithmetic is float64. The products are small (|Z|·d flops), so a multithreaded BLAS
only adds its threads' spin-waits: training runs with one BLAS thread (``threadpoolctl``,
the caller's setting restored after), 4–5× less CPU per step than OpenBLAS's default on
the 2-core machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import sparse
from threadpoolctl import threadpool_limits

from fedvalue._checks import check_integer, check_non_negative, check_positive, check_seed

__all__ = ["MatrixFactorizationFlows", "MfTraining", "Ratings", "StepFlows", "mf_fit", "mf_flows", "mf_step_flows"]


@dataclass(frozen=True)
class MfTraining:
    """The training settings: embedding dimension d, regularization λ, learning rate η, steps T
    ([RECIP] §5.1, footnote 3: 16, 1, 2e-4, 1000) and the scale of the random start (entries
    N(0, init_scale²); the paper initializes randomly without giving a scale)."""

    dimension: int = 16
    regularization: float = 1.0
    learning_rate: float = 2e-4
    steps: int = 1000
    init_scale: float = 0.1

    def __post_init__(self) -> None:
        check_integer("dimension", self.dimension)
        check_non_negative("regularization", self.regularization)
        check_positive("learning_rate", self.learning_rate)
        check_integer("steps", self.steps, 0)
        check_non_negative("init_scale", self.init_scale)


@dataclass(frozen=True)
class Ratings:
    """Ratings (user index, item index, rating) of one side of a split, as int64/float64 arrays."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray

    @classmethod
    def of(cls, users: object, items: object, ratings: object, *, num_users: int, num_items: int,
           name: str = "ratings") -> Ratings:
        """Checked ratings: equal lengths, indices in range, finite ratings."""
        u, i = np.asarray(users), np.asarray(items)
        r = np.asarray(ratings, dtype=np.float64)
        for label, array, size in ((f"{name}.users", u, num_users), (f"{name}.items", i, num_items)):
            if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
                raise ValueError(f"{label}: expected a 1-D array of integer indices; got {array.dtype} of shape "
                                 f"{array.shape}.")
            if array.size and (array.min() < 0 or array.max() >= size):
                raise ValueError(f"{label}: expected indices in [0, {size}); got values in [{array.min()}, "
                                 f"{array.max()}].")
        if not (len(u) == len(i) == len(r)) or r.ndim != 1:
            raise ValueError(f"{name}: expected users, items and ratings of one length; got {len(u)}, {len(i)}, "
                             f"{r.shape}.")
        if not np.all(np.isfinite(r)):
            raise ValueError(f"{name}.ratings: expected finite numbers; got {r[~np.isfinite(r)][:3]!r}.")
        return cls(u.astype(np.int64), i.astype(np.int64), r)

    def __len__(self) -> int:
        return len(self.ratings)


@dataclass
class _Side:
    """One side's ratings sorted by (user, item) and their sparse user × item pattern.

    ``matrix.data`` is overwritten with per-rating values (a residual, or 1) to form the
    sums over a user's ratings (``matrix @ X``) and over an item's (``matrix.T @ X``) as
    sparse products, never the |Z| × |Z'| pairs. ``item_share`` is 1/|Z_i| (0 for an item
    without ratings on this side).
    """

    data: Ratings
    matrix: sparse.csr_matrix
    indicator: sparse.csr_matrix
    item_share: np.ndarray
    item_of_rating: sparse.csr_matrix
    user_of_rating: sparse.csr_matrix

    @classmethod
    def of(cls, data: Ratings, num_users: int, num_items: int) -> _Side:
        order = np.lexsort((data.items, data.users))
        data = Ratings(data.users[order], data.items[order], data.ratings[order])
        indptr = np.concatenate([[0], np.cumsum(np.bincount(data.users, minlength=num_users))])
        matrix = sparse.csr_matrix((np.ones(len(data)), data.items.copy(), indptr), shape=(num_users, num_items))
        counts = np.bincount(data.items, minlength=num_items).astype(np.float64)
        share = np.divide(1.0, counts, out=np.zeros(num_items), where=counts > 0)
        # Per-rating values summed into their item (items × ratings) and into their user (users × ratings).
        item_of_rating = sparse.csr_matrix((np.ones(len(data)), (data.items, np.arange(len(data)))),
                                           shape=(num_items, len(data)))
        user_of_rating = sparse.csr_matrix((np.ones(len(data)), np.arange(len(data)), indptr),
                                           shape=(num_users, len(data)))
        return cls(data, matrix, matrix.copy(), share, item_of_rating, user_of_rating)

    def with_values(self, values: np.ndarray) -> sparse.csr_matrix:
        self.matrix.data = values
        return self.matrix

    def residuals(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """e_z = p_u · q_i − r_z for every rating, in the side's order."""
        return np.einsum("nd,nd->n", users[self.data.users], items[self.data.items]) - self.data.ratings


def _check_pairs(train: Ratings, infer: Ratings, num_items: int) -> None:
    keys = np.concatenate([train.users, infer.users]) * num_items + np.concatenate([train.items, infer.items])
    if len(np.unique(keys)) != len(keys):
        raise ValueError("infer: expected every (user, item) pair rated at most once across training and inference "
                         "(the flows' algebra assumes it); got repeated pairs.")


@dataclass(frozen=True)
class StepFlows:
    """One gradient step's flows per user and the step's gradients ([RECIP] Eqs. 1, 2, 4).

    Attributes
    ----------
    inflow, outflow, self_influence
        I_u(t), O_u(t), self_u(t) per user (module docstring).
    user_gradient, item_gradient
        ∇_P Σ_{z∈Z} L_z and ∇_Q Σ_{z∈Z} L_z (the step is w − η ∇).
    total
        η ∇L_Z · ∇ℓ_{Z'}: Σ of every flow, self-influence included.
    inference_loss
        Σ_{z'∈Z'} ℓ_{z'} at the step's parameters.
    """

    inflow: np.ndarray
    outflow: np.ndarray
    self_influence: np.ndarray
    user_gradient: np.ndarray = field(repr=False)
    item_gradient: np.ndarray = field(repr=False)
    total: float
    inference_loss: float


def _step(users: np.ndarray, items: np.ndarray, train: _Side, infer: _Side, user_reg: np.ndarray,
          item_reg: np.ndarray, learning_rate: float) -> StepFlows:
    error = train.residuals(users, items)
    error_infer = infer.residuals(users, items)
    residual, residual_infer = train.with_values(error), infer.with_values(error_infer)
    # Gradients of Σ_z L_z: Σ_{z∈Z_u} λ/|Z_u| = λ for a user with training ratings (0 for one without).
    user_gradient = residual @ items + user_reg[:, None] * users
    item_gradient = residual.T @ users + item_reg[:, None] * items  # G_j
    user_gradient_infer = residual_infer @ items
    item_gradient_infer = residual_infer.T @ users  # G'_i
    inflow = np.einsum("ud,ud->u", users, residual_infer @ item_gradient)
    # O_u = η [p_u · Σ_{i∈Z_u} e_ui G'_i + Σ_{i∈Z_u} c_i q_i · G'_i], c_i = λ/|Z_i|.
    outflow = np.einsum("ud,ud->u", users, residual @ item_gradient_infer)
    reg_term = item_reg * train.item_share * np.einsum("id,id->i", items, item_gradient_infer)
    outflow += train.indicator @ reg_term
    self_influence = np.einsum("ud,ud->u", user_gradient, user_gradient_infer)
    total = float(np.vdot(user_gradient, user_gradient_infer) + np.vdot(item_gradient, item_gradient_infer))
    return StepFlows(
        inflow=learning_rate * inflow, outflow=learning_rate * outflow,
        self_influence=learning_rate * self_influence, user_gradient=user_gradient, item_gradient=item_gradient,
        total=learning_rate * total, inference_loss=0.5 * float(error_infer @ error_infer),
    )


def _federated_round(users: np.ndarray, items: np.ndarray, train: _Side, infer: _Side, user_reg: np.ndarray,
                     item_reg: np.ndarray, learning_rate: float, local_steps: int) -> tuple[StepFlows, np.ndarray]:
    """One round of federated matrix factorization per user (:func:`mf_flows` with ``local_steps``).

    Client u starts from its own p_u and the server's Q, takes ``local_steps`` full-batch GD
    steps on its share Σ_{z∈Z_u} L_z of App. A's loss (c_i = λ/|Z_i| from the global counts),
    keeps p_u and returns its item update s_u = Q_u^local − Q (non-zero on its rated items).
    The server adds the updates, Q ← Q + Σ_u s_u (FedAvg with weights n_u/N and each client's
    step scaled by N/n_u). Flows of the round ([RECIP] in FL, :mod:`fedvalue.flows.round_flows`):
    F(u→v) = −s_u · g_v with g_v = ∇_Q ℓ_{Z'_v} at the state the round started from, and
    self_u = −Δp_u · ∇_{p_u} ℓ_{Z'_u} for the private embedding. Client u's local copy of q_i
    lives at its rating (u, i), so every client's local steps are one vectorized pass.
    Returns the round's flows (gradients: the negated updates over η) and the new P.
    """
    t = train.data
    local_items = items[t.items].copy()  # client u's copy of q_i, one row per training rating (u, i)
    item_coefficient = (item_reg * train.item_share)[t.items][:, None]
    local_users = users.copy()
    for _ in range(local_steps):
        p = local_users[t.users]
        error = np.einsum("nd,nd->n", p, local_items) - t.ratings
        user_gradient = train.user_of_rating @ (error[:, None] * local_items) + user_reg[:, None] * local_users
        local_items -= learning_rate * (error[:, None] * p + item_coefficient * local_items)
        local_users -= learning_rate * user_gradient
    update = local_items - items[t.items]  # s_u, row by row of u's ratings
    server_step = train.item_of_rating @ update  # D = Σ_u s_u
    error_infer = infer.residuals(users, items)
    residual_infer = infer.with_values(error_infer)
    item_gradient_infer = residual_infer.T @ users  # G = Σ_v g_v
    user_gradient_infer = residual_infer @ items
    outflow = -(train.user_of_rating @ np.einsum("nd,nd->n", update, item_gradient_infer[t.items]))
    inflow = -np.einsum("ud,ud->u", users, residual_infer @ server_step)  # −D·g_v (g_u never overlaps s_u)
    self_influence = -np.einsum("ud,ud->u", local_users - users, user_gradient_infer)
    total = float(-np.vdot(server_step, item_gradient_infer) + self_influence.sum())
    flows = StepFlows(inflow=inflow, outflow=outflow, self_influence=self_influence,
                      user_gradient=(users - local_users) / learning_rate, item_gradient=-server_step / learning_rate,
                      total=total, inference_loss=0.5 * float(error_infer @ error_infer))
    return flows, local_users


def _regularizers(train: Ratings, num_users: int, num_items: int, regularization: float):
    """λ per user and per item with training ratings (Σ_{z∈Z_u} λ/|Z_u| = λ), 0 for the others."""
    has_user = np.bincount(train.users, minlength=num_users) > 0
    has_item = np.bincount(train.items, minlength=num_items) > 0
    return regularization * has_user.astype(np.float64), regularization * has_item.astype(np.float64)


def _embeddings(name: str, values: object, rows: int, dimension: int) -> np.ndarray:
    array = np.array(values, dtype=np.float64)  # a copy: training updates it in place
    if array.shape != (rows, dimension) or not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: expected a finite ({rows}, {dimension}) array; got shape {array.shape}.")
    return array


def mf_step_flows(users: object, items: object, train: Ratings, infer: Ratings, *, regularization: float = 1.0,
                  learning_rate: float = 2e-4) -> StepFlows:
    """The flows of one full-batch gradient step at embeddings ``users`` (U × d) and ``items`` (I × d).

    Parameters
    ----------
    users, items
        P and Q at the step's start.
    train, infer
        Training ratings Z and inference ratings Z' (:class:`Ratings`; each (user, item)
        pair at most once across both).
    regularization, learning_rate
        λ and η of the module docstring.
    """
    p = np.asarray(users, dtype=np.float64)
    q = np.asarray(items, dtype=np.float64)
    if p.ndim != 2 or q.ndim != 2 or p.shape[1] != q.shape[1]:
        raise ValueError(f"items: expected embeddings of one dimension d, (U, d) and (I, d); got {p.shape} and "
                         f"{q.shape}.")
    check_non_negative("regularization", regularization)
    check_positive("learning_rate", learning_rate)
    _check_pairs(train, infer, q.shape[0])
    user_reg, item_reg = _regularizers(train, p.shape[0], q.shape[0], regularization)
    return _step(p, q, _Side.of(train, p.shape[0], q.shape[0]), _Side.of(infer, p.shape[0], q.shape[0]),
                 user_reg, item_reg, learning_rate)


@dataclass(frozen=True)
class MatrixFactorizationFlows:
    """Flows of a whole training run ([RECIP] §5.1, App. A, App. C.1).

    Attributes
    ----------
    inflow, outflow, self_influence
        Per user, summed over the steps.
    predicted_reduction, actual_reduction
        Per step: Σ of the step's flows (self included) and the actual reduction of the
        summed inference loss L_{Z'}(w_t) − L_{Z'}(w_{t+1}) (App. C.1, Fig. 5).
    checkpoints
        Steps after which the cumulative flows were kept (ascending).
    cumulative_inflow, cumulative_outflow
        len(checkpoints) × users: the flows summed over the first ``checkpoints[k]`` steps
        (for reciprocity along training, Fig. 1c).
    user_embeddings, item_embeddings
        P and Q after training.
    train_rmse, inference_rmse
        Root mean squared error of the final model on Z and on Z'.
    """

    inflow: np.ndarray
    outflow: np.ndarray
    self_influence: np.ndarray
    predicted_reduction: np.ndarray = field(repr=False)
    actual_reduction: np.ndarray = field(repr=False)
    checkpoints: np.ndarray = field(repr=False)
    cumulative_inflow: np.ndarray = field(repr=False)
    cumulative_outflow: np.ndarray = field(repr=False)
    user_embeddings: np.ndarray = field(repr=False)
    item_embeddings: np.ndarray = field(repr=False)
    train_rmse: float
    inference_rmse: float

    def first_order_discrepancy(self) -> np.ndarray:
        """|predicted − actual| / |actual| per step (App. C.1; NaN where nothing changed)."""
        actual = self.actual_reduction
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(actual != 0, np.abs(self.predicted_reduction - actual) / np.abs(actual), np.nan)


def _initial(num_users: int, num_items: int, dimension: int, init_scale: float, seed) -> tuple[np.ndarray, np.ndarray]:
    """P and Q with entries N(0, init_scale²) from one Generator (users first)."""
    rng = check_seed(seed)
    return (rng.normal(0.0, init_scale, (num_users, dimension)), rng.normal(0.0, init_scale, (num_items, dimension)))


def _start(initial, num_users: int, num_items: int, training: MfTraining, seed):
    """Copies of ``initial`` (P, Q), or fresh embeddings drawn from ``seed``."""
    if initial is None:
        return _initial(num_users, num_items, training.dimension, training.init_scale, seed)
    if not isinstance(initial, (tuple, list)) or len(initial) != 2:
        raise ValueError(f"initial: expected a pair (user embeddings, item embeddings); got {type(initial).__name__}.")
    return (_embeddings("initial", initial[0], num_users, training.dimension),
            _embeddings("initial", initial[1], num_items, training.dimension))


def _check_training(num_users: int, num_items: int, training: object) -> None:
    check_integer("num_users", num_users)
    check_integer("num_items", num_items)
    if not isinstance(training, MfTraining):
        raise TypeError(f"training: expected an MfTraining; got {type(training).__name__}.")


def _rmse(users: np.ndarray, items: np.ndarray, data: Ratings) -> float:
    if len(data) == 0:
        return float("nan")
    error = np.einsum("nd,nd->n", users[data.users], items[data.items]) - data.ratings
    return float(np.sqrt(np.mean(error * error)))


def mf_flows(
    train: Ratings,
    infer: Ratings,
    *,
    num_users: int,
    num_items: int,
    training: MfTraining = MfTraining(),
    seed: int | np.random.Generator | None = None,
    checkpoint_every: int = 0,
    initial: tuple[np.ndarray, np.ndarray] | None = None,
    local_steps: int = 0,
) -> MatrixFactorizationFlows:
    """Train matrix factorization by full-batch GD and book every step's TracIn flows (module docstring).

    Parameters
    ----------
    train, infer
        Z and Z' (:class:`Ratings`), each (user, item) pair at most once across both.
    num_users, num_items
        Sizes of the index spaces (users without ratings get zero flows).
    training
        d, λ, η, T and the start's scale (:class:`MfTraining`).
    seed
        Seed of the random start.
    checkpoint_every
        Keep the cumulative flows after every this many steps (and after the last); 0: only
        at the end.
    initial
        The starting (P, Q) instead of drawing them from ``seed``.
    local_steps
        0: centralized full-batch GD ([RECIP] §5.1). E ≥ 1: federated per user, ``steps``
        rounds in which every user is a client that keeps its embedding p_u to itself, takes
        E local GD steps on its own ratings and sends its item-embedding update; the server
        adds the updates (:func:`_federated_round`). With E = 1 the rounds are the centralized
        steps and the flows equal the centralized ones (tested); E > 1 is local training.
    """
    _check_training(num_users, num_items, training)
    check_integer("checkpoint_every", checkpoint_every, 0)
    check_integer("local_steps", local_steps, 0)
    _check_pairs(train, infer, num_items)
    users, items = _start(initial, num_users, num_items, training, seed)
    user_reg, item_reg = _regularizers(train, num_users, num_items, training.regularization)
    learning_rate, steps = training.learning_rate, training.steps
    train_side, infer_side = _Side.of(train, num_users, num_items), _Side.of(infer, num_users, num_items)
    inflow, outflow, self_total = np.zeros(num_users), np.zeros(num_users), np.zeros(num_users)
    predicted, losses = np.zeros(steps), np.zeros(steps + 1)
    marks = set(range(checkpoint_every, steps + 1, checkpoint_every)) if checkpoint_every else set()
    marks.add(steps)
    checkpoints, cumulative_in, cumulative_out = [], [], []
    with threadpool_limits(1, user_api="blas"):
        for t in range(steps):
            if local_steps:
                flows, users = _federated_round(users, items, train_side, infer_side, user_reg, item_reg,
                                                learning_rate, local_steps)
            else:
                flows = _step(users, items, train_side, infer_side, user_reg, item_reg, learning_rate)
                users -= learning_rate * flows.user_gradient
            inflow += flows.inflow
            outflow += flows.outflow
            self_total += flows.self_influence
            predicted[t] = flows.total
            losses[t] = flows.inference_loss
            items -= learning_rate * flows.item_gradient
            if t + 1 in marks:
                checkpoints.append(t + 1)
                cumulative_in.append(inflow.copy())
                cumulative_out.append(outflow.copy())
    final = users[infer.users], items[infer.items]
    error = np.einsum("nd,nd->n", *final) - infer.ratings
    losses[steps] = 0.5 * float(error @ error)
    if steps == 0:
        checkpoints, cumulative_in, cumulative_out = [0], [inflow.copy()], [outflow.copy()]
    return MatrixFactorizationFlows(
        inflow=inflow, outflow=outflow, self_influence=self_total, predicted_reduction=predicted,
        actual_reduction=losses[:-1] - losses[1:], checkpoints=np.array(checkpoints, dtype=np.int64),
        cumulative_inflow=np.array(cumulative_in), cumulative_outflow=np.array(cumulative_out),
        user_embeddings=users, item_embeddings=items, train_rmse=_rmse(users, items, train),
        inference_rmse=_rmse(users, items, infer),
    )


def mf_fit(
    train: Ratings,
    *,
    num_users: int,
    num_items: int,
    training: MfTraining = MfTraining(),
    seed: int | np.random.Generator | None = None,
    initial: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """P and Q after ``steps`` full-batch GD steps on Σ_{z∈Z} L_z, without flows (for retraining).

    ``initial`` gives the starting (P, Q) instead of drawing them from ``seed`` (Marginal
    influence retrains from the same start, so that removal alone differs).
    """
    _check_training(num_users, num_items, training)
    users, items = _start(initial, num_users, num_items, training, seed)
    user_reg, item_reg = _regularizers(train, num_users, num_items, training.regularization)
    side = _Side.of(train, num_users, num_items)
    learning_rate = training.learning_rate
    with threadpool_limits(1, user_api="blas"):
        for _ in range(training.steps):
            residual = side.with_values(side.residuals(users, items))
            user_gradient = residual @ items + user_reg[:, None] * users
            item_gradient = residual.T @ users + item_reg[:, None] * items
            users -= learning_rate * user_gradient
            items -= learning_rate * item_gradient
    return users, items
