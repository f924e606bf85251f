"""Valuation results: values per player plus the numbers needed to trust them."""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd


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
        Standard error per player: sample standard deviation of the permutation
        marginals over sqrt(number of permutations) for ``"ads-mc"`` and ``"ads-tmc"``
        (which leaves out truncation's bias), of the independent samples for the
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
    """

    method: str
    values: pd.Series
    stderr: pd.Series
    num_evaluations: int
    groups: tuple[tuple[Hashable, ...], ...]
    prefix_utilities: tuple[float, ...]
    efficiency_gaps: pd.Series
    num_permutations: int | None = None

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
        """One row per player: value, stderr, group, method."""
        frame = pd.DataFrame(
            {
                "value": self.values,
                "stderr": self.stderr,
                "group": self.group_of(),
            }
        )
        frame["method"] = self.method
        frame.index.name = "player"
        return frame


def result_from_marginals(marginals: np.ndarray, players: np.ndarray, groups: Sequence[np.ndarray],
                          prefix_utilities: Sequence[float], *, method: str, num_evaluations: int,
                          walked: Collection[int] | None = None) -> ValuationResult:
    """The result of a permutation sampler from its marginals (one row a permutation, one
    column a player in group order): φ̂ the column means ([ADS] Alg. 1, line 11), their standard
    errors, and each group's efficiency gap Σ_{z∈D_t} φ̂(z) − (v(U_t) − v(U_{t−1})) (NaN for a
    group not ``walked``)."""
    num_permutations, n = marginals.shape
    mean = marginals.mean(axis=0)
    stderr = marginals.std(axis=0, ddof=1) / math.sqrt(num_permutations) if num_permutations > 1 \
        else np.full(n, np.nan)
    columns = np.cumsum([0, *[len(g) for g in groups]])
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
