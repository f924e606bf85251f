"""TracIn inflows and outflows between clients, in O(n·p) per round ([RECIP], Eqs. 1–6, §4).

[RECIP] measures the influence of a training
example z on an inference example z' with TracIn (Eq. 4),

    TracIn(z, z') = Σ_{t : z ∈ B_t} η_t ∇ℓ_z(w_t) · ∇ℓ_{z'}(w_t),

the first-order reduction of z'’s loss caused by z's share −η_t ∇ℓ_z(w_t) of step t
(Remark 2.5), and sums it over individuals: inflow I_v (others' training data on v's
inference data, Eq. 1), outflow O_u (u's training data on others' inference data, Eq. 2)
and self-influence (u on u, §2.2).

**Federated form** (this project's reading of [RECIP] for FL). In round t client u's share of the server step is
its aggregation-weighted update s_u = p_u Δ_u (FedAvg: p_u = n_u / Σ n, Δ_u = w_u − A_{t−1};
s_u = 0 for a client that did not train), and g_v = Σ_{z'∈Z'_v} ∇ℓ_{z'}(A_{t−1}) is the
summed inference-loss gradient of client v at the round's starting state — for every
client, trained or not (a client not sampled still receives inflow). The flow is

    F_t(u→v) = −s_u · g_v,

    inflow_v  = Σ_t Σ_{u≠v} F_t(u→v),   outflow_u = Σ_t Σ_{v≠u} F_t(u→v),
    self_u    = Σ_t F_t(u→u).

**O(n·p) computation** ([RECIP] §4, Eqs. 5–6). With G = Σ_v g_v and D = Σ_u s_u,

    outflow_u = −s_u · (G − g_u),   inflow_v = −(D − s_v) · g_v,   self_u = −s_u · g_u,

so a round costs O(n·p) and the n×n flow matrix is never formed (:func:`flow_matrix`
builds it, for small cases and tests only). Σ_v inflow_v = Σ_u outflow_u = −D·G − Σ_u self_u,
and −(inflow_v + self_v) = D · g_v is the first-order change of v's inference loss over the
round (Remark 2.5).

**Centralized TracIn is the same code.** One SGD step w_{t+1} = w_t − η_t Σ_{z∈B_t} ∇ℓ_z(w_t)
gives individual u the step s_u = −η_t Σ_{z∈B_t∩Z_u} ∇ℓ_z(w_t); then −s_u · g_v =
Σ_{z∈Z_u∩B_t} Σ_{z'∈Z'_v} η_t ∇ℓ_z·∇ℓ_{z'}, the paper's Eq. 4 summed as in Eqs. 1–2.
:func:`tracin_round_flows` builds these steps from per-example gradients (full-batch gradient
descent on the mean loss: η_t = η / |B_t|) and calls the same core, :func:`flows_from_arrays`.
With one full-batch GD step per round and every client every round (FedSGD,
p_u = n_u / N) the federated flows equal the centralized ones.

**Random projection** (optional, for large p): :class:`fedvalue.scoring.projection.RandomProjection`
applies the same seeded R to updates and gradients.

All arithmetic is float64.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedvalue._checks import check_finite_array, check_number, check_positive
from fedvalue.scoring.projection import RandomProjection, Vector, _project, flatten

__all__ = [
    "RoundFlows",
    "fedavg_round_flows",
    "flow_matrix",
    "flows_from_arrays",
    "round_flows",
    "tracin_round_flows",
]

#: Entries of a temporary block (rows × p) the core keeps at once (32 MiB of float64).
_BLOCK_ENTRIES = 1 << 22
#: flow_matrix refuses more clients than this (it is O(n²·p), for tests and small cases).
MAX_FLOW_MATRIX_CLIENTS = 2000



# --------------------------------------------------------------------------- inputs


def _matrix(name: str, values: object) -> np.ndarray:
    return check_finite_array(name, values, 2, "2-D array (rows x parameters)")


# --------------------------------------------------------------------------- core


def flows_from_arrays(
    updates: np.ndarray,
    gradients: np.ndarray,
    trained: np.ndarray | Sequence[int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inflow, outflow and self-influence of one round in O(n·p) ([RECIP] §4, Eqs. 5–6).

    With s_u the step share of trained unit u and g_v the inference gradient of unit v,
    G = Σ_v g_v, D = Σ_u s_u:

        outflow_u = −s_u·(G − g_u),  inflow_v = −(D − s_v)·g_v,  self_u = −s_u·g_u,

    computed as −s_u·G − self_u and −D·g_v − self_v (s_v = 0 for an untrained unit).

    Parameters
    ----------
    updates
        m × p: row i is s_{trained[i]} = p_u Δ_u (or −η Σ ∇ℓ_z for centralized TracIn).
    gradients
        n × p: row v is g_v (zeros for a unit without inference data).
    trained
        m distinct row indices into ``gradients``: which unit made each update.

    Returns
    -------
    inflow, outflow, self_influence
        Three float64 vectors of length n (outflow and self are 0 for untrained units).

    Raises
    ------
    ValueError
        Shapes that do not match, non-finite entries, bad or repeated ``trained`` indices.
    """
    s = _matrix("updates", updates)
    g = _matrix("gradients", gradients)
    n, p = g.shape
    if s.shape[1] != p:
        raise ValueError(f"updates: expected {p} columns, like gradients; got {s.shape[1]}.")
    idx = np.asarray(trained)
    if idx.ndim != 1 or len(idx) != len(s) or (len(idx) and not np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(f"trained: expected {len(s)} integer row indices, one per update; got {idx!r}.")
    idx = idx.astype(np.intp, copy=False)
    if len(idx) and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"trained: expected indices in [0, {n}); got values in [{idx.min()}, {idx.max()}].")
    if len(np.unique(idx)) != len(idx):
        raise ValueError("trained: expected distinct indices (one update per unit); got repeats.")
    return _flows_unchecked(s, g, idx)


def _flows_unchecked(s: np.ndarray, g: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, p = g.shape
    big_g = g.sum(axis=0)
    big_d = s.sum(axis=0)
    self_t = np.empty(len(idx))
    rows = max(1, _BLOCK_ENTRIES // max(p, 1))
    for lo in range(0, len(idx), rows):  # −s_u·g_u without a full m×p copy of g[idx]
        hi = lo + rows
        self_t[lo:hi] = -np.einsum("ij,ij->i", s[lo:hi], g[idx[lo:hi]])
    inflow = -(g @ big_d)
    inflow[idx] -= self_t
    outflow = np.zeros(n)
    outflow[idx] = -(s @ big_g) - self_t
    self_influence = np.zeros(n)
    self_influence[idx] = self_t
    return inflow, outflow, self_influence


@dataclass(frozen=True, eq=False)
class RoundFlows:
    """TracIn flows of one round (or one SGD step), per client.

    Attributes
    ----------
    clients
        Client labels, in the order of the arrays.
    inflow, outflow, self_influence
        Σ_{u≠v} F(u→v), Σ_{v≠u} F(u→v) and F(u→u) per client (float64).
    trained
        Whether the client contributed a step this round (False: outflow = self = 0).
    total
        Σ_u Σ_v F(u→v) = −D·G, self-influence included: the first-order reduction of the
        summed inference loss over the round ([RECIP], Remark 2.5).
    """

    clients: tuple[Hashable, ...]
    inflow: np.ndarray
    outflow: np.ndarray
    self_influence: np.ndarray
    trained: np.ndarray
    total: float

    @property
    def balance_gap(self) -> float:
        """Σ inflow − Σ outflow: zero up to rounding (every cross flow is one's in, another's out)."""
        return float(self.inflow.sum() - self.outflow.sum())

    def predicted_loss_change(self) -> pd.Series:
        """−(inflow_v + self_v) = D·g_v: first-order change of v's inference loss (Remark 2.5)."""
        return pd.Series(-(self.inflow + self.self_influence), index=self._index(), name="predicted_loss_change")

    def _index(self) -> pd.Index:
        return pd.Index(list(self.clients), name="client", tupleize_cols=False)

    def to_frame(self) -> pd.DataFrame:
        """Columns ``inflow``, ``outflow``, ``self``, ``trained``; index ``client``."""
        return pd.DataFrame(
            {"inflow": self.inflow, "outflow": self.outflow, "self": self.self_influence, "trained": self.trained},
            index=self._index(),
        )


def _unique_clients(name: str, clients: Iterable[Hashable]) -> tuple[Hashable, ...]:
    ordered = tuple(clients)
    if len(set(ordered)) != len(ordered):
        raise ValueError(f"{name}: expected distinct client labels; got repeats in {list(ordered)}.")
    return ordered


def _common_keys(gradients: Mapping[Hashable, Vector], keys: Sequence[str] | None) -> Sequence[str] | None:
    """One key order for every dict vector of a round (default: the first dict gradient's
    sorted keys), so an update whose keys differ from the gradients' is refused, not paired
    with the wrong tensors."""
    if keys is not None:
        return keys
    first = next((v for v in gradients.values() if isinstance(v, Mapping)), None)
    return None if first is None else sorted(first)


def _stack(vectors: Mapping[Hashable, Vector], name: str, keys: Sequence[str] | None, size: int | None) -> list[np.ndarray]:
    flat = []
    for client, vector in vectors.items():
        if keys is None and isinstance(vector, Mapping):
            keys = sorted(vector)
        v = flatten(vector, keys=keys, name=f"{name}[{client!r}]")
        if size is None:
            size = len(v)
        elif len(v) != size:
            raise ValueError(f"{name}[{client!r}]: expected a vector of length {size}, like the others; got {len(v)}.")
        flat.append(v)
    return flat


def fedavg_round_flows(
    start_arrays: Mapping[str, np.ndarray],
    replies: Mapping[Hashable, Mapping[str, np.ndarray]],
    weights: Mapping[Hashable, float],
    gradients: Mapping[Hashable, Vector],
) -> tuple[RoundFlows, frozenset]:
    """TracIn flows of a FedAvg step made by ``replies``, from the round's arrays.

    s_u = p_u Δ_u with p_u = n_u / Σ_{j∈replies} n_j (``weights``) and Δ_u = w_u − A_{t−1};
    g_v is the inference gradient at A_{t−1} of every client in ``gradients``. A client in
    ``replies`` without a gradient still has its outflow (it needs only the others'
    gradients); its inflow is unknown, so it is returned among the second element, the
    clients whose gradient was missing (computed with g_v = 0).
    """
    keys = list(start_arrays)
    start = flatten(start_arrays, keys=keys, name="start arrays")
    total = float(sum(weights[c] for c in replies))
    updates = {c: flatten(arrays, keys=keys, name=f"arrays of client {c}") - start for c, arrays in replies.items()}
    grads = dict(gradients)
    missing = frozenset(c for c in updates if c not in grads)
    for client in missing:
        grads[client] = np.zeros_like(start)
    return round_flows(updates, grads, weights={c: weights[c] / total for c in replies}, keys=keys), missing


def round_flows(
    updates: Mapping[Hashable, Vector],
    gradients: Mapping[Hashable, Vector],
    *,
    weights: Mapping[Hashable, float] | None = None,
    keys: Sequence[str] | None = None,
    projection: RandomProjection | None = None,
) -> RoundFlows:
    """TracIn flows of one federated round, F_t(u→v) = −(p_u Δ_u)·g_v ([RECIP] §4).

    Parameters
    ----------
    updates
        Client -> its aggregation-weighted update p_u Δ_u (or Δ_u when ``weights`` is
        given), for the clients whose updates make the round's step. An array of any
        shape (raveled) or a dict name -> array (flattened in the order ``keys``).
    gradients
        Client -> g_v = Σ_{z'∈Z'_v} ∇ℓ_{z'}(A_{t−1}), the summed inference-loss gradient at
        the round's starting state, for EVERY client that receives inflow (trained or
        not). Every client in ``updates`` must be here (pass zeros for one without
        inference data). Its order is the order of the result.
    weights
        Optional client -> p_u for exactly the clients of ``updates``; the update used is
        weights[u] · updates[u], as given (not normalized: pass n_u / Σ n for FedAvg).
    keys
        Key order for dict vectors (default: sorted keys of the first dict).
    projection
        Optional :class:`RandomProjection` applied to all vectors (the same R).

    Returns
    -------
    RoundFlows

    Raises
    ------
    ValueError
        A client in ``updates`` or ``weights`` that is not in ``gradients`` (resp.
        ``updates``), vectors of different lengths or keys, non-finite values.
    """
    if not isinstance(updates, Mapping):
        raise TypeError(f"updates: expected a mapping client -> update vector; got {type(updates).__name__}.")
    if not isinstance(gradients, Mapping) or not gradients:
        raise ValueError(f"gradients: expected a non-empty mapping client -> gradient vector; got {gradients!r:.80}.")
    clients = tuple(gradients)
    position = {c: i for i, c in enumerate(clients)}
    unknown = [c for c in updates if c not in position]
    if unknown:
        raise ValueError(
            f"updates: unknown client(s) {unknown}: every client that trained needs its inference "
            f"gradient in gradients (zeros if it has no inference data); gradients has {list(clients)}."
        )
    if weights is not None:
        if not isinstance(weights, Mapping):
            raise TypeError(f"weights: expected a mapping client -> p_u or None; got {type(weights).__name__}.")
        extra = [c for c in weights if c not in updates]
        missing = [c for c in updates if c not in weights]
        if extra or missing:
            raise ValueError(
                f"weights: expected one weight per client of updates; unknown client(s) {extra}, missing {missing}."
            )
        for c, w in weights.items():
            check_number(f"weights[{c!r}]", w)
    keys = _common_keys(gradients, keys)
    g_rows = _stack(gradients, "gradients", keys, None)
    p = len(g_rows[0])
    s_rows = _stack(updates, "updates", keys, p)
    if weights is not None:
        s_rows = [float(weights[c]) * v for c, v in zip(updates, s_rows)]
    if projection is not None:
        if not isinstance(projection, RandomProjection):
            raise TypeError(f"projection: expected a RandomProjection or None; got {type(projection).__name__}.")
        if projection.dim != p:
            raise ValueError(f"projection: expected a projection of dim {p} (the vectors' length); got {projection.dim}.")
        both = projection.project_many(g_rows + s_rows)
        g, s = both[: len(g_rows)], both[len(g_rows):]
    else:
        g = np.stack(g_rows)
        s = np.stack(s_rows) if s_rows else np.zeros((0, p))
    idx = np.array([position[c] for c in updates], dtype=np.intp)
    return _round(clients, s, g, idx)


def _round(clients: tuple, s: np.ndarray, g: np.ndarray, idx: np.ndarray) -> RoundFlows:
    inflow, outflow, self_influence = _flows_unchecked(s, g, idx)
    trained = np.zeros(len(clients), dtype=bool)
    trained[idx] = True
    total = -float(s.sum(axis=0) @ g.sum(axis=0))
    return RoundFlows(clients, inflow, outflow, self_influence, trained, total)


def _owners(name: str, owners: object, count: int) -> np.ndarray:
    """``owners`` as a 1-D array of ``count`` labels (object dtype unless numeric)."""
    if isinstance(owners, np.ndarray) and owners.ndim == 1 and owners.dtype != object:
        values = owners
    else:
        listed = list(owners)  # type: ignore[call-overload]
        values = np.empty(len(listed), dtype=object)
        values[:] = listed
    if len(values) != count:
        raise ValueError(f"{name}: expected {count} owners, one per row; got {len(values)}.")
    return values


def tracin_round_flows(
    train_gradients: np.ndarray,
    inference_gradients: np.ndarray,
    *,
    step_size: float,
    train_owners: Sequence[Hashable] | np.ndarray | None = None,
    inference_owners: Sequence[Hashable] | np.ndarray | None = None,
    projection: RandomProjection | None = None,
) -> RoundFlows:
    """Centralized TracIn flows of one SGD step from per-example gradients ([RECIP], Eq. 4).

    The step is w_{t+1} = w_t − η_t Σ_{z∈B_t} ∇ℓ_z(w_t) with η_t = ``step_size`` (full-batch
    gradient descent on the MEAN loss with learning rate η: η_t = η / |B_t|). Individual
    u's share is s_u = −η_t Σ_{z∈B_t∩Z_u} ∇ℓ_z and g_v = Σ_{z'∈Z'_v} ∇ℓ_{z'}, so

        F_t(u→v) = −s_u·g_v = Σ_{z∈Z_u∩B_t} Σ_{z'∈Z'_v} η_t ∇ℓ_z·∇ℓ_{z'},

    Eq. 4 summed as in Eqs. 1–2 — computed by the same O(n·p) core as :func:`round_flows`.

    Parameters
    ----------
    train_gradients
        |B_t| × p: ∇ℓ_z(w_t) for each example of the batch.
    inference_gradients
        |Z'| × p: ∇ℓ_{z'}(w_t) for each inference example.
    step_size
        η_t > 0.
    train_owners, inference_owners
        The individual owning each row (any hashable labels; an individual may own rows
        in both). Default: every row its own individual, labelled 0..|B_t|−1 for training
        rows and |B_t|..|B_t|+|Z'|−1 for inference rows.
    projection
        Optional :class:`RandomProjection` of dim p (applied to the per-individual sums,
        which equals projecting every example: R is linear).

    Returns
    -------
    RoundFlows
        Individuals in order of first appearance (training owners first); ``trained``
        marks those with training rows; individuals without inference rows have g = 0.

    Raises
    ------
    ValueError
        Non-2-D, non-finite or mismatched gradients, ``step_size`` not > 0, owner lists of
        the wrong length.
    """
    check_positive("step_size", step_size)
    x = _matrix("train_gradients", train_gradients)
    y = _matrix("inference_gradients", inference_gradients)
    if x.shape[1] != y.shape[1]:
        raise ValueError(
            f"inference_gradients: expected {x.shape[1]} columns, like train_gradients; got {y.shape[1]}."
        )
    clients, s, g, idx = _shares_by_owner(x, y, float(step_size), train_owners, inference_owners)
    if projection is not None:
        s = _project(projection, s, "train_gradients")
        g = _project(projection, g, "inference_gradients")
    return _round(clients, s, g, idx)



def _shares_by_owner(x: np.ndarray, y: np.ndarray, step_size: float, train_owners, inference_owners):
    """(individuals, their step shares s_u = −η_t Σ ∇ℓ_z, their inference sums g_v, the rows of
    s among the individuals) from per-example gradients and their owners."""
    m, k = len(x), len(y)
    if train_owners is None and inference_owners is None:  # every row its own individual
        clients: tuple = tuple(range(m + k))
        s = -step_size * x
        g = np.zeros((m + k, x.shape[1]))
        g[m:] = y
        idx = np.arange(m)
    else:
        a = np.arange(m) if train_owners is None else _owners("train_owners", train_owners, m)
        b = np.arange(m, m + k) if inference_owners is None else _owners("inference_owners", inference_owners, k)
        both = np.concatenate([a, b]) if a.dtype == b.dtype else np.concatenate([a.astype(object), b.astype(object)])
        codes, uniques = pd.factorize(both)
        clients = tuple(uniques.tolist())
        ca, cb = codes[:m], codes[m:]
        n_train = int(ca.max()) + 1 if m else 0  # factorize numbers first appearances 0, 1, ...
        s = np.zeros((n_train, x.shape[1]))
        if n_train == m:
            s[ca] = x
        else:
            np.add.at(s, ca, x)
        s *= -step_size
        g = np.zeros((len(clients), x.shape[1]))
        if len(np.unique(cb)) == k:
            g[cb] = y
        else:
            np.add.at(g, cb, y)
        idx = np.arange(n_train)
    return clients, s, g, idx


def flow_matrix(
    updates: Mapping[Hashable, Vector],
    gradients: Mapping[Hashable, Vector],
    *,
    weights: Mapping[Hashable, float] | None = None,
    keys: Sequence[str] | None = None,
) -> pd.DataFrame:
    """The full n×n matrix F(u→v) = −s_u·g_v of one round — small cases and tests only.

    O(n²·p) time and O(n²) memory; rows are sources u (all clients of ``gradients``,
    zero rows for those that did not train), columns are targets v. Row sums minus the
    diagonal are outflows, column sums minus the diagonal inflows.

    Raises
    ------
    ValueError
        More than ``MAX_FLOW_MATRIX_CLIENTS`` clients, or any input error of
        :func:`round_flows`.
    """
    if isinstance(gradients, Mapping) and len(gradients) > MAX_FLOW_MATRIX_CLIENTS:
        raise ValueError(
            f"gradients: flow_matrix is for at most {MAX_FLOW_MATRIX_CLIENTS} clients; got {len(gradients)} "
            "(use round_flows, which never forms the matrix)."
        )
    flows = round_flows(updates, gradients, weights=weights, keys=keys)  # validates inputs
    clients = flows.clients
    g = np.stack(_stack(gradients, "gradients", _common_keys(gradients, keys), None))
    s = np.zeros_like(g)
    rows = _stack(updates, "updates", _common_keys(gradients, keys), g.shape[1])
    for c, v in zip(updates, rows):
        s[clients.index(c)] = v * (float(weights[c]) if weights is not None else 1.0)
    index = pd.Index(list(clients), tupleize_cols=False)
    return pd.DataFrame(-(s @ g.T), index=index.rename("source"), columns=index.rename("target"))
