"""Attacks on the books as client behaviours, one module an attack: Sybil split
(:mod:`.sybil_split`) and replication (:mod:`.sybil_replication`), the delta-weights free-rider
(:mod:`.delta_weights`), the dynamic free-rider (:mod:`.dynamic_free_rider`), colluding free-riders
(:mod:`.colluding_free_riders`), the ACE-style crafted update (:mod:`.crafted_update`) and the
stale replayer (:mod:`.stale_replay`); the free-riders, the replayer and the crafter remember the
global models they received (:mod:`.memory`). The adaptive attacks (:mod:`.adaptive`) know one
defence's threshold each and stay just outside it, by a ``margin``.

The simpler manipulations (free-rider, inflated count, replicator, sign-flip, boost) are
:mod:`clients.behaviours`."""

from clients.attacks.adaptive import (
    AdaptiveCraftedUpdate,
    AdaptiveReplayer,
    AdaptiveReplica,
    AdaptiveShard,
    overlapping_shard_indices,
)
from clients.attacks.colluding_free_riders import ColludingFreeRider
from clients.attacks.crafted_update import CraftedUpdate
from clients.attacks.delta_weights import DeltaWeightsFreeRider
from clients.attacks.dynamic_free_rider import DynamicFreeRider
from clients.attacks.memory import RoundAware, prepare_round
from clients.attacks.stale_replay import StaleReplayer
from clients.attacks.sybil_replication import SybilReplica
from clients.attacks.sybil_split import SybilShard, shard_indices

__all__ = [
    "AdaptiveCraftedUpdate",
    "AdaptiveReplayer",
    "AdaptiveReplica",
    "AdaptiveShard",
    "ColludingFreeRider",
    "CraftedUpdate",
    "DeltaWeightsFreeRider",
    "DynamicFreeRider",
    "RoundAware",
    "StaleReplayer",
    "SybilReplica",
    "SybilShard",
    "overlapping_shard_indices",
    "prepare_round",
    "shard_indices",
]
