"""Flower server strategies that keep contributor books (the only place converting
Flower records to arrays on the server side)."""

from fedvalue.run.settings import RunSettings
from fedvalue.valuation.ads import AdsSettings
from fedvalue.valuation.round_game import ValuationSettings
from strategies.nodes import NodeDirectory
from strategies.policies import (
    CLAIM_METHODS,
    SCHEDULES,
    AcceptAll,
    Acceptance,
    ClaimFlag,
    ClaimReview,
    FairDropK,
    FairReweight,
    GreedyFedSampler,
    PartitionSampler,
    PowerOfChoice,
    Replay,
    ReplaySampler,
    RepresentativesOnly,
    TopK,
    ValueEliminationSampler,
    ValueWeightedSampler,
    ValueWeighting,
)
from strategies.protocol import LOCAL_LOSS_KEY, SEED_KEY, SERVER_ROUND_KEY, train_config
from strategies.records import arrays_to_numpy, initial_arrays
from strategies.replay import replay_aggregator
from strategies.valuing import ValuingStrategy
from strategies.valuing_settings import BookSettings, IntakeSettings, RunCallbacks
from fedvalue.rounds.defences.settings import DefenceSettings

__all__ = [
    "CLAIM_METHODS",
    "SCHEDULES",
    "LOCAL_LOSS_KEY",
    "SEED_KEY",
    "SERVER_ROUND_KEY",
    "Acceptance",
    "NodeDirectory",
    "arrays_to_numpy",
    "initial_arrays",
    "replay_aggregator",
    "train_config",
    "AcceptAll",
    "AdsSettings",
    "BookSettings",
    "ClaimFlag",
    "ClaimReview",
    "FairDropK",
    "FairReweight",
    "GreedyFedSampler",
    "IntakeSettings",
    "PartitionSampler",
    "PowerOfChoice",
    "Replay",
    "ReplaySampler",
    "RepresentativesOnly",
    "RunCallbacks",
    "RunSettings",
    "TopK",
    "ValuationSettings",
    "ValueEliminationSampler",
    "ValueWeightedSampler",
    "ValueWeighting",
    "ValuingStrategy",
    "DefenceSettings",
]
