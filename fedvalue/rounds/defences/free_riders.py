"""A free-rider test on updates that reproduce past global models.

A free-rider sends something that costs no training ([FREERIDER]). Three ways:

* **zero update**: it returns the global model it was sent, or that model plus a little noise:
  ‖Δ_i‖ ≤ ε₀ · median_j ‖Δ_j‖ (the median over the round's valid replies);
* **replay** ("delta weights"): it returns A_{t−1} + c (A_{t−1} − A_{t−2}), the last global step
  again (or an older global model, c = −1). With s = A_{t−1} − A_{t−2}, the share of its update
  off that line,

      r_i = ‖Δ_i − (Δ_i·s / ‖s‖²) s‖ / ‖Δ_i‖ = sin∠(Δ_i, s),

  is at most ρ;
* **collusion**: several free-riders each add a perturbation, and the perturbations cancel in
  their weighted mean, so each one alone passes the replay test while together they replay s.
  Among the replies with r_i ≤ ρ₂ (and not already flagged), a group G whose weighted mean
  M = Σ_G n_i Δ_i / Σ_G n_i cancels, r(M) ≤ ρ · min_{i∈G} r_i, is flagged: first all of them,
  then, while that fails, the group without the member whose removal brings r(M) lowest, down
  to two members. Honest updates near the last step also average closer to it, but only as
  independent deviations do (by about 1/√|G|): it takes cancellation, not averaging, to bring
  the mean within ρ of the smallest member's share.

Honest updates are trained on the client's own data at A_{t−1}: their norms are of the
round's order and their directions are not the last step's. What the test cannot see: a
free-rider whose perturbation is large enough to pass as trained, or colluders whose
perturbations do not cancel (then their mean is noise, which the valuation itself charges).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np

ZERO_UPDATE, REPLAY, COLLUSION = "zero-update", "replay", "collusion"


@dataclass(frozen=True)
class FreeRiderFlag:
    """One flagged reply: which test flagged it and the statistic it failed (the norm ratio or r)."""

    client_id: Hashable
    test: str
    score: float


def off_line_share(update: np.ndarray, step: np.ndarray) -> float:
    """r = sin∠(update, step): the share of ``update`` off the line of ``step`` (1.0 for a zero update)."""
    norm = float(np.linalg.norm(update))
    step_norm_sq = float(step @ step)
    if norm == 0.0 or step_norm_sq == 0.0:
        return 1.0
    residual = update - (float(update @ step) / step_norm_sq) * step
    return float(np.linalg.norm(residual)) / norm


def free_rider_flags(updates: Mapping[Hashable, np.ndarray], weights: Mapping[Hashable, float],
                     previous_step: np.ndarray | None, *, zero_tolerance: float | None,
                     replay_tolerance: float | None,
                     collusion_tolerance: float | None) -> dict[Hashable, FreeRiderFlag]:
    """The flagged clients of a round (module docstring), in reply order.

    Parameters
    ----------
    updates
        Client -> flat update Δ_i = w_i − A_{t−1} (float64), valid replies in reply order.
    weights
        Client -> n_i, the weight its reply is aggregated with.
    previous_step
        s = A_{t−1} − A_{t−2}, flat; None in a round without a previous one (the replay and
        collusion tests then flag nothing).
    zero_tolerance, replay_tolerance, collusion_tolerance
        ε₀, ρ, ρ₂ (None: that test is off).
    """
    flags: dict[Hashable, FreeRiderFlag] = {}
    norms = {c: float(np.linalg.norm(u)) for c, u in updates.items()}
    if zero_tolerance is not None and norms:
        median = float(np.median(list(norms.values())))
        for client, norm in norms.items():
            if norm <= zero_tolerance * median:
                flags[client] = FreeRiderFlag(client, ZERO_UPDATE, norm / median if median > 0 else 0.0)
    if previous_step is None or replay_tolerance is None or not float(previous_step @ previous_step) > 0:
        return flags
    shares = {c: off_line_share(u, previous_step) for c, u in updates.items() if c not in flags}
    for client, share in shares.items():
        if share <= replay_tolerance:
            flags[client] = FreeRiderFlag(client, REPLAY, share)
    if collusion_tolerance is not None:
        suspects = [c for c, share in shares.items() if c not in flags and share <= collusion_tolerance]
        for client, share in _colluding_group(suspects, updates, weights, previous_step, replay_tolerance).items():
            flags[client] = FreeRiderFlag(client, COLLUSION, share)
    return {c: flags[c] for c in updates if c in flags}


def _colluding_group(suspects: list, updates: Mapping, weights: Mapping, step: np.ndarray,
                     tolerance: float) -> dict[Hashable, float]:
    """Client -> r of the group's mean, for the group found (empty when none of two or more replays s)."""
    group = list(suspects)
    own = {c: off_line_share(np.asarray(updates[c], dtype=np.float64), step) for c in group}
    while len(group) >= 2:
        share = off_line_share(_weighted_mean(group, updates, weights), step)
        if share <= tolerance * min(own[c] for c in group):
            return {c: share for c in group}
        shares = [off_line_share(_weighted_mean([c for c in group if c != left_out], updates, weights), step)
                  for left_out in group]
        group.pop(int(np.argmin(shares)))  # the first of equal candidates: reply order decides ties
    return {}


def _weighted_mean(group: list, updates: Mapping, weights: Mapping) -> np.ndarray:
    total = float(sum(weights[c] for c in group))
    return sum((weights[c] / total) * np.asarray(updates[c], dtype=np.float64) for c in group)
