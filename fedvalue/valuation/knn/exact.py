"""Exact KNN Asymmetric Data Shapley ([ADS] §5.2, Thm 5.1, App. B.6, Alg. 2).

Ordered instance groups σ = (C_1, ..., C_T), the KNN utility of
:mod:`fedvalue.valuation.knn.utility` (normalized by K). Fix a test point x and a group t; let
P = C_1 ∪ ... ∪ C_{t−1}, q_1, ..., q_m the members of C_t from nearest to farthest, a_i =
1[y_{q_i} = y], b_j = 1[y of P's j-th nearest = y] (b_j = 0 beyond |P|), B_j = b_1 + ... + b_j,
and c_i the number of P's instances before q_i in the order (the total order of
:mod:`fedvalue.valuation.knn.utility`: a P-instance at the same distance but a lower index counts,
where the paper's strict inequality would not; so ties need no special case). By Lemma B.1 and Eq. 19 of
[ADS] App. B.6 the number s of q_1..q_{i−1} that precede the pair {q_i, q_{i+1}} is uniform
on {0, ..., i−1}, and regimes (15)–(17) give

    φ(q_i) − φ(q_{i+1}) = [ n_B (a_i − a_{i+1}) + n_C a_i − (B_{K−lo} − B_{K−hi−1}) ] / (i·K),

    n_B = max(0, min(i, K − c_{i+1})),   lo = max(0, K − c_{i+1}),   hi = min(i − 1, K − c_i − 1),
    n_C = max(0, hi − lo + 1),

which is Thm 5.1's cases 1–4 with the hypergeometric double sums of cases 3–4 summed in
closed form (tests/fedvalue/valuation/knn/test_exact.py checks it against the theorem as printed and
against brute force). The base case (App. B.6) is the farthest member q_m:

    φ(q_m) = [ n_0 a_m − (B_K − B_{K−n_0}) ] / (m·K),   n_0 = max(0, min(m, K − c_m)).

App. B.6 writes K − c_max in place of n_0; the cap at m = |C_t| matters when K − c_max > m
(a group smaller than K with few earlier neighbours), where a subset of size s ≥ m does
not exist. With one group (P = ∅) this is KNN-Shapley ([KNNSV] Thm 1).

Values are averaged over test points (Alg. 2, line 11), then summed to sources and
contributors (lines 14–15). The computation is vectorized over a chunk of test points and
O(T·n_train) per test point after the sort; memory is O(chunk_size · n_train).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedvalue.valuation.knn.utility import DEFAULT_CHUNK_SIZE, check_chunk_size, check_knn_data, neighbour_orders
from fedvalue.valuation.result import ValuationResult

__all__ = ["KnnValuation", "check_instance_groups", "knn_ads", "knn_shapley", "totals_by"]


@dataclass(frozen=True)
class KnnValuation:
    """Instance values plus their sums per source and per contributor ([ADS] Alg. 2, lines 14–16).

    Attributes
    ----------
    instances
        Per-instance :class:`~fedvalue.ValuationResult` (player = training index).
    sources, contributors
        Σ of instance values per source id and per contributor id (each instance its own
        source / contributor when none were given).
    """

    instances: ValuationResult
    sources: pd.Series
    contributors: pd.Series


def check_instance_groups(groups: object, num_train: int) -> np.ndarray:
    """Group index (0..T−1) of every training instance; ``groups`` must partition 0..n−1."""
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence) or len(groups) == 0:
        raise ValueError("groups: expected a non-empty sequence of groups of training indices, e.g. "
                         f"[originals, augmentations]; got {groups!r}.")
    group_of = np.full(num_train, -1, dtype=np.int64)
    for t, group in enumerate(groups):
        members = np.asarray(group)
        if members.ndim != 1 or members.size == 0 or not np.issubdtype(members.dtype, np.integer):
            raise ValueError(f"groups: expected group {t} to be a non-empty 1-D sequence of training indices; "
                             f"got {group!r}.")
        if members.min() < 0 or members.max() >= num_train:
            raise ValueError(f"groups: expected indices in [0, {num_train}); group {t} holds "
                             f"{int(members.min()) if members.min() < 0 else int(members.max())}.")
        taken = members[group_of[members] != -1]
        if taken.size or len(np.unique(members)) != members.size:
            where = int(taken[0]) if taken.size else int(members[np.argmax(np.bincount(members))])
            raise ValueError(f"groups: expected each training index in exactly one group; {where} appears twice.")
        group_of[members] = t
    missing = np.flatnonzero(group_of == -1)
    if missing.size:
        raise ValueError(f"groups: expected the groups to cover every training instance; {missing.size} are in no "
                         f"group (first: {int(missing[0])}).")
    return group_of


def totals_by(values: pd.Series, labels: Sequence[Hashable] | None, name: str) -> pd.Series:
    """Σ of ``values`` (indexed by training index) per label; ``labels[i]`` labels instance i."""
    if labels is None:
        return values.rename(name)
    labels = list(labels)
    if len(labels) != len(values):
        raise ValueError(f"{name}: expected one label per training instance ({len(values)}); got {len(labels)}.")
    keys = pd.Series(labels, dtype=object)[values.index.to_numpy()].to_numpy()
    return values.groupby(keys, sort=True).sum().rename(name)


def _group_values(order: np.ndarray, order_groups: np.ndarray, matches: np.ndarray, t: int,
                  k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Thm 5.1 + base case for group t on a chunk: (members, φ), both chunk × m, nearest
    first, and the chunk's correct labels among the K nearest of C_1 ∪ ... ∪ C_t."""
    rows, n = order_groups.shape
    in_group = order_groups == t
    m = int(in_group[0].sum())
    members = order[in_group].reshape(rows, m)
    a = matches[in_group].reshape(rows, m).astype(np.float64)
    if t == 0:
        return members, _first_group_values(a, k), int(a[:, :k].sum())
    before = order_groups < t
    earlier_count = np.cumsum(before, axis=1, dtype=np.int32)
    c = earlier_count[in_group].reshape(rows, m).astype(np.int64)
    # B_0..B_K over P's K nearest (b_j = 0 beyond |P|).
    size_p = int(before[0].sum())
    b = np.zeros((rows, k), dtype=np.float64)
    first = min(k, size_p)
    b[:, :first] = matches[before & (earlier_count <= k)].reshape(rows, first)
    prefix = np.zeros((rows, k + 1), dtype=np.float64)
    np.cumsum(b, axis=1, out=prefix[:, 1:])
    # The K nearest of P ∪ C_t: q_i is among them iff c_i + i ≤ K; P gives the rest.
    head = min(k, m)
    from_group = (c[:, :head] + np.arange(1, head + 1) <= k).sum(axis=1)
    from_earlier = np.minimum(k, size_p + m) - from_group
    hits = int((a[:, :head] * (np.arange(head) < from_group[:, None])).sum() + prefix[np.arange(rows),
                                                                                          from_earlier].sum())

    phi = np.empty((rows, m), dtype=np.float64)
    n0 = np.maximum(np.minimum(m, k - c[:, -1]), 0)
    phi[:, -1] = (n0 * a[:, -1] - (prefix[:, k] - prefix[np.arange(rows), k - n0])) / (m * k)
    phi[:, :-1] = phi[:, -1:]
    # c_i is non-decreasing in i and every step with c_i ≥ K is 0 (case 1): only the first
    # `width` steps can differ from 0 (for a later group, a few times K members).
    width = int((c[:, :-1] < k).sum(axis=1).max()) if m > 1 else 0
    if width:
        i = np.arange(1, width + 1, dtype=np.int64)[None, :]
        c_i, c_next = c[:, :width], c[:, 1: width + 1]
        a_i, a_next = a[:, :width], a[:, 1: width + 1]
        n_b = np.maximum(np.minimum(i, k - c_next), 0)
        lo = np.maximum(k - c_next, 0)
        hi = np.minimum(i - 1, k - c_i - 1)
        n_c = np.maximum(hi - lo + 1, 0)
        # B indices are only meaningful where n_C > 0; clip keeps the gather in range elsewhere.
        top = np.take_along_axis(prefix, np.clip(k - lo, 0, k), axis=1)
        bottom = np.take_along_axis(prefix, np.clip(k - hi - 1, 0, k), axis=1)
        displaced = np.where(n_c > 0, top - bottom, 0.0)
        steps = (n_b * (a_i - a_next) + n_c * a_i - displaced) / (i * k)
        # φ_i = φ_m + Σ_{j=i}^{m−1} (φ_j − φ_{j+1}): a reverse running sum, farthest first.
        phi[:, :width] += np.cumsum(steps[:, ::-1], axis=1)[:, ::-1]
    return members, phi, hits


def _first_group_values(a: np.ndarray, k: int) -> np.ndarray:
    """The general case with P = ∅ (c = 0, B = 0), i.e. KNN-Shapley ([KNNSV] Thm 1):
    φ_m = min(m, K)·a_m/(mK), φ_i − φ_{i+1} = min(i, K)(a_i − a_{i+1})/(iK)."""
    rows, m = a.shape
    phi = np.empty((rows, m), dtype=np.float64)
    phi[:, -1] = min(m, k) * a[:, -1] / (m * k)
    if m > 1:
        i = np.arange(1, m, dtype=np.int64)
        weights = np.minimum(i, k) / (i * k)
        # a is 0/1 (bool or float): the difference is −1, 0 or 1, times the weight.
        steps = np.subtract(a[:, :-1], a[:, 1:], dtype=np.float64)
        steps *= weights
        phi[:, :-1] = np.cumsum(steps[:, ::-1], axis=1)[:, ::-1]
        phi[:, :-1] += phi[:, -1:]
    return phi


def knn_ads(
    x_train: object,
    y_train: object,
    x_test: object,
    y_test: object,
    groups: Sequence[Sequence[int]],
    *,
    k: int = 5,
    sources: Sequence[Hashable] | None = None,
    contributors: Sequence[Hashable] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> KnnValuation:
    """Exact KNN-ADS of every training instance ([ADS] Thm 5.1, Alg. 2).

    Parameters
    ----------
    x_train, y_train
        Training features (n × d) and integer labels (n).
    x_test, y_test
        Test features (n_test × d) and labels; the utility averages over them.
    groups
        σ = (C_1, ..., C_T): sequences of training indices partitioning 0..n−1, earlier
        groups first (e.g. ``[originals, augmentations]``). One group: KNN-Shapley.
    k
        Neighbours K.
    sources, contributors
        Optional label per training instance: its source and its contributor; values
        are summed per label ([ADS] Alg. 2, lines 14–15).
    chunk_size
        Test points processed at once; memory is O(chunk_size · n).

    Returns
    -------
    KnnValuation
        ``instances`` (method ``"knn-ads"``, players = training indices in group order,
        group-efficiency gaps against the prefix utilities v(C_1 ∪ ... ∪ C_t)), and the
        source and contributor totals.
    """
    x_train, y_train, x_test, y_test, k = check_knn_data(x_train, y_train, x_test, y_test, k)
    chunk_size = check_chunk_size(chunk_size)
    n_train, n_test = x_train.shape[0], x_test.shape[0]
    group_of = check_instance_groups(groups, n_train)
    num_groups = int(group_of.max()) + 1
    # Narrow dtypes: the chunk's gathers through them are the bulk of the memory traffic.
    group_of = group_of.astype(np.int8 if num_groups < 128 else np.int64)
    y_train = y_train.astype(np.int32) if np.abs(y_train).max() < 2**31 else y_train
    for name, labels in (("sources", sources), ("contributors", contributors)):
        if labels is not None and len(labels) != n_train:
            raise ValueError(f"{name}: expected one label per training instance ({n_train}); got {len(labels)}.")
    if sources is not None:
        source_groups = pd.Series(group_of).groupby(pd.Series(list(sources), dtype=object)).nunique()
        if (source_groups > 1).any():
            raise ValueError(f"sources: expected each source's instances in one group; source "
                             f"{source_groups.index[source_groups > 1][0]!r} spans several.")

    totals = np.zeros(n_train, dtype=np.float64)
    hits = np.zeros(num_groups + 1, dtype=np.int64)
    for rows, order in neighbour_orders(x_train, x_test, chunk_size):
        matches = y_train[order] == y_test[rows, None]
        if num_groups == 1:  # KNN-Shapley: no group bookkeeping
            phi = _first_group_values(matches, k)
            totals += np.bincount(order.ravel(), weights=phi.ravel(), minlength=n_train)
            hits[1] += int(matches[:, :k].sum())
            continue
        order_groups = group_of[order]
        for t in range(num_groups):
            members, phi, group_hits = _group_values(order, order_groups, matches, t, k)
            totals += np.bincount(members.ravel(), weights=phi.ravel(), minlength=n_train)
            hits[t + 1] += group_hits
    values = totals / n_test
    prefix_utilities = hits / (k * n_test)

    group_lists = [np.asarray(g, dtype=np.int64) for g in groups]
    players = np.concatenate(group_lists)
    gaps = [float(values[g].sum() - (prefix_utilities[t + 1] - prefix_utilities[t])) for t, g in enumerate(group_lists)]
    index = pd.Index(players.tolist(), dtype=object, name="player")
    instances = ValuationResult(
        method="knn-ads",
        values=pd.Series(values[players], index=index, name="knn-ads"),
        stderr=pd.Series(np.zeros(n_train), index=index, name="stderr"),
        num_evaluations=0,
        groups=tuple(tuple(g.tolist()) for g in group_lists),
        prefix_utilities=tuple(float(u) for u in prefix_utilities),
        efficiency_gaps=pd.Series(gaps, index=pd.RangeIndex(num_groups, name="group"), name="gap"),
    )
    return KnnValuation(
        instances=instances,
        sources=totals_by(instances.values, sources, "source_value"),
        contributors=totals_by(instances.values, contributors, "contributor_value"),
    )


def knn_shapley(
    x_train: object, y_train: object, x_test: object, y_test: object, *, k: int = 5,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> ValuationResult:
    """Classical KNN-Shapley ([KNNSV] Thm 1): :func:`knn_ads` with one group."""
    num_train = np.asarray(x_train).shape[0] if np.ndim(x_train) == 2 else 0
    return knn_ads(x_train, y_train, x_test, y_test, [np.arange(num_train)], k=k, chunk_size=chunk_size).instances
