"""Valuation results: values per player plus the numbers needed to trust them."""

from __future__ import annotations

from collections.abc import Hashable
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
