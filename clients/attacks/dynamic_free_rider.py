"""A dynamic free-rider: honest for its first rounds, then a free-rider, so that whatever judges
it by its first rounds (a reputation, a warm-up check) sees an honest client.

It trains and replies honestly in rounds 1..r; from round r + 1 on it replays the last global
step (:mod:`.delta_weights`) or, with ``then="zero"``, returns the global model it was sent.
"""

from __future__ import annotations

from clients.attacks.delta_weights import replayed_step
from clients.attacks.memory import RoundAware
from fedvalue._checks import check_choice, check_integer

THEN = ("delta", "zero")


class DynamicFreeRider(RoundAware):
    """Honest in rounds 1..``honest_rounds``, a free-rider after (module docstring).

    Parameters
    ----------
    honest_rounds
        r ≥ 0, the rounds it trains honestly.
    then
        ``"delta"`` (replay the last global step) or ``"zero"`` (return the global model).
    """

    def __init__(self, honest_rounds: int = 1, then: str = "delta") -> None:
        self.honest_rounds = check_integer("honest_rounds", honest_rounds, 0)
        self.then = str(check_choice("then", then, THEN))

    def free_riding(self) -> bool:
        """Whether it free-rides in the current round."""
        return getattr(self, "server_round", 0) > self.honest_rounds

    def transform_reply(self, global_arrays, trained_arrays, num_examples, rng):
        if not self.free_riding():
            return trained_arrays, num_examples
        scale = 1.0 if self.then == "delta" else 0.0
        return replayed_step(global_arrays, self.previous_global, scale, 0.0, rng), num_examples
