"""The policies a valuing strategy applies to clients: whom it samples (:mod:`.sampling`,
:mod:`.selection`, :mod:`.greedy_fed`, :mod:`.value_elimination`), whose valued reply it aggregates
and with what weight (:mod:`.acceptance`, :mod:`.value_weighting`) and how it reviews the weights
clients claim (:mod:`.claims`). Each takes the books' values or replies; none talks to Flower, but
:mod:`.power_of_choice`, a Flower strategy that asks clients for their loss before it samples."""

from strategies.policies.acceptance import AcceptAll, Acceptance, FairDropK, FairReweight, Replay, TopK
from strategies.policies.claims import CLAIM_METHODS, ClaimFlag, ClaimReview
from strategies.policies.greedy_fed import GreedyFedSampler
from strategies.policies.power_of_choice import PowerOfChoice
from strategies.policies.representatives import RepresentativesOnly
from strategies.policies.sampling import SCHEDULES, PartitionSampler, ReplaySampler, ValueWeightedSampler
from strategies.policies.value_elimination import ValueEliminationSampler
from strategies.policies.value_weighting import ValueWeighting

__all__ = [
    "CLAIM_METHODS",
    "SCHEDULES",
    "AcceptAll",
    "Acceptance",
    "ClaimFlag",
    "ClaimReview",
    "FairDropK",
    "FairReweight",
    "GreedyFedSampler",
    "PartitionSampler",
    "PowerOfChoice",
    "Replay",
    "ReplaySampler",
    "RepresentativesOnly",
    "TopK",
    "ValueEliminationSampler",
    "ValueWeightedSampler",
    "ValueWeighting",
]
