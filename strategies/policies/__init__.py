"""The policies a valuing strategy applies to clients: whom it samples (:mod:`.sampling`,
:mod:`.selection`), whose valued reply it aggregates (:mod:`.acceptance`) and how it reviews the
weights clients claim (:mod:`.claims`). Each takes the books' values or replies; none talks to Flower."""

from strategies.policies.acceptance import AcceptAll, Acceptance, FairDropK, FairReweight, Replay, TopK
from strategies.policies.claims import CLAIM_METHODS, ClaimFlag, ClaimReview
from strategies.policies.representatives import RepresentativesOnly
from strategies.policies.sampling import SCHEDULES, PartitionSampler, ValueWeightedSampler
from strategies.policies.selection import ReplaySampler

__all__ = [
    "CLAIM_METHODS",
    "SCHEDULES",
    "AcceptAll",
    "Acceptance",
    "ClaimFlag",
    "ClaimReview",
    "FairDropK",
    "FairReweight",
    "PartitionSampler",
    "Replay",
    "ReplaySampler",
    "RepresentativesOnly",
    "TopK",
    "ValueWeightedSampler",
]
