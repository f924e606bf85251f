"""Flower server strategies that keep contributor books (the only place converting
Flower records to arrays on the server side)."""

from strategies.acceptance import AcceptAll, FairDropK, FairReweight, Replay, TopK
from strategies.claims import ClaimFlag, ClaimReview
from strategies.sampling import PartitionSampler, ValueWeightedSampler
from strategies.selection import ReplaySampler
from strategies.valuing import ValuingStrategy

__all__ = [
    "AcceptAll",
    "ClaimFlag",
    "ClaimReview",
    "FairDropK",
    "FairReweight",
    "PartitionSampler",
    "Replay",
    "ReplaySampler",
    "TopK",
    "ValueWeightedSampler",
    "ValuingStrategy",
]
