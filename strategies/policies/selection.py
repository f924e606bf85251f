"""Replaying a scored run's sampling: the retrain protocol of [ADS] §6.2, App. C.2.

:class:`ReplaySampler` samples in each round exactly the clients a scored run sampled;
with the acceptance policy :class:`~strategies.policies.acceptance.Replay` of that run's accepted
clients, a retrain starts from the same initial model with only the clients a score kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class ReplaySampler:
    """Samples exactly the clients a scored run sampled in each round (retrain protocol)."""

    def __init__(self, schedule: Mapping[int, Sequence]) -> None:
        if not schedule:
            raise ValueError("schedule: expected {round: client ids} for at least one round; got none.")
        self.schedule = {int(t): sorted(int(c) for c in ids) for t, ids in schedule.items()}
        self.clients_per_round = max(len(ids) for ids in self.schedule.values())

    def sample(self, server_round: int, partition_ids: Sequence[int]) -> list[int]:
        if server_round not in self.schedule:
            raise ValueError(f"server_round: the replayed schedule has rounds {sorted(self.schedule)}; got {server_round}.")
        missing = [c for c in self.schedule[server_round] if c not in set(partition_ids)]
        if missing:
            raise ValueError(f"schedule: round {server_round} replays clients {missing} that are not connected.")
        return list(self.schedule[server_round])
