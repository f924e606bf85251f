"""fedvalue: contributor accounting for federated learning.

The accounting core: coalition games, Asymmetric Data Shapley (exact and Monte Carlo,
[ADS]) and within-round leave-one-out. Pure numpy/pandas: never imports flwr or ray.
"""

from fedvalue.ads import MAX_EXACT_GROUP_SIZE, AdsSettings, ads, exact_num_coalitions, mc_num_permutations
from fedvalue.game import CoalitionGame
from fedvalue.knn_ads import KnnValuation, knn_ads, knn_shapley
from fedvalue.knn_mc import knn_loo, knn_mc_ads
from fedvalue.knn_utility import KnnUtility
from fedvalue.loo import loo
from fedvalue.result import ValuationResult

__all__ = [
    "MAX_EXACT_GROUP_SIZE",
    "AdsSettings",
    "CoalitionGame",
    "KnnUtility",
    "KnnValuation",
    "ValuationResult",
    "ads",
    "exact_num_coalitions",
    "knn_ads",
    "knn_loo",
    "knn_mc_ads",
    "knn_shapley",
    "loo",
    "mc_num_permutations",
]
