"""The delta-weights free-rider ([FREERIDER]): it trains nothing and replays the last global
step, A_{t−1} + λ (A_{t−1} − A_{t−2}), since the global model moves smoothly from round to round.

Without an earlier global model (its first round) it returns A_{t−1} (plain free-riding). It
claims the example count of the data it pretends to hold.
"""

from __future__ import annotations

import numpy as np

from clients.attacks.memory import RoundAware
from fedvalue._checks import check_non_negative, check_number


def replayed_step(global_arrays: dict[str, np.ndarray], previous: dict[str, np.ndarray] | None, scale: float,
                  noise_std: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A_{t−1} + scale (A_{t−1} − A_{t−2}) (+ noise) per floating-point entry, in float64 cast back."""
    reply = {}
    for key, value in global_arrays.items():
        value = np.asarray(value)
        if value.dtype.kind != "f":
            reply[key] = value.copy()
            continue
        start = value.astype(np.float64)
        step = 0.0 if previous is None else start - np.asarray(previous[key], dtype=np.float64)
        moved = start + scale * step
        if noise_std > 0:
            moved = moved + rng.normal(0.0, noise_std, size=value.shape)
        reply[key] = moved.astype(value.dtype)
    return reply


class DeltaWeightsFreeRider(RoundAware):
    """Replies A_{t−1} + ``scale`` (A_{t−1} − A_{t−2}) (module docstring).

    Parameters
    ----------
    scale
        λ, the factor of the replayed step (1: the step itself).
    noise_std
        Gaussian noise added to every entry (a disguise); 0: none.
    """

    def __init__(self, scale: float = 1.0, noise_std: float = 0.0) -> None:
        self.scale = check_number("scale", scale, why="λ of the replayed step")
        self.noise_std = check_non_negative("noise_std", noise_std)

    def transform_reply(self, global_arrays, trained_arrays, num_examples, rng):
        return replayed_step(global_arrays, self.previous_global, self.scale, self.noise_std, rng), num_examples
