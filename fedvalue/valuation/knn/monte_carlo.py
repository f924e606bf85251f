"""MC-ADS, MC-DS and leave-one-out under the KNN utility, without refitting per prefix.

MC-ADS ([ADS] Alg. 1) walks σ-respecting permutations and needs v at every prefix. With
the KNN utility of :mod:`fedvalue.valuation.knn.utility` a prefix's state is, per test point, its K
nearest members (ranks in the fixed neighbour order) and the number of correct labels
among them. Adding instance q changes a test point's state only if q's rank beats the
current K-th: q replaces it and hits += a_q − a_replaced (an empty slot is a sentinel
rank with a = 0). One step costs O(n_test) per permutation, vectorized over a block of
permutations, instead of O(n_test·|S|) for a fresh evaluation.

The permutations are drawn by :func:`fedvalue.valuation.ads.sample_ordered_permutations` and each
prefix utility is hits/(K·n_test), the float :class:`~fedvalue.valuation.knn.utility.KnnUtility`
returns, so :func:`knn_mc_ads` gives bit for bit the values of
``fedvalue.ads(KnnUtility(...), groups, method="mc", seed=...)`` for the same seed.
One group is MC-DS (Data Shapley, [ADS] Eq. 3). Memory: the permutations × n marginals (as
``fedvalue.ads`` keeps them, for the same mean and standard error) plus a block's state.

Truncation (``truncation_tolerance > 0``) is the rule of ``fedvalue.ads(method="tmc")``:
in group t a permutation stops once |v(U_t) − v(prefix)| < tolerance and its remaining
marginals in that group are 0 (each group's efficiency gap is then below the tolerance).

:func:`knn_loo` is ψ(i) = v(N) − v(N∖{i}) by the same utility: removing i changes a test
point only if i is among its K nearest, where the (K+1)-th nearest takes its place.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fedvalue._checks import check_integer, check_non_negative, check_open_unit, check_positive, check_seed
from fedvalue.valuation.ads import sample_ordered_permutations
from fedvalue.valuation.plan import mc_num_permutations
from fedvalue.valuation.knn.exact import check_instance_groups
from fedvalue.valuation.knn.utility import (
    DEFAULT_CHUNK_SIZE,
    check_chunk_size,
    check_knn_data,
    neighbour_orders,
    neighbour_ranks,
)
from fedvalue.valuation.result import ValuationResult, result_from_marginals

__all__ = ["KnnAccuracyPrefixes", "KnnLikelihoodPrefixes", "knn_loo", "knn_mc_ads"]

#: Entries of a block's state (permutations × test points × K) held at once.
_BLOCK_ENTRIES = 1 << 22


def knn_mc_ads(
    x_train: object,
    y_train: object,
    x_test: object,
    y_test: object,
    groups: Sequence[Sequence[int]],
    *,
    k: int = 5,
    epsilon: float = 0.1,
    delta: float = 0.05,
    r: float = 1.0,
    num_permutations: int | None = None,
    seed: int | np.random.Generator | None = None,
    truncation_tolerance: float = 0.0,
) -> ValuationResult:
    """MC-ADS of every training instance under the KNN utility (module docstring).

    Parameters
    ----------
    x_train, y_train, x_test, y_test, k
        As :func:`fedvalue.valuation.knn.exact.knn_ads`.
    groups
        σ as sequences of training indices partitioning 0..n−1; the players of the
        result are in this order (one group: MC-DS).
    epsilon, delta, r
        Alg. 1's m* = ⌈r²/(2ε²)·log(2n/δ)⌉ permutations, as :func:`fedvalue.ads`.
    num_permutations
        Overrides m* when given.
    seed
        Seed or Generator of the permutations (the same draws as :func:`fedvalue.ads`).
    truncation_tolerance
        0: plain MC (method ``"ads-mc"``); > 0: truncated MC (``"ads-tmc"``).
    """
    x_train, y_train, x_test, y_test, k = check_knn_data(x_train, y_train, x_test, y_test, k)
    n_train, n_test = x_train.shape[0], x_test.shape[0]
    check_instance_groups(groups, n_train)
    group_arrays = [np.asarray(g, dtype=np.int64) for g in groups]
    check_positive("epsilon", epsilon)
    check_open_unit("delta", delta)
    check_positive("r", r)
    if num_permutations is None:
        num_permutations = mc_num_permutations(n_train, epsilon, delta, r)
    else:
        check_integer("num_permutations", num_permutations, none_ok=True)
    check_non_negative("truncation_tolerance", truncation_tolerance)
    rng = check_seed(seed)

    players = np.concatenate(group_arrays)
    sizes = [len(g) for g in group_arrays]
    columns = np.cumsum([0, *sizes])
    order = sample_ordered_permutations(sizes, int(num_permutations), rng)
    ranks = neighbour_ranks(x_train, x_test)
    # matches_by_rank[l, r]: label of test point l's r-th nearest is right; column n is the empty slot.
    matches_by_rank = np.zeros((n_test, n_train + 1), dtype=np.int64)
    np.put_along_axis(matches_by_rank, ranks.astype(np.int64), (y_train[None, :] == y_test[:, None]), axis=1)
    scale = k * n_test

    prefix_states, prefix_hits = _prefix_states(players, columns, ranks, matches_by_rank, k)

    marginals = np.zeros((int(num_permutations), n_train), dtype=np.float64)
    ranks_by_instance = np.ascontiguousarray(ranks.T)  # one contiguous row per added instance
    block = max(1, _BLOCK_ENTRIES // (n_test * k))
    steps = 0
    for start in range(0, int(num_permutations), block):
        rows = slice(start, min(start + block, int(num_permutations)))
        for t in range(len(group_arrays)):
            steps += _walk_group(
                order[rows, columns[t]: columns[t + 1]], players, ranks_by_instance, matches_by_rank, prefix_states[t],
                prefix_hits[t], prefix_hits[t + 1], scale, truncation_tolerance, marginals[rows],
            )

    return result_from_marginals(marginals, players, group_arrays, np.array(prefix_hits) / scale, order=order,
                                 method="ads-tmc" if truncation_tolerance > 0 else "ads-mc", num_evaluations=steps)


def _prefix_states(players: np.ndarray, columns: np.ndarray, ranks: np.ndarray, matches_by_rank: np.ndarray,
                   k: int) -> tuple[list[np.ndarray], list[int]]:
    """For ∅ and every prefix U_t = D_1 ∪ ... ∪ D_t: each test point's k nearest ranks among the
    prefix (the empty slot n where fewer), and how many of them carry the test point's label."""
    n_test, n_train = ranks.shape
    states, hits = [np.full((n_test, k), n_train, dtype=np.int64)], [0]
    for t in range(len(columns) - 1):
        nearest = np.sort(ranks[:, players[: columns[t + 1]]], axis=1)[:, :k].astype(np.int64)
        state = np.full((n_test, k), n_train, dtype=np.int64)
        state[:, : nearest.shape[1]] = nearest
        states.append(state)
        hits.append(int(np.take_along_axis(matches_by_rank, state, axis=1).sum()))
    return states, hits


def _walk_group(
    columns_added: np.ndarray,
    players: np.ndarray,
    ranks_by_instance: np.ndarray,
    matches_by_rank: np.ndarray,
    start_state: np.ndarray,
    start_hits: int,
    full_hits: int,
    scale: int,
    tolerance: float,
    marginals: np.ndarray,
) -> int:
    """Walk one group of a block of permutations from U_{t−1}; writes marginals, returns steps taken."""
    num_rows, size = columns_added.shape
    state = np.broadcast_to(start_state, (num_rows, *start_state.shape)).copy()
    worst = state.max(axis=2)
    hits = np.full(num_rows, start_hits, dtype=np.int64)
    previous = np.full(num_rows, start_hits / scale)
    full = full_hits / scale
    active = np.full(num_rows, tolerance == 0 or abs(full - previous[0]) >= tolerance)
    taken = 0
    for j in range(size):
        live = np.flatnonzero(active)
        if live.size == 0:
            break
        taken += live.size
        # Views when every permutation is still walked (always without truncation).
        sel = slice(None) if live.size == num_rows else live
        added = columns_added[sel, j]
        new_ranks = ranks_by_instance[players[added]]  # live × n_test
        row, point = np.nonzero(new_ranks < worst[sel])
        if row.size:
            target = row if live.size == num_rows else live[row]
            entering = new_ranks[row, point]
            replaced = worst[target, point]
            gain = matches_by_rank[point, entering] - matches_by_rank[point, replaced]
            hits[sel] += np.bincount(row, weights=gain, minlength=live.size).astype(np.int64)
            slots = state[target, point]
            slots[np.arange(row.size), slots.argmax(axis=1)] = entering
            state[target, point] = slots
            worst[target, point] = slots.max(axis=1)
        current = hits[sel] / scale
        marginals[live, added] = current - previous[sel]
        previous[sel] = current
        if tolerance > 0:
            active[sel] = np.abs(full - current) >= tolerance
    return taken


def knn_loo(
    x_train: object, y_train: object, x_test: object, y_test: object, *, k: int = 5,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> ValuationResult:
    """Leave-one-out ψ(i) = v(N) − v(N∖{i}) of every training instance under the KNN utility.

    Equals ``fedvalue.loo(KnnUtility(...), range(n))`` bit for bit, in O(n_test·n log n)
    time and O(chunk_size·n) memory.
    """
    x_train, y_train, x_test, y_test, k = check_knn_data(x_train, y_train, x_test, y_test, k)
    chunk_size = check_chunk_size(chunk_size)
    n_train, n_test = x_train.shape[0], x_test.shape[0]
    total = 0
    lost = np.zeros(n_train, dtype=np.int64)  # hits(N) − hits(N∖{i}), summed over test points
    for rows, order in neighbour_orders(x_train, x_test, chunk_size):
        nearest = order[:, : k + 1]
        matches = (y_train[nearest] == y_test[rows, None]).astype(np.int64)
        kept = min(k, n_train)
        total += int(matches[:, :kept].sum())
        successor = matches[:, k] if n_train > k else np.zeros(matches.shape[0], dtype=np.int64)
        np.add.at(lost, nearest[:, :kept].ravel(), (matches[:, :kept] - successor[:, None]).ravel())
    scale = k * n_test
    full = total / scale
    values = full - (total - lost) / scale
    index = pd.Index(list(range(n_train)), dtype=object, name="player")
    return ValuationResult(
        method="loo",
        values=pd.Series(values, index=index, name="loo"),
        stderr=pd.Series(np.zeros(n_train), index=index, name="stderr"),
        num_evaluations=0,
        groups=(tuple(range(n_train)),),
        prefix_utilities=(float(full),),
        efficiency_gaps=pd.Series([], dtype=np.float64, name="gap"),
    )


class KnnAccuracyPrefixes:
    """The K-NN classifier's test accuracy as a :class:`fedvalue.valuation.prefix_mc.PrefixModel`.

    v(S) is :meth:`fedvalue.valuation.knn.utility.KnnUtility.accuracy`: the share of test points whose
    majority vote over their min(K, |S|) nearest members of S (the fixed neighbour order of
    :mod:`fedvalue.valuation.knn.utility`; a tied vote to the smallest label) is right, and 0 for
    S = ∅ — the "retrained" K-NN model of [ADS] §6.1, not the likelihood surrogate KNN-ADS
    values. Growing a subset updates, per test point, its K nearest (the entering instance
    replaces the farthest when it is nearer, as :func:`knn_mc_ads` does) and the class
    votes, so a step costs O(n_test) per subset.
    """

    def __init__(self, x_train: object, y_train: object, x_test: object, y_test: object, k: int = 5) -> None:
        x_train, y_train, x_test, y_test, self.k = check_knn_data(x_train, y_train, x_test, y_test, k)
        classes, labels = np.unique(np.concatenate([y_train, y_test]), return_inverse=True)
        self.num_classes = len(classes)
        self.labels = labels[: len(y_train)].astype(np.int64)
        self.test_labels = labels[len(y_train):].astype(np.int64)
        self.num_train, self.num_test = x_train.shape[0], x_test.shape[0]
        self.ranks = neighbour_ranks(x_train, x_test)  # n_test × n_train
        self.ranks_by_instance = np.ascontiguousarray(self.ranks.T).astype(np.int64)
        self.order = np.argsort(self.ranks, axis=1)  # test point's training indices, nearest first

    def start(self, masks: np.ndarray) -> dict:
        masks = np.asarray(masks, dtype=bool)
        # A block of permutations starts every row from the same prefix: fit each distinct mask
        # once and give every row its own copy (fancy indexing copies; rows are then extended apart).
        distinct, inverse = np.unique(masks, axis=0, return_inverse=True)
        rows, sentinel = distinct.shape[0], self.num_train
        state = np.full((rows, self.num_test, self.k), sentinel, dtype=np.int64)
        votes = np.zeros((rows, self.num_test, self.num_classes), dtype=np.int64)
        for r in range(rows):
            member = distinct[r][self.order]  # n_test × n_train, nearest first
            position = np.cumsum(member, axis=1)
            taken = member & (position <= self.k)
            point, column = np.nonzero(taken)
            slot = position[point, column] - 1
            state[r, point, slot] = column  # ranks of the nearest members
            np.add.at(votes[r], (point, self.labels[self.order[point, column]]), 1)
        inverse = inverse.reshape(-1)
        state, votes = state[inverse], votes[inverse]
        return {"state": state, "worst": state.max(axis=2), "votes": votes, "size": masks.sum(axis=1),
                "correct": self._correct(votes)}

    def _correct(self, votes: np.ndarray) -> np.ndarray:
        return votes.argmax(axis=-1) == self.test_labels

    def utilities(self, state: dict) -> np.ndarray:
        return np.where(state["size"] > 0, state["correct"].mean(axis=1), 0.0)

    def add(self, state: dict, rows: np.ndarray, instances: np.ndarray) -> np.ndarray:
        rows, instances = np.asarray(rows, dtype=np.int64), np.asarray(instances, dtype=np.int64)
        new_ranks = self.ranks_by_instance[instances]  # len(rows) × n_test
        hit, point = np.nonzero(new_ranks < state["worst"][rows])
        if hit.size:
            target = rows[hit]
            entering = new_ranks[hit, point]
            replaced = state["worst"][target, point]
            slots = state["state"][target, point]
            slots[np.arange(hit.size), slots.argmax(axis=1)] = entering
            state["state"][target, point] = slots
            state["worst"][target, point] = slots.max(axis=1)
            votes = state["votes"]
            votes[target, point, self.labels[instances[hit]]] += 1
            real = replaced < self.num_train
            leaving = self.labels[self.order[point[real], replaced[real]]]
            votes[target[real], point[real], leaving] -= 1
            state["correct"][target, point] = votes[target, point].argmax(axis=1) == self.test_labels[point]
        state["size"][rows] += 1
        return state["correct"][rows].mean(axis=1)


class KnnLikelihoodPrefixes(KnnAccuracyPrefixes):
    """The K-NN likelihood of the right label as a :class:`fedvalue.valuation.prefix_mc.PrefixModel`.

    v(S) = (1/(K·n_test)) Σ_j #{right-label members among test point j's min(K, |S|) nearest
    in S}: the float :class:`fedvalue.valuation.knn.utility.KnnUtility` returns (the utility
    exact KNN-ADS values, [ADS] Def. 5.2 with 1/K) and 0 for S = ∅. Where the majority vote's
    accuracy moves only when an instance flips a vote (so most instances' marginals are exactly
    0 and their values tie), the likelihood moves whenever an instance enters a test point's K
    nearest: a utility with few ties beside the accuracy of [ADS] §6.1. Same state and steps as
    :class:`KnnAccuracyPrefixes`; only the read-out differs.
    """

    def _likelihood(self, votes: np.ndarray) -> np.ndarray:
        hits = np.take_along_axis(votes, self.test_labels[None, :, None], axis=2)[:, :, 0].sum(axis=1)
        return hits / (self.k * self.num_test)

    def utilities(self, state: dict) -> np.ndarray:
        return self._likelihood(state["votes"])

    def add(self, state: dict, rows: np.ndarray, instances: np.ndarray) -> np.ndarray:
        super().add(state, rows, instances)
        return self._likelihood(state["votes"][np.asarray(rows, dtype=np.int64)])
