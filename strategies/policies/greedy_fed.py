"""GreedyFed client selection on the books' within-round Shapley values.

GreedyFed ([GREEDYFED]) selects clients greedily by their estimated, cumulative Shapley value:
the first ⌈N / M⌉ rounds go round-robin through all N clients (each is valued once), then
every round trains the M clients with the largest estimates. A client's estimate is the mean
of the within-round Shapley values it earned in the rounds it trained (GreedyFed computes them
with GTG-Shapley on the server's validation data; here they are the books' within-round ADS,
which with one group of players is the Shapley value of the round game, [ADS] Remark 4.1, or
LOO). With ``memory`` α the estimate is instead the exponential average φ̄ ← α φ̄ + (1 − α) φ_t,
which forgets early rounds (whose values are large while the model is far from converged); the
paper offers such variants of the averaging.

Differences from the paper, by design: the round-robin order is a seeded permutation of the
partition ids (the paper's is the clients' index order), ties are broken by partition id, and a
client that failed in its round-robin round is tried again before the greedy phase uses it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


from fedvalue._checks import check_integer, check_number
from strategies.policies.sampling import available_ids, booked_values, round_robin


class GreedyFedSampler:
    """Round-robin warm start, then the ``clients_per_round`` clients with the largest mean value.

    Parameters
    ----------
    clients_per_round
        M, clients trained per round.
    method
        The ledger method whose values are averaged (``"ads"`` or ``"loo"``).
    memory
        None: the plain mean of a client's values; α in [0, 1): their exponential average.
    seed
        Seed of the round-robin order.
    """

    def __init__(self, clients_per_round: int, *, method: str = "ads", memory: float | None = None,
                 seed: int = 0) -> None:
        self.clients_per_round = check_integer("clients_per_round", clients_per_round)
        if method not in ("ads", "loo"):
            raise ValueError(f"method: expected 'ads' or 'loo'; got {method!r}.")
        self.method = method
        self.memory = check_number("memory", memory, low=0.0, high=1.0, high_open=True, none_ok=True)
        self.seed = int(seed)
        self.estimates: dict[int, float] = {}
        self.counts: dict[int, int] = {}

    def observe(self, ledger_rows) -> None:
        """Take one committed round's ledger rows: update the valued clients' estimates."""
        for client, value in booked_values(ledger_rows, self.method).items():
            count = self.counts.get(client, 0)
            if count == 0:
                estimate = value
            elif self.memory is None:
                estimate = self.estimates[client] + (value - self.estimates[client]) / (count + 1)
            else:
                estimate = self.memory * self.estimates[client] + (1.0 - self.memory) * value
            self.estimates[client], self.counts[client] = estimate, count + 1

    def warm_start_rounds(self, num_clients: int) -> int:
        """⌈N / M⌉: the rounds of the round-robin phase."""
        return math.ceil(num_clients / self.clients_per_round)

    def sample(self, server_round: int, partition_ids: Sequence[int]) -> list[int]:
        ids = available_ids(partition_ids, self.clients_per_round)
        if server_round <= self.warm_start_rounds(len(ids)):
            return round_robin(ids, self.clients_per_round, server_round, self.seed)
        unvalued = [c for c in ids if c not in self.estimates]
        valued = sorted((c for c in ids if c in self.estimates), key=lambda c: (-self.estimates[c], c))
        return sorted((unvalued + valued)[:self.clients_per_round])

    def __repr__(self) -> str:
        return (f"GreedyFedSampler({self.clients_per_round}, method={self.method!r}"
                + ("" if self.memory is None else f", memory={self.memory!r}") + ")")
