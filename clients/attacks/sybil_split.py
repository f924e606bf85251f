"""Sybil split: one participant's data spread over k identities.

Each identity trains honestly on its shard and claims the shard's size, so the claims sum to
the participant's size and a claim review sees nothing wrong. Under uniform orders of arrival
(Shapley, within-round ADS) the participant now arrives k times; when the round's updates are
nearly interchangeable it earns about k n / (n + k − 1) of its honest share.
"""

from __future__ import annotations

import numpy as np

from clients.behaviours import ClientBehaviour
from clients.seeding import Seed, as_generator
from fedvalue._checks import check_integer


def shard_indices(num_examples: int, shard: int, shards: int, *, seed: Seed) -> np.ndarray:
    """Row indices of shard ``shard`` of ``shards`` of ``num_examples`` rows: a permutation drawn from
    ``seed`` cut into near-equal consecutive parts (every identity of the participant draws the same)."""
    check_integer("shards", shards)
    check_integer("shard", shard, 0)
    if shard >= shards or num_examples < shards:
        raise ValueError(f"shard, shards: expected shard < shards <= the {num_examples} examples; got shard {shard} "
                         f"of {shards}.")
    return np.sort(np.array_split(as_generator(seed).permutation(num_examples), shards)[shard])


class SybilShard(ClientBehaviour):
    """Identity ``shard`` of ``shards`` of one participant: trains on its shard of the participant's data.

    Parameters
    ----------
    shard, shards
        Which identity, and how many the participant split into (k ≥ 1).
    seed
        The participant's own seed of the split (every identity gets the same).
    """

    def __init__(self, shard: int, shards: int, *, seed: int) -> None:
        self.shard = check_integer("shard", shard, 0)
        self.shards = check_integer("shards", shards)
        self.seed = check_integer("seed", seed, 0)
        if self.shard >= self.shards:
            raise ValueError(f"shard: expected an identity in [0, {self.shards}); got {shard}.")

    def transform_training_data(self, x: np.ndarray, y: np.ndarray,
                                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        rows = shard_indices(len(x), self.shard, self.shards, seed=self.seed)
        return x[rows], y[rows]
