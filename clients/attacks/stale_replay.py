"""A stale replayer: it trains nothing and sends back the global model it received ``lag`` rounds
earlier, A_{t−1−lag}, as a client that holds on to an outdated copy of the model would.

Its update, A_{t−1−lag} − A_{t−1}, undoes the federation's last ``lag`` steps; in its first
``lag`` rounds of a run (no model that old received yet) it returns the model it was sent (a
zero update). It claims the example count of the data it holds.
"""

from __future__ import annotations

import numpy as np

from clients.attacks.memory import RoundAware
from fedvalue._checks import check_integer


class StaleReplayer(RoundAware):
    """Replies A_{t−1−lag} (module docstring).

    Parameters
    ----------
    lag
        k ≥ 1, how many rounds old the model it replies is.
    """

    def __init__(self, lag: int = 1) -> None:
        self.lag = check_integer("lag", lag, 1)
        self.history_length = self.lag

    def transform_reply(self, global_arrays, trained_arrays, num_examples, rng):
        past = getattr(self, "past_globals", [])
        stale = past[self.lag - 1] if len(past) >= self.lag else global_arrays
        return {key: np.array(stale[key], copy=True) for key in global_arrays}, num_examples
