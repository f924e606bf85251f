"""The K-nearest-neighbour utility and the neighbour order it is built on ([ADS] Def. 5.2).

For a test point (x, y) and a set S of training instances, with α_1(S), α_2(S), ... the
instances of S from nearest to farthest,

    v_x(S) = (1/K) Σ_{j=1}^{min(K, |S|)} 1[y_{α_j(S)} = y],      v_x(∅) = 0,

and v(S) = (1/n_test) Σ_x v_x(S): the KNN classifier's likelihood of the correct label,
averaged over the test points. The normalization is 1/K for every S, as in [KNNSV] and as
[ADS] Thm 5.1 and its base case (App. B.6, case ii: an instance joining fewer than K
neighbours adds 1[y_q = y]/K) require; Def. 5.2 writes 1/min(K, |S|), under which the
recursion of Thm 5.1 is not exact for coalitions smaller than K.

**Order.** Distance is Euclidean; instances are ranked by the computed key
‖x_i‖² − 2⟨x_i, x⟩ (the test point's own norm is dropped: it does not change the order),
ties broken by training index (a stable sort), so the order is a fixed total order.
Exact duplicate training rows are given one key, so they tie exactly whatever the
floating-point rounding of the matrix product. Every KNN estimator in fedvalue
(:mod:`fedvalue.valuation.knn.exact`, :mod:`fedvalue.valuation.knn.monte_carlo`) and :class:`KnnUtility` use this order,
so brute force over :class:`KnnUtility` and the closed forms answer the same game.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

import numpy as np

from fedvalue._checks import check_finite_array, check_integer

#: Test points per chunk when none is given: a chunk's arrays are chunk × n_train.
DEFAULT_CHUNK_SIZE = 128


def check_knn_data(
    x_train: object, y_train: object, x_test: object, y_test: object, k: object
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Validated float64 features, int64 labels and K; errors name the parameter."""
    x_train = check_finite_array("x_train", x_train, 2, "2-D array (n_train × n_features)")
    x_test = check_finite_array("x_test", x_test, 2, "2-D array (n_test × n_features)")
    if x_train.shape[0] == 0:
        raise ValueError("x_train: expected at least one training instance; got 0 rows.")
    if x_test.shape[0] == 0:
        raise ValueError("x_test: expected at least one test point; got 0 rows.")
    if x_test.shape[1] != x_train.shape[1]:
        raise ValueError(f"x_test: expected {x_train.shape[1]} features like x_train; got {x_test.shape[1]}.")
    labels = []
    for name, y, rows in (("y_train", y_train, x_train.shape[0]), ("y_test", y_test, x_test.shape[0])):
        array = np.asarray(y)
        if array.ndim != 1 or array.shape[0] != rows:
            raise ValueError(f"{name}: expected a 1-D array of {rows} labels (one per row); got shape {array.shape}.")
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"{name}: expected integer class labels; got dtype {array.dtype}.")
        labels.append(array.astype(np.int64))
    return x_train, labels[0], x_test, labels[1], check_integer("k", k, unit="number of neighbours")


def check_chunk_size(chunk_size: object) -> int:
    return check_integer("chunk_size", chunk_size, unit="number of test points")


def _train_keys(x_train: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """‖x_i‖² per row and, when rows repeat, the index of each row's first copy.

    Rows are matched by a 128-bit digest of their bytes, confirmed by comparing the rows
    (a digest collision between different rows leaves them distinct); memory O(n).
    """
    norms = np.einsum("ij,ij->i", x_train, x_train)
    rows = np.ascontiguousarray(x_train)
    first_seen: dict[bytes, int] = {}
    first_copy = np.arange(rows.shape[0])
    for i in range(rows.shape[0]):
        j = first_seen.setdefault(hashlib.blake2b(rows[i].tobytes(), digest_size=16).digest(), i)
        if j != i and np.array_equal(rows[i], rows[j]):
            first_copy[i] = j
    if np.all(first_copy == np.arange(rows.shape[0])):
        return norms, None
    return norms, first_copy


def neighbour_orders(
    x_train: np.ndarray, x_test: np.ndarray, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Iterator[tuple[slice, np.ndarray]]:
    """For each chunk of test points: (its slice, the training indices sorted nearest first).

    The order array is chunk × n_train (int64); memory is bounded by ``chunk_size``.
    """
    norms, first_copy = _train_keys(x_train)
    for start in range(0, x_test.shape[0], chunk_size):
        rows = slice(start, min(start + chunk_size, x_test.shape[0]))
        keys = x_test[rows] @ x_train.T
        keys *= -2.0
        keys += norms  # in place: one chunk × n_train array
        if first_copy is not None:
            keys = keys[:, first_copy]  # duplicates take their first copy's key: exact ties
        # The unstable sort is ~4× faster; rows with an exact tie are redone stably, so the
        # order is always (key, training index).
        order = np.argsort(keys, axis=1)
        ranked = np.take_along_axis(keys, order, axis=1)
        tied = np.flatnonzero((ranked[:, 1:] == ranked[:, :-1]).any(axis=1))
        if tied.size:
            order[tied] = np.argsort(keys[tied], axis=1, kind="stable")
        yield rows, order


def neighbour_ranks(x_train: np.ndarray, x_test: np.ndarray, chunk_size: int = DEFAULT_CHUNK_SIZE) -> np.ndarray:
    """rank[l, i]: position of training instance i in test point l's order (0 = nearest)."""
    n_train = x_train.shape[0]
    dtype = np.int32 if n_train < 2**31 else np.int64
    ranks = np.empty((x_test.shape[0], n_train), dtype=dtype)
    positions = np.arange(n_train, dtype=dtype)
    for rows, order in neighbour_orders(x_train, x_test, chunk_size):
        np.put_along_axis(ranks[rows], order, np.broadcast_to(positions, order.shape), axis=1)
    return ranks


class KnnUtility:
    """v(S) of the module docstring, over training-instance indices 0..n_train−1.

    A plain callable for :func:`fedvalue.ads` and :func:`fedvalue.loo`: each call ranks
    the coalition's members per test point (no refit, but O(n_test·|S|) per call).
    Returns hits / (K·n_test) with hits the integer number of correct-label neighbours,
    the same float the incremental estimators of :mod:`fedvalue.valuation.knn.monte_carlo` compute.
    """

    def __init__(self, x_train: object, y_train: object, x_test: object, y_test: object, k: int = 5,
                 *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
        x_train, y_train, x_test, y_test, self.k = check_knn_data(x_train, y_train, x_test, y_test, k)
        self.num_train, self.num_test = x_train.shape[0], x_test.shape[0]
        self.ranks = neighbour_ranks(x_train, x_test, check_chunk_size(chunk_size))
        self.matches = y_train[None, :] == y_test[:, None]  # n_test × n_train
        self.y_train, self.y_test = y_train, y_test

    def _nearest(self, coalition: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """(members, positions in ``members`` of each test point's min(K, |S|) nearest)."""
        members = np.fromiter((int(i) for i in coalition), dtype=np.int64)
        if members.size and (members.min() < 0 or members.max() >= self.num_train):
            raise ValueError(f"coalition: expected training indices in [0, {self.num_train}); got "
                             f"{sorted(members.tolist())[:5]}...")
        ranks = self.ranks[:, members]
        if members.size > self.k:
            return members, np.argpartition(ranks, self.k - 1, axis=1)[:, : self.k]
        return members, np.broadcast_to(np.arange(members.size), ranks.shape)

    def hits(self, coalition: Iterable[int]) -> int:
        """Correct-label neighbours among each test point's K nearest in ``coalition``, summed."""
        members, nearest = self._nearest(coalition)
        if members.size == 0:
            return 0
        return int(np.take_along_axis(self.matches[:, members], nearest, axis=1).sum())

    def accuracy(self, coalition: Iterable[int]) -> float:
        """Test accuracy of the K-NN majority vote trained on ``coalition`` (same neighbour
        order; a tied vote goes to the smallest label); 0 for the empty coalition."""
        members, nearest = self._nearest(coalition)
        if members.size == 0:
            return 0.0
        labels = self.y_train[members][nearest]  # n_test × min(K, |S|)
        offset = labels.min()
        width = int(labels.max() - offset) + 1
        votes = np.zeros((labels.shape[0], width), dtype=np.int64)
        np.add.at(votes, (np.arange(labels.shape[0])[:, None], labels - offset), 1)
        predicted = votes.argmax(axis=1) + offset
        return float(np.mean(predicted == self.y_test))

    def __call__(self, coalition: Iterable[int]) -> float:
        return self.hits(coalition) / (self.k * self.num_test)
