"""Flower server strategies that keep contributor books (the only place converting
Flower records to arrays on the server side)."""

from strategies.claims import ClaimFlag, ClaimReview
from strategies.sampling import PartitionSampler, ValueWeightedSampler
from strategies.selection import ReplaySampler, TopKSelection
from strategies.valuing import ValuingStrategy

__all__ = [
    "ClaimFlag",
    "ClaimReview",
    "PartitionSampler",
    "ReplaySampler",
    "TopKSelection",
    "ValueWeightedSampler",
    "ValuingStrategy",
]
