"""The policies a valuing strategy applies to clients: whom it samples and whose valued reply it
aggregates, with what weight. Each takes the books' values or replies; none talks to Flower, but
power_of_choice, a Flower strategy that asks clients for their loss before it samples.

Modules: sampling (the ``Sampler`` interface, seeded and value-weighted sampling, replaying a scored
run's sampling), greedy_fed, value_elimination (value-driven samplers), acceptance (every valid reply,
top-k, replay, the fairness rules), value_weighting, representatives (acceptance policies, each an
:class:`strategies.acceptance_policy.Acceptance`), power_of_choice.

May import: strategies.acceptance_policy, strategies.protocol, strategies.replies, strategies.intake.nodes,
strategies.arrays, strategies.reply_checks (and fedvalue, flwr). No policy imports
the round, the hooks or the strategy.
"""

from strategies.acceptance_policy import AcceptAll
from strategies.policies.acceptance import FairDropK, FairReweight, Replay, TopK
from strategies.policies.greedy_fed import GreedyFedSampler
from strategies.policies.power_of_choice import PowerOfChoice
from strategies.policies.representatives import RepresentativesOnly
from strategies.policies.sampling import (SCHEDULES, ChoosesOwnClients, PartitionSampler, ReplaySampler, Sampler,
                                         ValueWeightedSampler)
from strategies.policies.value_elimination import ValueEliminationSampler
from strategies.policies.value_weighting import ValueWeighting

__all__ = [
    "SCHEDULES", "AcceptAll", "ChoosesOwnClients", "FairDropK", "FairReweight", "GreedyFedSampler", "PartitionSampler",
    "PowerOfChoice",
    "Replay", "ReplaySampler", "RepresentativesOnly", "Sampler", "TopK", "ValueEliminationSampler",
    "ValueWeightedSampler", "ValueWeighting",
]
