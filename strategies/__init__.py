"""Flower server strategies that keep contributor books (the only place converting Flower records to
arrays on the server side): :class:`ValuingStrategy` around any Flower strategy, its settings, the
policies it applies to clients, and the interfaces a new policy or kind of book implements."""

from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.run.seals import Signer
from fedvalue.run.settings import RunSettings
from fedvalue.valuation.settings import AdsSettings, ValuationSettings
from strategies.acceptance_policy import AcceptInputs, Acceptance
from strategies.arrays import arrays_to_numpy, initial_arrays
from strategies.book_settings import BookSettings
from strategies.intake.claims import CLAIM_METHODS, ClaimFlag, ClaimReview
from strategies.hooks.registry import register_round_hook, unregister_round_hook
from strategies.intake.nodes import NodeDirectory
from strategies.policies import (SCHEDULES, AcceptAll, ChoosesOwnClients, FairDropK, FairReweight, GreedyFedSampler,
                                 PartitionSampler, PowerOfChoice, Replay, ReplaySampler, RepresentativesOnly, Sampler,
                                 TopK, ValueEliminationSampler, ValueWeightedSampler, ValueWeighting)
from strategies.round_hook import HookContext, IdleClients, RoundHook, RoundView
from strategies.protocol import LOCAL_LOSS_KEY, SEED_KEY, SERVER_ROUND_KEY, train_config
from strategies.aggregation.counterfactual import aggregates_by_weighted_mean
from strategies.aggregation.reaggregate import replay_aggregator
from strategies.run_state import RunInterrupted
from strategies.valuing import ValuingStrategy
from strategies.valuing_settings import IntakeSettings, RunCallbacks

__all__ = [
    "CLAIM_METHODS", "SCHEDULES", "LOCAL_LOSS_KEY", "SEED_KEY", "SERVER_ROUND_KEY",
    "AcceptAll", "Acceptance", "AcceptInputs", "AdsSettings", "BookSettings", "ChoosesOwnClients", "ClaimFlag",
    "ClaimReview",
    "DefenceSettings", "FairDropK", "FairReweight", "GreedyFedSampler", "HookContext", "IdleClients",
    "IntakeSettings", "NodeDirectory", "PartitionSampler", "PowerOfChoice", "Replay", "ReplaySampler",
    "RepresentativesOnly", "RoundHook", "RoundView", "RunCallbacks", "RunInterrupted", "RunSettings", "Sampler", "Signer",
    "TopK", "ValuationSettings", "ValueEliminationSampler", "ValueWeightedSampler", "ValueWeighting",
    "ValuingStrategy", "aggregates_by_weighted_mean", "arrays_to_numpy", "initial_arrays", "register_round_hook", "replay_aggregator",
    "train_config", "unregister_round_hook",
]
