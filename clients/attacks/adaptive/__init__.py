"""Adaptive attacks: each knows one defence's threshold (:mod:`fedvalue.rounds.defences`) and stays
just outside it, by ``margin`` in that defence's own units (:mod:`.margin`: its statistic sits at
(1 + margin) × the threshold; 0 on it, > 0 outside it, a negative margin inside it as a control):

- :class:`AdaptiveReplica` (:mod:`.replicas`): K replicas of one update, every two
  (1 + margin) τ apart relative to their norms, past the near-duplicate clusters' τ;
- :class:`AdaptiveReplayer` (:mod:`.replay`): the last global step turned off its line by
  sin θ = (1 + margin) ρ, past the replay test's ρ;
- :class:`AdaptiveShard` (:mod:`.shards`): K identities on overlapping shards, each claim true, the
  claims adding up to (1 + margin) × the participant's size, past what arrivals by size cancel;
- :class:`AdaptiveCraftedUpdate` (:mod:`.crafted`): a crafted update of norm c ‖Δ_h‖ / (1 + margin),
  within the norm cap c.

The thresholds are read from :mod:`fedvalue.rounds.defences.settings` (the norm cap is a run's
setting, passed in). The attack study runs them as ``adaptive-cluster-K@M``, ``adaptive-replay@M``,
``adaptive-split-K@M`` and ``adaptive-crafted@M`` (``simulations/experiments/attacks/plan.py``).
"""

from clients.attacks.adaptive.crafted import AdaptiveCraftedUpdate
from clients.attacks.adaptive.margin import check_margin
from clients.attacks.adaptive.replay import AdaptiveReplayer, rotated_step
from clients.attacks.adaptive.replicas import AdaptiveReplica, simplex_perturbations
from clients.attacks.adaptive.shards import AdaptiveShard, overlapping_shard_indices

__all__ = [
    "AdaptiveCraftedUpdate",
    "AdaptiveReplayer",
    "AdaptiveReplica",
    "AdaptiveShard",
    "check_margin",
    "overlapping_shard_indices",
    "rotated_step",
    "simplex_perturbations",
]
