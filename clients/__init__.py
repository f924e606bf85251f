"""Flower ClientApps: local torch training, scripted client behaviours and the attacks on the
books (:mod:`clients.attacks`); noisy contributors beyond label flips (:mod:`clients.noise`).

Never imports ``simulations`` (simulations imports clients).
"""

from clients.app import ClientData, make_client_app, partition_id_of, train_client
from clients.attacks import (
    AdaptiveCraftedUpdate,
    AdaptiveReplayer,
    AdaptiveReplica,
    AdaptiveShard,
    ColludingFreeRider,
    CraftedUpdate,
    DeltaWeightsFreeRider,
    DynamicFreeRider,
    RoundAware,
    StaleReplayer,
    SybilReplica,
    SybilShard,
    overlapping_shard_indices,
    shard_indices,
)
from clients.behaviours import (
    BoostedUpdate,
    ClientBehaviour,
    FreeRider,
    HonestClient,
    InflatedExampleCount,
    LabelNoise,
    Replicator,
    ScaledUpdate,
    SignFlip,
    flip_labels,
    is_behaviour_reference,
    load_behaviour,
)
from clients.noise import ClassPairSwap, FeatureNoise, NoisyUpdate
from clients.mods import TorchInferenceGradient, ValuationMod, valuation_mod, valuation_query
from clients.training import evaluate_model, get_model_arrays, set_model_arrays, train_locally

__all__ = [
    "BoostedUpdate",
    "ClassPairSwap",
    "FeatureNoise",
    "NoisyUpdate",
    "StaleReplayer",
    "ClientBehaviour",
    "ClientData",
    "FreeRider",
    "HonestClient",
    "InflatedExampleCount",
    "LabelNoise",
    "Replicator",
    "ScaledUpdate",
    "SignFlip",
    "evaluate_model",
    "flip_labels",
    "is_behaviour_reference",
    "load_behaviour",
    "get_model_arrays",
    "make_client_app",
    "set_model_arrays",
    "train_locally",
    "TorchInferenceGradient",
    "ValuationMod",
    "valuation_mod",
    "valuation_query",
    "AdaptiveCraftedUpdate",
    "AdaptiveReplayer",
    "AdaptiveReplica",
    "AdaptiveShard",
    "ColludingFreeRider",
    "CraftedUpdate",
    "DeltaWeightsFreeRider",
    "DynamicFreeRider",
    "RoundAware",
    "SybilReplica",
    "SybilShard",
    "overlapping_shard_indices",
    "partition_id_of",
    "shard_indices",
    "train_client",
]
