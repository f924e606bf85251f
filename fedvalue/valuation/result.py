"""Valuation results: values per player plus the numbers needed to trust them.

**Standard errors of permutation sampling** (``"ads-mc"``, ``"ads-tmc"``: [ADS] Alg. 1, in every
path that samples permutations: :mod:`fedvalue.valuation.ads`, its
:class:`~fedvalue.valuation.shapley_sampling.PermutationSampler`, :mod:`fedvalue.valuation.prefix_mc`
and :mod:`fedvalue.valuation.knn.monte_carlo`). A group of d players is sampled by m independent
uniform permutations; player i's value is the mean of its marginals, φ̂_i = (1/m) Σ_s X_si, so
Var φ̂_i = σ_i²/m, and as i's position in a permutation is uniform on 0, ..., d − 1,

    σ_i² = Var X_i = (1/d) Σ_k E[(X_i − φ_i)² | i at position k].

``"plain"`` (:data:`STDERR_ESTIMATORS`) estimates σ_i² by the sample variance s_i² (ddof 1): unbiased,
but with few permutations its distribution is very skewed, and its small draws come with the
largest errors of φ̂_i. Most of σ_i² comes from a few positions (in a round of federated learning,
a client's update alone, k = 0, or after one other); a player misses a given position in all m
permutations with probability (1 − 1/d)^m (28% for d = 10, m = 12: 100 evaluations), and then φ̂_i
lacks that position's share while s_i² lacks its spread. On the 360 real rounds of
docs/results/stderr_coverage.csv (``python -m bench.taylor_agreement --coverage``) ±2 plain standard
errors held 0.80 of the exact values at 100 evaluations (0.61–0.86 by regime).

``"by-position"``, the default, post-stratifies by position [POSTSTRAT], the design's own strata
with their known weights 1/d. With D_si = m/(m − 1) (X_si − φ̂_i)², c_ik the draws of player i at
position k and P_k = (1/m) Σ_s D_{s,π_s(k)} the position's moment pooled over the group's players
(every permutation puts one player at each position), each player's moment at k is its own draws
there shrunk toward the pool with the weight of one draw, the moderated variance of [MODVAR] with
one prior degree of freedom:

    Q_ik = (Σ_{s: i at k in s} D_si + P_k) / (c_ik + 1),   σ̂_i² = (1/d) Σ_k Q_ik,   se_i = σ̂_i / √m.

A position the player never took counts at what the group's other players show there, instead of
not at all; one it took once counts half its own draw (as skewed as s_i²), half the pool. As m grows
c_ik ≈ m/d and the pool's weight vanishes, so σ̂_i² → σ_i²: the estimator is consistent, and with the
positions taken equally often and no pool it is s_i² itself. Constant marginals (an additive game)
still give 0; a player whose draws were all equal is not taken for null at positions it did not
take (its standard error is then the pool's, not 0). The estimates φ̂ are the same under both. On
those rounds ±2 standard errors by position held 0.94 (0.94–0.95 by regime, 0.91 with half the
clients free-riders, whose marginals at one position differ by kind more than a pool can tell).
Without the pool's weight in the positions taken (the pool only for positions not taken) a position
taken once would count its single squared deviation alone, as skewed as s_i².
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

#: How the standard error of permutation sampling is estimated (module docstring): ``"by-position"``,
#: post-stratified by position, or ``"plain"``, the sample standard deviation of the marginals over √m,
#: which runs booked before (kept to recompute and audit them).
STDERR_ESTIMATORS = ("by-position", "plain")
#: Weight, in draws, of a position's pooled moment in each player's own moment there (module docstring).
POOLED_WEIGHT = 1.0


@dataclass(frozen=True)
class ValuationResult:
    """Values of one valuation call and its sanity checks.

    Attributes
    ----------
    method
        ``"ads-exact"``, ``"ads-mc"`` or ``"loo"``.
    values
        Value per player (pandas Series indexed by player id, in group order).
    stderr
        Standard error per player: of the permutation marginals' mean for ``"ads-mc"`` and
        ``"ads-tmc"``, post-stratified by position (:func:`permutation_stderr`; tmc's leaves out
        truncation's bias), the sample standard deviation over √samples of the independent samples for the
        antithetic and stratified samplers, the sandwich estimate for KernelSHAP
        (:mod:`fedvalue.valuation.shapley_sampling`), with or without a budget; NaN below two
        samples; 0 for exact methods.
    num_evaluations
        Real utility evaluations this call made (coalitions already in the game's
        cache cost nothing).
    groups
        The ordered groups σ = (D_1, ..., D_T); LOO has one group, its players.
    prefix_utilities
        v(U_0), v(U_1), ..., v(U_T) with U_t = D_1 ∪ ... ∪ D_t ([ADS], Prop. 4.2).
        For LOO only v(N) is known: a one-element tuple.
    efficiency_gaps
        Σ_{z∈D_t} φ(z) − (v(U_t) − v(U_{t−1})) per group t ([ADS], Prop. 4.2);
        zero up to rounding for ADS, exact or MC. Empty for LOO, which is not efficient.
    num_permutations
        Sampled permutations for ``"ads-mc"``, ``"ads-tmc"``, ``"ads-antithetic"`` and
        ``"ads-stratified"`` (the most over groups), None otherwise.
    settled
        ``"ads-adaptive"`` only: whether each player's side of the caller's decision is settled
        (:mod:`fedvalue.valuation.adaptive`), a boolean Series by player; None otherwise.
    """

    method: str
    values: pd.Series
    stderr: pd.Series
    num_evaluations: int
    groups: tuple[tuple[Hashable, ...], ...]
    prefix_utilities: tuple[float, ...]
    efficiency_gaps: pd.Series
    num_permutations: int | None = None
    settled: pd.Series | None = None

    @property
    def max_efficiency_gap(self) -> float:
        """Largest |group-efficiency gap|; NaN when the method is not efficient (LOO)."""
        if self.efficiency_gaps.empty:
            return float("nan")
        return float(np.max(np.abs(self.efficiency_gaps.to_numpy())))

    def group_of(self) -> pd.Series:
        """Group index (0-based) of each player."""
        return pd.Series(
            {player: t for t, group in enumerate(self.groups) for player in group},
            name="group",
        )

    def to_frame(self) -> pd.DataFrame:
        """One row per player: value, stderr, group, method (and settled, for ``"ads-adaptive"``)."""
        frame = pd.DataFrame(
            {
                "value": self.values,
                "stderr": self.stderr,
                "group": self.group_of(),
            }
        )
        if self.settled is not None:
            frame["settled"] = self.settled
        frame["method"] = self.method
        frame.index.name = "player"
        return frame


def positions_in(orders: np.ndarray) -> np.ndarray:
    """Where each column sits in each row of ``orders`` (row s: the columns in the order added, a
    permutation of 0, ..., d − 1): ``positions[s, orders[s, j]] = j``."""
    orders = np.asarray(orders)
    positions = np.empty_like(orders)
    np.put_along_axis(positions, orders, np.broadcast_to(np.arange(orders.shape[1]), orders.shape), axis=1)
    return positions


def positions_within_groups(order: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Each player's position within its own group, per permutation, from σ-respecting permutations
    as :func:`fedvalue.valuation.ads.sample_ordered_permutations` draws them (entry (s, j): the column,
    in concatenated group order, of the j-th player added): columns in group order, group t's
    positions 0, ..., |D_t| − 1."""
    columns = np.cumsum([0, *sizes])
    positions = positions_in(order)
    for t in range(len(sizes)):
        positions[:, columns[t]: columns[t + 1]] -= columns[t]
    return positions


def permutation_stderr(marginals: np.ndarray, positions: np.ndarray, sizes: Sequence[int] | None = None,
                       estimator: str = "by-position") -> np.ndarray:
    """Standard error of each column mean of ``marginals`` (one row a sampled permutation, one column a
    player, groups of ``sizes`` in column order; None: one group), ``positions[s, i]`` the place of
    player i within its group in permutation s (:func:`positions_within_groups`). ``estimator`` ``"by-position"``
    post-stratifies by position with each position's moment moderated toward the group's pool,
    ``"plain"`` is the sample standard deviation over √m (module docstring). NaN below two rows, and
    for a group whose marginals hold NaN (one not walked)."""
    marginals = np.asarray(marginals, dtype=np.float64)
    num_permutations, n = marginals.shape
    if num_permutations < 2:
        return np.full(n, np.nan)
    if estimator == "plain":
        return marginals.std(axis=0, ddof=1) / math.sqrt(num_permutations)
    if estimator != "by-position":
        raise ValueError(f"estimator: expected one of {list(STDERR_ESTIMATORS)}; got {estimator!r}.")
    columns = np.cumsum([0, *([n] if sizes is None else sizes)])
    stderr = np.empty(n)
    for start, stop in zip(columns[:-1], columns[1:]):
        stderr[start:stop] = _by_position(marginals[:, start:stop], np.asarray(positions)[:, start:stop])
    return stderr


def _by_position(marginals: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """se_i = σ̂_i / √m of one group (module docstring), with Σ_k Q_ik summed as
    Σ_k P_k + Σ_{k taken by i} (Σ D_si − c_ik P_k) / (c_ik + w): only the (player, position) pairs
    drawn are visited, so a group of d players costs O(m·d), not d²."""
    m, d = marginals.shape
    squares = (marginals - marginals.mean(axis=0)) ** 2 * (m / (m - 1))
    pooled = np.bincount(positions.ravel(), weights=squares.ravel(), minlength=d) / m
    cells, inverse = np.unique((np.arange(d, dtype=np.int64) * d + positions).ravel(), return_inverse=True)
    own = np.bincount(inverse, weights=squares.ravel())
    counts = np.bincount(inverse)
    player, position = cells // d, cells % d
    correction = (own - counts * pooled[position]) / (counts + POOLED_WEIGHT)
    variance = (pooled.sum() + np.bincount(player, weights=correction, minlength=d)) / d
    return np.sqrt(np.maximum(variance, 0.0) / m)


def result_from_marginals(marginals: np.ndarray, players: np.ndarray, groups: Sequence[np.ndarray],
                          prefix_utilities: Sequence[float], *, order: np.ndarray, method: str,
                          num_evaluations: int, walked: Collection[int] | None = None,
                          stderr_estimator: str = "by-position") -> ValuationResult:
    """The result of a permutation sampler from its marginals (one row a permutation, one
    column a player in group order) and the permutations ``order`` that gave them (as
    :func:`fedvalue.valuation.ads.sample_ordered_permutations` draws them): φ̂ the column means
    ([ADS] Alg. 1, line 11), their standard errors (:func:`permutation_stderr`), and each group's
    efficiency gap Σ_{z∈D_t} φ̂(z) − (v(U_t) − v(U_{t−1})) (NaN for a group not ``walked``)."""
    num_permutations, n = marginals.shape
    mean = marginals.mean(axis=0)
    sizes = [len(g) for g in groups]
    stderr = permutation_stderr(marginals, positions_within_groups(order, sizes), sizes, stderr_estimator)
    columns = np.cumsum([0, *sizes])
    walked = range(len(groups)) if walked is None else walked
    gaps = [float(mean[columns[t]: columns[t + 1]].sum() - (prefix_utilities[t + 1] - prefix_utilities[t]))
            if t in walked else float("nan") for t in range(len(groups))]
    index = pd.Index(players.tolist(), dtype=object, name="player")
    return ValuationResult(
        method=method,
        values=pd.Series(mean, index=index, name="ads"),
        stderr=pd.Series(stderr, index=index, name="stderr"),
        num_evaluations=num_evaluations,
        groups=tuple(tuple(g.tolist()) for g in groups),
        prefix_utilities=tuple(float(u) for u in prefix_utilities),
        efficiency_gaps=pd.Series(gaps, index=pd.RangeIndex(len(groups), name="group"), name="gap"),
        num_permutations=int(num_permutations),
    )
