"""fedvalue: contributor accounting for federated learning.

The accounting core: coalition games, Asymmetric Data Shapley (exact and Monte Carlo,
[ADS]) and within-round leave-one-out. Pure numpy/pandas: never imports flwr or ray.
"""

from fedvalue.ads import MAX_EXACT_GROUP_SIZE, ads, exact_num_coalitions, mc_num_permutations
from fedvalue.game import CoalitionGame
from fedvalue.loo import loo
from fedvalue.result import ValuationResult

__all__ = [
    "MAX_EXACT_GROUP_SIZE",
    "CoalitionGame",
    "ValuationResult",
    "ads",
    "exact_num_coalitions",
    "loo",
    "mc_num_permutations",
]
