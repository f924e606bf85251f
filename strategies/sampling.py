"""Seeded client sampling by partition id (Flower's own sampler uses the global
``random`` over random node ids and is not reproducible)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SCHEDULES = ("random", "even")


class PartitionSampler:
    """Chooses the partition ids that train in each round.

    Parameters
    ----------
    clients_per_round
        Clients sampled per round.
    schedule
        ``"random"``: a fresh uniform sample without replacement every round.
        ``"even"``: every client once per pass, as seed 004 App. C.2 (30 clients
        partitioned evenly across 5 rounds): a seeded permutation of all partitions is
        cut into consecutive blocks of ``clients_per_round``; after a full pass a new
        permutation starts.
    seed
        Seed of the sampler's generator; round t's draw depends only on (seed, t).
    """

    def __init__(self, clients_per_round: int, *, schedule: str = "random", seed: int = 0) -> None:
        if isinstance(clients_per_round, bool) or not isinstance(clients_per_round, (int, np.integer)) or clients_per_round < 1:
            raise ValueError(f"clients_per_round: expected a positive integer; got {clients_per_round!r}.")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {list(SCHEDULES)}; got {schedule!r}.")
        self.clients_per_round = int(clients_per_round)
        self.schedule = schedule
        self.seed = int(seed)

    def sample(self, server_round: int, partition_ids: Sequence[int]) -> list[int]:
        """Partition ids for ``server_round`` (1-based), sorted for a stable reply order."""
        ids = np.array(sorted(partition_ids))
        if self.clients_per_round > len(ids):
            raise ValueError(
                f"clients_per_round: expected at most the {len(ids)} available clients; got "
                f"{self.clients_per_round}."
            )
        if self.schedule == "random":
            rng = np.random.default_rng([self.seed, server_round])
            chosen = rng.choice(ids, size=self.clients_per_round, replace=False)
        else:
            blocks_per_pass = len(ids) // self.clients_per_round
            pass_index, block = divmod(server_round - 1, blocks_per_pass)
            order = np.random.default_rng([self.seed, pass_index]).permutation(ids)
            chosen = order[block * self.clients_per_round : (block + 1) * self.clients_per_round]
        return sorted(int(c) for c in chosen)
