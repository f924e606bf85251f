"""An adaptive replayer: a delta-weights free-rider ([FREERIDER]) whose replayed step is turned off
the line of the last global step by just more than the replay test's threshold ρ
(``REPLAY_TOLERANCE``, :mod:`fedvalue.rounds.defences.free_riders`).

With s = A_{t−1} − A_{t−2} and u a unit vector orthogonal to s (drawn from its seed and the round),
it replies

    A_{t−1} + λ ‖s‖ (cos θ · s / ‖s‖ + sin θ · u),   sin θ = (1 + margin) ρ,

so its update's share off the line of s, r = sin∠(Δ, s), is (1 + margin) ρ exactly (in float64;
the reply is cast to the model's dtype): past the test for margin > 0. It trains nothing then. In a
round without an earlier global model (its first) there is no step to replay; it replies what it
trained there, as the dynamic free-rider's honest round does (a zero update would be flagged as one).
"""

from __future__ import annotations

import math

import numpy as np

from clients.attacks.adaptive.margin import check_margin, float_keys, moved_by
from clients.attacks.memory import RoundAware
from fedvalue._checks import check_integer, check_number, check_positive
from fedvalue.rounds.defences.quotient import flat_update
from fedvalue.rounds.defences.settings import REPLAY_TOLERANCE


def rotated_step(step: np.ndarray, sine: float, rng: np.random.Generator) -> np.ndarray:
    """``step`` turned by the angle θ with sin θ = ``sine`` towards a random direction orthogonal to it."""
    norm = float(np.linalg.norm(step))
    along = step / norm
    other = rng.standard_normal(step.size)
    other -= (other @ along) * along
    other /= float(np.linalg.norm(other))
    return norm * (math.sqrt(1.0 - sine ** 2) * along + sine * other)


class AdaptiveReplayer(RoundAware):
    """Replays the last global step turned (1 + margin) ρ off its line (module docstring).

    Parameters
    ----------
    margin
        Its update's sine to the last global step is (1 + margin) ρ (at most 1).
    scale
        λ > 0, the factor of the replayed step.
    seed
        Seed of the direction it turns towards (with the round).
    tolerance
        ρ, the replay test's threshold it reads (default: the defences' own).
    """

    def __init__(self, margin: float, *, scale: float = 1.0, seed: int = 0,
                 tolerance: float = REPLAY_TOLERANCE) -> None:
        self.margin = check_margin(margin)
        self.scale = check_positive("scale", scale)
        self.seed = check_integer("seed", seed, 0)
        self.tolerance = check_number("tolerance", tolerance, low=0.0, high=1.0, low_open=True)
        if (1 + self.margin) * self.tolerance > 1:
            raise ValueError(f"margin: expected at most 1/ρ − 1 = {1 / self.tolerance - 1:g} (a sine is at most 1; "
                             f"ρ = {self.tolerance}); got {self.margin}.")

    @property
    def sine(self) -> float:
        """sin θ = (1 + margin) ρ, its update's share off the last step's line."""
        return (1 + self.margin) * self.tolerance

    def transform_reply(self, global_arrays, trained_arrays, num_examples, rng):
        previous = self.previous_global
        keys = float_keys(global_arrays)
        step = None if previous is None else flat_update(global_arrays, previous, keys)
        if step is None or not np.any(step):  # nothing to replay: what it trained
            return trained_arrays, num_examples
        turn = np.random.default_rng([self.seed, getattr(self, "server_round", 0)])
        return moved_by(global_arrays, self.scale * rotated_step(step, self.sine, turn), keys,
                        global_arrays), num_examples
