"""Score-driven client selection as Flower strategies ([ADS] §6.2, App. C.2).

:class:`TopKSelection` is a :class:`~strategies.ValuingStrategy` that, every round,
lets every sampled client train, values the round, and hands the inner strategy only
the top-k updates by a within-round score: the realized state moves with the accepted
clients, and the ledger books ``selected`` (1/0) per client and round. With
``preset`` it replays a given acceptance per round instead (the paper's retrain
protocol, with :class:`ReplaySampler` replaying the scored run's clients).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from fedvalue.selection import top_k
from strategies.valuing import ValuingStrategy

SCORES = ("ads", "loo", "tracin_outflow", "random")


class TopKSelection(ValuingStrategy):
    """Aggregate only the k best updates of each round by ``score``.

    Parameters
    ----------
    strategy, utility
        As :class:`~strategies.ValuingStrategy`; all its keywords are accepted.
    k
        Updates aggregated per round (all when fewer clients replied).
    score
        ``"ads"`` or ``"loo"`` (must be among ``methods``), ``"tracin_outflow"``
        (needs ``flows=True``: outflow if every reply were aggregated) or ``"random"``
        (seeded by ``seed`` and the round).
    preset
        ``{round: client ids}`` to accept instead of scoring (retrain protocol).
    """

    books_selection = True

    def __init__(self, strategy, utility, *, k: int, score: str = "ads",
                 preset: Mapping[int, Collection] | None = None, **kwargs) -> None:
        super().__init__(strategy, utility, **kwargs)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k: expected a positive integer; got {k!r}.")
        if score not in SCORES:
            raise ValueError(f"score: expected one of {list(SCORES)}; got {score!r}.")
        if preset is None and score in ("ads", "loo") and score not in self.methods:
            raise ValueError(f"score: {score!r} needs methods to include it; methods are {list(self.methods)}.")
        if preset is None and score == "tracin_outflow" and not self.flows:
            raise ValueError("score: 'tracin_outflow' needs flows=True.")
        sampler = kwargs.get("sampler")
        if sampler is not None and getattr(sampler, "clients_per_round", k) < k:
            raise ValueError(f"k: expected at most the {sampler.clients_per_round} clients sampled per round; got {k}.")
        self.k = int(k)
        self.score = score
        self.preset = None if preset is None else {int(t): {str(c) for c in ids} for t, ids in preset.items()}

    def select(self, server_round, ok, valuation, gradients) -> set:
        order = [r.client_id for r in ok]
        if self.preset is not None:
            chosen = self.preset.get(server_round, set())
            return {c for c in order if str(c) in chosen}
        if self.score == "random":
            rng = np.random.default_rng([self.seed, server_round, 1])
            picked = rng.choice(len(order), size=min(self.k, len(order)), replace=False)
            return {order[i] for i in picked}
        if self.score == "tracin_outflow":
            scores = self.outflows_if_all_aggregated(ok, gradients)
        else:
            values = valuation.results[self.score].values
            scores = {c: float(values[c]) for c in order}
        return set(top_k(scores, self.k, order))


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
