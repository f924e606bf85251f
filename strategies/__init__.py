"""Flower server strategies that keep contributor books (the only place converting
Flower records to arrays on the server side)."""

from fedvalue.valuation.ads import AdsSettings
from fedvalue.valuation.round_game import ValuationSettings
from fedvalue.run.writer import RunSettings
from strategies.policies.acceptance import AcceptAll, FairDropK, FairReweight, Replay, TopK
from strategies.policies.claims import ClaimFlag, ClaimReview
from strategies.policies.sampling import PartitionSampler, ValueWeightedSampler
from strategies.policies.selection import ReplaySampler
from strategies.valuing import ValuingStrategy
from strategies.valuing_settings import BookSettings, IntakeSettings

__all__ = [
    "AcceptAll",
    "AdsSettings",
    "BookSettings",
    "ClaimFlag",
    "ClaimReview",
    "FairDropK",
    "FairReweight",
    "IntakeSettings",
    "PartitionSampler",
    "Replay",
    "ReplaySampler",
    "RunSettings",
    "TopK",
    "ValuationSettings",
    "ValueWeightedSampler",
    "ValuingStrategy",
]
