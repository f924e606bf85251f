"""The policies the benchmark compares, each built from Flower strategies and fedvalue's samplers
and acceptance policies exactly as a user's ServerApp would build it.

==================  =====================================  ================================  ==========
policy              whom it trains                         what it aggregates                valuation
==================  =====================================  ================================  ==========
random              m clients uniformly (seeded)           FedAvg                            none
power-of-choice     the m of d queried with largest loss   FedAvg                            none
greedyfed           round-robin, then top m by mean value  FedAvg                            ADS
value-ucb           the largest upper bounds on values,    FedAvg × max(φ, 0)               ADS
                    clients ruled out by them excepted
value-guard         value-ucb's rule on M − e slots,       FedAvg × the weighting rule      ADS, 2nd
                    e uniformly among all (probation)                                       order, FW
topk-ads            m uniformly                            FedAvg of the top k by ADS        ADS
topk-loo            m uniformly                            FedAvg of the top k by LOO        LOO
value-weighted      m uniformly                            FedAvg × max(φ, 0)               ADS
trimmed-mean        m uniformly                            FedTrimmedAvg(β)                  none
median              m uniformly                            FedMedian                         none
krum                m uniformly                            Krum(f)                           none
oracle              m uniformly among the honest clients   FedAvg                            none
clean (reference)   m uniformly, every client honest       FedAvg                            none
==================  =====================================  ================================  ==========

Power-of-Choice is [POC]'s pow-d, GreedyFed [GREEDYFED]'s rule, the trimmed mean and the median
[ROBUSTSTATS]'s, Krum [KRUM]'s (Flower's implementations of the three); value-ucb is
:class:`strategies.ValueEliminationSampler` (UCB selection) with :class:`strategies.ValueWeighting`
(this project's design, tuned on a seed that is not reported: docs/reproductions.md). value-guard is the
do-no-harm variant: a share of every round explores uniformly among all clients (none is written off),
a client is ruled out only after a probation of valued rounds, and it values by the fixed-weight round
game (a client that returns the model it got is a null player) with the second-order expansion of
that game (no coalition evaluated: the cheapest estimator that ranks like exact ADS there,
docs/results/taylor_agreement.csv). The uniform
samplers share the seed, so in a round they draw the same clients (common random numbers across
policies). A policy pays for the valuation it uses and only for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from flwr.serverapp.strategy import FedMedian, FedTrimmedAvg, Krum, Strategy

from fedvalue import AdsSettings, ValuationSettings
from simulations.runner import fedavg_without_evaluation, skipped_evaluation_unannounced
from strategies import (
    GreedyFedSampler,
    NodeDirectory,
    PartitionSampler,
    PowerOfChoice,
    TopK,
    ValueEliminationSampler,
    ValueWeighting,
)

#: The reference run on the clean federation (every client honest): the targets' 100%.
CLEAN = "clean"


class HonestOnlySampler(PartitionSampler):
    """The oracle's sampler: ``clients_per_round`` uniformly among ``honest`` (seeded as
    :class:`~strategies.PartitionSampler`'s random schedule)."""

    def __init__(self, clients_per_round: int, honest: Sequence[int], *, seed: int = 0) -> None:
        super().__init__(clients_per_round, schedule="random", seed=seed)
        self.honest = sorted(int(c) for c in honest)

    def sample(self, server_round: int, partition_ids: Sequence[int]) -> list[int]:
        connected = {int(p) for p in partition_ids}
        available = [c for c in self.honest if c in connected]
        if self.clients_per_round > len(available):
            raise ValueError(f"clients_per_round: the oracle samples among the {len(available)} honest clients "
                             f"connected; got {self.clients_per_round}.")
        rng = np.random.default_rng([self.seed, server_round])
        return sorted(int(c) for c in rng.choice(available, size=self.clients_per_round, replace=False))


@dataclass
class PolicyParts:
    """What a policy is made of: the inner Flower strategy, the sampler (None: the strategy
    samples itself), the acceptance policy (None: every valid reply) and the valuation it pays for."""

    strategy: Strategy
    sampler: object | None
    acceptance: object | None
    methods: tuple[str, ...]
    #: The policy's own estimator and round game (None: the benchmark's ``ads_method`` and ``coalition_rule``).
    ads_method: str | None = None
    coalition_rule: str | None = None

    def valuation(self, config) -> ValuationSettings:
        ads = AdsSettings(method=self.ads_method or config.ads_method, budget=config.valuation_budget)
        # A policy that values nothing has no round game (the robust aggregators refuse a fixed-weight one).
        rule = (self.coalition_rule or config.coalition_rule) if self.methods else ValuationSettings().coalition_rule
        return ValuationSettings(methods=self.methods, ads=ads, coalition_rule=rule)


def _acceptance_weighting(config, prefix: str = "") -> ValueWeighting:
    """The value weighting of ``config``'s ``weighting_*`` settings (``prefix="guard_"``: value-guard's)."""
    return ValueWeighting("ads", kind=getattr(config, prefix + "weighting_kind"),
                          temperature=getattr(config, prefix + "weighting_temperature"))


def build_policy(name: str, config, seed: int, *, honest: Sequence[int], nodes: NodeDirectory) -> PolicyParts:
    """Policy ``name`` of the table above, for ``config`` and ``seed``; ``honest`` are the honest
    clients (the oracle's knowledge); ``nodes`` is the engine's node directory."""
    m = config.clients_per_round
    uniform = PartitionSampler(m, seed=seed)
    if name in ("random", CLEAN):
        return PolicyParts(fedavg_without_evaluation(), uniform, None, ())
    if name == "oracle":
        return PolicyParts(fedavg_without_evaluation(), HonestOnlySampler(m, honest, seed=seed), None, ())
    if name == "power-of-choice":
        with skipped_evaluation_unannounced():
            strategy = PowerOfChoice(m, config.poc_candidates, seed=seed, nodes=nodes,
                                     query_timeout=config.query_timeout, fraction_evaluate=0.0)
        return PolicyParts(strategy, None, None, ())
    if name == "greedyfed":
        return PolicyParts(fedavg_without_evaluation(), GreedyFedSampler(m, memory=config.greedy_memory, seed=seed),
                           None, ("ads",))
    if name == "value-ucb":
        sampler = ValueEliminationSampler(m, confidence=config.elimination_confidence,
                                          min_rounds=config.elimination_min_rounds,
                                          warm_start=bool(config.elimination_warm_start),
                                          selection=config.elimination_selection, seed=seed)
        acceptance = _acceptance_weighting(config) if config.elimination_acceptance == "value-weighted" else None
        return PolicyParts(fedavg_without_evaluation(), sampler, acceptance, ("ads",))
    if name == "value-guard":
        sampler = ValueEliminationSampler(m, confidence=config.elimination_confidence,
                                          min_rounds=config.guard_min_rounds, selection=config.guard_selection,
                                          explore=config.guard_explore, seed=seed)
        acceptance = None if config.guard_weighting_kind == "none" else _acceptance_weighting(config, "guard_")
        return PolicyParts(fedavg_without_evaluation(), sampler, acceptance, ("ads",),
                           ads_method=config.guard_ads_method, coalition_rule=config.guard_coalition_rule)
    if name in ("topk-ads", "topk-loo"):
        score = name.split("-")[1]
        return PolicyParts(fedavg_without_evaluation(), uniform, TopK(config.topk, score), (score,))
    if name == "value-weighted":
        return PolicyParts(fedavg_without_evaluation(), uniform, _acceptance_weighting(config), ("ads",))
    return PolicyParts(_robust(name, config), uniform, None, ())


def _robust(name: str, config) -> Strategy:
    with skipped_evaluation_unannounced():
        if name == "trimmed-mean":
            return FedTrimmedAvg(fraction_evaluate=0.0, beta=config.trimmed_beta)
        if name == "median":
            return FedMedian(fraction_evaluate=0.0)
        if name == "krum":
            return Krum(fraction_evaluate=0.0, num_malicious_nodes=config.krum_malicious)
    raise ValueError(f"policy: expected one of the benchmark's policies; got {name!r}.")


def ruled_out(parts: PolicyParts) -> frozenset | None:
    """The clients the policy treats as harmful now (its sampler's view), or None for a policy
    without one: the value-ucb sampler's ruled-out clients, GreedyFed's clients with a
    negative mean value."""
    sampler = parts.sampler
    if isinstance(sampler, ValueEliminationSampler):
        return sampler.flagged
    if isinstance(sampler, GreedyFedSampler):
        return frozenset(c for c, v in sampler.estimates.items() if v < 0)
    return None
