"""An adaptive split: one participant's data over K identities whose shards overlap, so that each
identity's claim is true (it holds exactly the examples it claims) while the claims add up to
(1 + margin) times the participant's size.

Arrivals in proportion to size (:mod:`fedvalue.rounds.defences.random_order`) cancel a split when
the identities' claims add up to the whole: the first of them then arrives when the whole would
have. Overlapping shards keep every claim true and the claim review silent (each identity's
registered size is its shard's), and raise the identities' total rate of arrival to
(1 + margin) n. Shard j is the window of round((1 + margin) n_j) rows (at most n) that starts
where the j-th of K near-equal consecutive parts of a seeded permutation starts, wrapping
around: margin 0 gives the plain split (:func:`clients.attacks.shard_indices`), a margin > 0 puts
each row in one or more shards. Each identity trains honestly on its shard.
"""

from __future__ import annotations

import numpy as np

from clients.attacks.adaptive.margin import check_margin
from clients.behaviours import ClientBehaviour
from clients.seeding import Seed, as_generator
from fedvalue._checks import check_integer


def check_overlap(margin: object, shards: int) -> float:
    """``margin`` for a split into ``shards``: > −1 and at most K − 1 (a shard holds at most the whole)."""
    margin = check_margin(margin)
    if margin > shards - 1:
        raise ValueError(f"margin: expected at most K − 1 = {shards - 1} for K = {shards} identities (a shard holds "
                         f"at most the participant's data); got {margin}.")
    return margin


def overlapping_shard_indices(num_examples: int, shard: int, shards: int, margin: float, *, seed: Seed) -> np.ndarray:
    """Row indices of shard ``shard`` of ``shards`` of ``num_examples`` rows whose sizes add up to
    (1 + ``margin``) × ``num_examples`` up to each shard's rounding (module docstring); sorted, each row once."""
    check_integer("shards", shards)
    check_integer("shard", shard, 0)
    margin = check_overlap(margin, shards)
    if shard >= shards or num_examples < shards:
        raise ValueError(f"shard, shards: expected shard < shards <= the {num_examples} examples; got shard {shard} "
                         f"of {shards}.")
    order = as_generator(seed).permutation(num_examples)
    sizes = [len(part) for part in np.array_split(np.arange(num_examples), shards)]
    start = int(np.sum(sizes[:shard]))
    length = min(num_examples, max(1, int(round((1 + margin) * sizes[shard]))))
    return np.sort(order[(start + np.arange(length)) % num_examples])


class AdaptiveShard(ClientBehaviour):
    """Identity ``shard`` of ``shards`` of one participant whose shards overlap (module docstring).

    Parameters
    ----------
    shard, shards
        Which identity, and K ≥ 1.
    margin
        The identities' claims add up to (1 + margin) × the participant's size (at most K − 1).
    seed
        The participant's own seed of the split (every identity gets the same).
    """

    def __init__(self, shard: int, shards: int, *, margin: float, seed: int) -> None:
        self.shard = check_integer("shard", shard, 0)
        self.shards = check_integer("shards", shards)
        self.margin = check_overlap(margin, self.shards)
        self.seed = check_integer("seed", seed, 0)
        if self.shard >= self.shards:
            raise ValueError(f"shard: expected an identity in [0, {self.shards}); got {shard}.")

    def transform_training_data(self, x, y, rng):
        rows = overlapping_shard_indices(len(x), self.shard, self.shards, self.margin, seed=self.seed)
        return x[rows], y[rows]
