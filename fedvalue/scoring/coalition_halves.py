"""Coalition coefficient rows factored over two halves of the basis.

A FedAvg coalition S ⊆ I_t is the row C[c, k] = n_k / Σ_{j∈S} n_j over the basis
(A_{t−1}, w_1, ..., w_n). Split the basis columns into a left range L and a right range R;
every row with non-negative coefficients is

    C[c] = a_c · u_{l(c)} + b_c · v_{r(c)},    a_c = Σ_{k∈L} C[c, k],   b_c = Σ_{k∈R} C[c, k],

with u_l (v_r) the row's left (right) part divided by its sum. For FedAvg rows u_l
depends only on S ∩ L (u_l[k] = n_k / Σ_{j∈S∩L} n_j), so a batch holding all 2^n
coalitions has at most 2^|L| left and 2^|R| right directions, against 2^n rows: any
quantity linear in the state (a first layer's output) is then a·P_l + b·Q_r from
2^|L| + 2^|R| precomputed combinations, one two-term sum per row instead of a K-term one.
Used by :class:`fedvalue.scoring.linear.LinearStates` for exact enumeration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Directions that agree to this many decimals are one direction (FedAvg rows of the same
#: S ∩ L differ only by float64 rounding of the normalization, ~1e-16).
DECIMALS = 12


@dataclass(frozen=True)
class Half:
    """One half of the columns: ``columns`` (a slice of the basis), its distinct
    directions (rows over those columns, each summing to 1), each row's direction
    (``of``, −1 where the row's part is zero) and the row's part sum (``sums``)."""

    columns: slice
    directions: np.ndarray
    of: np.ndarray
    sums: np.ndarray


@dataclass(frozen=True)
class Halves:
    """Rows factored as C[c] = left.sums[c] · u_{left.of[c]} + right.sums[c] · v_{right.of[c]}."""

    left: Half
    right: Half

    def rebuilt(self, num_columns: int) -> np.ndarray:
        """The rows the factors stand for (for checks)."""
        rows = np.zeros((len(self.left.of), num_columns))
        for half in (self.left, self.right):
            present = half.of >= 0
            rows[present, half.columns] += half.sums[present, None] * half.directions[half.of[present]]
        return rows


def _half(rows: np.ndarray, columns: slice) -> Half:
    part = rows[:, columns]
    sums = part.sum(axis=1)
    present = sums > 0
    directions, inverse = np.unique(
        np.round(part[present] / sums[present, None], DECIMALS), axis=0, return_inverse=True
    )
    of = np.full(len(rows), -1, dtype=np.int64)
    of[present] = inverse.reshape(-1)
    return Half(columns, directions, of, sums)


def split_rows(rows: np.ndarray, max_left: int) -> Halves | None:
    """Factor ``rows`` (states × K, non-negative) over a left and a right column range.

    The columns used by some row are cut in two at the middle, or further left while the
    left half has more than ``max_left`` directions (the caller keeps one precomputed
    combination per left direction); None when a coefficient is negative, fewer than two
    columns are used, a row is all zeros, or no cut keeps the left half within ``max_left``.
    """
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or len(rows) == 0 or (rows < 0).any() or not rows.any(axis=1).all():
        return None
    used = np.flatnonzero((rows != 0).any(axis=0))
    if len(used) < 2:
        return None
    for cut in range(len(used) // 2, 0, -1):
        left = _half(rows, slice(int(used[0]), int(used[cut])))
        if len(left.directions) <= max_left:
            return Halves(left, _half(rows, slice(int(used[cut]), int(used[-1]) + 1)))
    return None
