"""Seeded client sampling by partition id (Flower's own sampler uses the global
``random`` over random node ids and is not reproducible)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
from flwr.app import Message
from flwr.supercore.logger import log

from fedvalue._checks import check_choice, check_integer, check_positive
from fedvalue.analysis.flagging import FlaggingRule
from fedvalue.schema import LedgerRow, Status

SCHEDULES = ("random", "even")


def available_ids(partition_ids: Sequence[int], clients_per_round: int) -> list[int]:
    """The available partition ids, sorted; a ValueError naming ``clients_per_round`` when
    fewer than that many are available."""
    ids = sorted(int(c) for c in partition_ids)
    if clients_per_round > len(ids):
        raise ValueError(f"clients_per_round: expected at most the {len(ids)} available clients; got "
                         f"{clients_per_round}.")
    return ids


def round_robin(ids: Sequence[int], clients_per_round: int, server_round: int, seed: int) -> list[int]:
    """Round ``server_round``'s block of a seeded permutation of ``ids``, wrapping around: the
    round-robin warm start of [GREEDYFED], which values every client once in ⌈N / M⌉ rounds."""
    order = np.random.default_rng([seed, 0x6EED]).permutation(list(ids)).tolist()
    start = (server_round - 1) * clients_per_round
    return sorted(int(order[(start + k) % len(order)]) for k in range(clients_per_round))


def booked_values(ledger_rows: Sequence[LedgerRow], method: str) -> dict[int, float]:
    """client id -> value of the rows of ``method`` that booked one (status ok), in row order."""
    return {int(row.client_id): float(row.value) for row in ledger_rows
            if row.method == method and row.status == Status.OK and row.value is not None}


@runtime_checkable
class Sampler(Protocol):
    """Chooses each round's clients by partition id (what ValuingStrategy's ``sampler`` is)."""

    clients_per_round: int

    def sample(self, server_round: int, partition_ids: Sequence[int]) -> list[int]:
        """The partition ids to train in ``server_round``, out of those connected."""


@runtime_checkable
class LearningSampler(Protocol):
    """A sampler that also reads each round's ledger rows (value-weighted sampling)."""

    def observe(self, ledger_rows: Sequence[LedgerRow]) -> None:
        """Take in one committed round's ledger rows."""


class PartitionSampler:
    """Chooses the partition ids that train in each round.

    Parameters
    ----------
    clients_per_round
        Clients sampled per round.
    schedule
        ``"random"``: a fresh uniform sample without replacement every round.
        ``"even"``: every client once per pass, as [ADS] App. C.2 (30 clients
        partitioned evenly across 5 rounds): a seeded permutation of all partitions is
        cut into consecutive blocks of ``clients_per_round``; after a full pass a new
        permutation starts.
    seed
        Seed of the sampler's generator; round t's draw depends only on (seed, t).
    """

    def __init__(self, clients_per_round: int, *, schedule: str = "random", seed: int = 0) -> None:
        check_integer("clients_per_round", clients_per_round)
        check_choice("schedule", schedule, SCHEDULES)
        self.clients_per_round = int(clients_per_round)
        self.schedule = schedule
        self.seed = int(seed)

    def sample(self, server_round: int, partition_ids: Sequence[int]) -> list[int]:
        """Partition ids for ``server_round`` (1-based), sorted for a stable reply order."""
        ids = np.array(available_ids(partition_ids, self.clients_per_round))
        if self.schedule == "random":
            rng = np.random.default_rng([self.seed, server_round])
            chosen = rng.choice(ids, size=self.clients_per_round, replace=False)
        else:
            blocks_per_pass = len(ids) // self.clients_per_round
            pass_index, block = divmod(server_round - 1, blocks_per_pass)
            order = np.random.default_rng([self.seed, pass_index]).permutation(ids)
            chosen = order[block * self.clients_per_round : (block + 1) * self.clients_per_round]
        return sorted(int(c) for c in chosen)


class ValueWeightedSampler:
    """Samples future rounds by accumulated value, so low-value clients stop costing training.

    After each round the wrapper calls :meth:`observe` with that round's ledger rows;
    client i's accumulated value Φ_i is the sum of its ``method`` values so far. Round
    t samples ``clients_per_round`` clients without replacement with probability
    ∝ exp((Φ_i − max Φ) / temperature); clients never sampled get the largest Φ seen
    (optimism: an untried client is drawn as readily as the best tried one, though not
    necessarily before it). Clients flagged by
    ``flagging`` (an online :class:`~fedvalue.analysis.flagging.FlaggingRule` fed the same rows)
    or returned by ``exclude()`` are not sampled while enough others remain.

    Parameters
    ----------
    clients_per_round
        Clients sampled per round.
    method
        Ledger method whose values accumulate (``"ads"``, ``"loo"``, ``"tracin_outflow"``).
    temperature
        Softness of the preference (> 0); large is uniform, small is greedy.
    exclude
        Callable returning client ids not to sample.
    flagging
        A :class:`~fedvalue.analysis.flagging.FlaggingRule` the sampler feeds every round's rows;
        the clients it flags are excluded from then on (its ``flagged`` set is read live).
    seed
        Seed; round t's draw depends on (seed, t) and the values observed.
    """

    def __init__(self, clients_per_round: int, *, method: str = "ads", temperature: float = 0.05,
                 exclude=None, flagging: FlaggingRule | None = None, seed: int = 0) -> None:
        check_integer("clients_per_round", clients_per_round)
        check_positive("temperature", temperature)
        if exclude is not None and not callable(exclude):
            raise TypeError(f"exclude: expected a callable returning client ids; got {type(exclude).__name__}.")
        if flagging is not None and not isinstance(flagging, FlaggingRule):
            raise TypeError(f"flagging: expected a fedvalue.analysis.flagging.FlaggingRule; got {type(flagging).__name__}.")
        self.clients_per_round = int(clients_per_round)
        self.method = method
        self.temperature = float(temperature)
        self.exclude = exclude
        self.flagging = flagging
        self.seed = int(seed)
        self.totals: dict[int, float] = {}

    def observe(self, ledger_rows) -> None:
        """Accumulate one round's ledger rows (only this method's booked values count)."""
        ledger_rows = list(ledger_rows)
        if self.flagging is not None:
            self.flagging.update(ledger_rows)
        for client, value in booked_values(ledger_rows, self.method).items():
            self.totals[client] = self.totals.get(client, 0.0) + value

    def sample(self, server_round: int, partition_ids: Sequence[int]) -> list[int]:
        ids = available_ids(partition_ids, self.clients_per_round)
        excluded = set() if self.exclude is None else {int(c) for c in self.exclude()}
        if self.flagging is not None:
            excluded |= {int(c) for c in self.flagging.flagged}
        allowed = [c for c in ids if c not in excluded]
        if len(allowed) < self.clients_per_round:  # never starve a round: fall back to everyone
            allowed = ids
        best = max(self.totals.values(), default=0.0)
        values = np.array([self.totals.get(c, best) for c in allowed])
        weights = np.exp((values - values.max()) / self.temperature)
        rng = np.random.default_rng([self.seed, server_round])
        chosen = rng.choice(allowed, size=self.clients_per_round, replace=False, p=weights / weights.sum())
        return sorted(int(c) for c in chosen)


# Replaying a scored run's sampling: the retrain protocol of [ADS] §6.2, App. C.2. With the acceptance
# policy Replay of that run's accepted clients, a retrain starts from the same initial model with only
# the clients a score kept.

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

class ChoosesOwnClients:
    """A Flower strategy that chooses which clients train from what it learns of them (Power-of-Choice
    from its candidates' losses). A sampler would send its round elsewhere and void that choice (while
    it still paid for its queries), so :func:`check_sampler` refuses one beside it and ``simulate()``
    gives it none."""


def check_sampler(strategy: object, sampler: Sampler | None) -> Sampler | None:
    """``sampler``, or a ValueError naming it when the inner ``strategy`` chooses its own clients."""
    if sampler is not None and isinstance(strategy, ChoosesOwnClients):
        raise ValueError(f"sampler: expected None with {type(strategy).__name__}, which chooses its own clients (a "
                         f"sampler would send its rounds elsewhere); got a {type(sampler).__name__}.")
    return sampler


def retarget(messages: list[Message], sampler: Sampler, server_round: int, partitions: Mapping[int, int],
             registered: Mapping[int, int]) -> tuple[list[Message], list[int] | None]:
    """(the inner strategy's train messages sent to the clients ``sampler`` picks instead, the first
    message's content, type and group to each picked client's node; the partitions it chose from
    when some ``registered`` ones have no connected node, else None: the round record notes them).
    RuntimeError when fewer partitions have a connected node than the sampler takes a round."""
    wanted = sampler.clients_per_round
    if isinstance(wanted, int) and len(partitions) < wanted:
        gone = sorted(set(registered) - set(partitions))
        raise RuntimeError(f"sampler: round {server_round} needs {wanted} clients, but only {len(partitions)} of the "
                           f"{len(registered)} registered partitions have a connected node (gone: {gone}); the run "
                           "stops here with every earlier round committed: resume it once the nodes are back.")
    chosen = sampler.sample(server_round, list(partitions))
    # The inner strategy has logged its own 'Sampled N nodes'; say which clients get the round instead.
    log(logging.INFO, "fedvalue: round %s: %s sends the round to %d of %d clients, partitions %s, in place of the "
        "%d nodes the inner strategy sampled", server_round, type(sampler).__name__, len(chosen), len(partitions),
        sorted(int(c) for c in chosen), len(messages))
    template = messages[0]
    retargeted = [Message(content=template.content, dst_node_id=partitions[client_id],
                          message_type=template.metadata.message_type, group_id=template.metadata.group_id or None)
                  for client_id in chosen]
    return retargeted, None if len(partitions) == len(registered) else sorted(partitions)
