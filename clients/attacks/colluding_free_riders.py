"""k colluding free-riders: each replays the last global step with a perturbation of its own,
and the perturbations cancel in their FedAvg-weighted mean.

Member j replies A_{t−1} + s + ν_j with s = A_{t−1} − A_{t−2} and

    ν_j = spread · ‖s‖ · (z_j − Σ_k n_k z_k / Σ_k n_k),   z_k ~ N(0, I/d) drawn from a shared secret,

so Σ_j n_j ν_j = 0: together they move the model exactly as one delta-weights free-rider would
(no harm to accuracy to give them away), while no member's reply is a replay, a zero update or
a near-duplicate of another's. All members draw the same z from ``[secret, round]`` (they agreed
on the secret and on each other's claimed counts beforehand).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clients.attacks.memory import RoundAware
from fedvalue._checks import check_integer, check_non_negative


class ColludingFreeRider(RoundAware):
    """Member ``member`` of a ring of colluding free-riders (module docstring).

    Parameters
    ----------
    member
        Its position in the ring.
    counts
        The example count every member claims, in ring order (the weights the perturbations cancel under).
    spread
        The perturbation's size relative to the replayed step.
    secret
        The ring's shared seed.
    """

    def __init__(self, member: int, counts: Sequence[int], *, spread: float = 0.3, secret: int = 0) -> None:
        self.counts = tuple(check_integer(f"counts[{k}]", c) for k, c in enumerate(counts))
        if len(self.counts) < 2:
            raise ValueError(f"counts: expected the counts of a ring of at least 2 members; got {list(counts)}.")
        self.member = check_integer("member", member, 0)
        if self.member >= len(self.counts):
            raise ValueError(f"member: expected a position in [0, {len(self.counts)}); got {member}.")
        self.spread = check_non_negative("spread", spread)
        self.secret = check_integer("secret", secret, 0)

    def perturbation(self, step: np.ndarray) -> np.ndarray:
        """ν of this member for the flat step ``step`` (float64)."""
        rng = np.random.default_rng([self.secret, getattr(self, "server_round", 0)])
        z = rng.normal(0.0, 1.0 / np.sqrt(max(step.size, 1)), size=(len(self.counts), step.size))
        weights = np.asarray(self.counts, dtype=np.float64)
        centred = z[self.member] - weights @ z / weights.sum()
        return self.spread * float(np.linalg.norm(step)) * centred

    def transform_reply(self, global_arrays, trained_arrays, num_examples, rng):
        keys = [k for k, v in global_arrays.items() if np.asarray(v).dtype.kind == "f"]
        previous = self.previous_global
        step = np.concatenate([(np.asarray(global_arrays[k], np.float64) - (np.asarray(previous[k], np.float64)
                                if previous is not None else np.asarray(global_arrays[k], np.float64))).ravel()
                               for k in keys]) if keys else np.zeros(0)
        moved = step + self.perturbation(step)
        reply, offset = {}, 0
        for key, value in global_arrays.items():
            value = np.asarray(value)
            if key not in keys:
                reply[key] = value.copy()
                continue
            part = moved[offset:offset + value.size].reshape(value.shape)
            reply[key] = (value.astype(np.float64) + part).astype(value.dtype)
            offset += value.size
        return reply, self.counts[self.member]
