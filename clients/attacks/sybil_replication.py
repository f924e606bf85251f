"""Sybil replication: one participant submits its one update under k identities.

Every identity trains on the participant's whole data (full-batch local training is
deterministic, so the replies are equal bit for bit) and claims its full size, so FedAvg weighs
the update k times and each identity is valued as a separate player. With ``noise_std`` each
identity adds its own small Gaussian noise to every floating-point entry: near-duplicates that
an equality check would miss.
"""

from __future__ import annotations

import numpy as np

from clients.behaviours import ClientBehaviour
from fedvalue._checks import check_non_negative


class SybilReplica(ClientBehaviour):
    """One identity of a replicating participant (module docstring).

    Parameters
    ----------
    noise_std
        Standard deviation of the noise added to each entry (from the round's reply generator,
        which differs between identities); 0 replies the trained model itself.
    """

    def __init__(self, noise_std: float = 0.0) -> None:
        self.noise_std = check_non_negative("noise_std", noise_std)

    def transform_reply(self, global_arrays: dict[str, np.ndarray], trained_arrays: dict[str, np.ndarray],
                        num_examples: int, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], int]:
        if self.noise_std == 0:
            return trained_arrays, num_examples
        reply = {}
        for key, value in trained_arrays.items():
            noisy = value.dtype.kind == "f"
            reply[key] = (value + rng.normal(0.0, self.noise_std, size=value.shape)).astype(value.dtype) if noisy \
                else value
        return reply, num_examples
