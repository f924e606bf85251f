"""fedvalue: contributor accounting for federated learning.

The accounting core: coalition games, Asymmetric Data Shapley (exact and Monte Carlo,
[ADS]) and within-round leave-one-out. Importing it loads numpy/pandas only
(no torch); the package never imports flwr or ray. Its subpackages and what each may import:
docs/design.md, "The map".
"""

from fedvalue.valuation.ads import AdsSettings, ads

from fedvalue.valuation.plan import MAX_EXACT_GROUP_SIZE, exact_num_coalitions, mc_num_permutations
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.knn.exact import KnnValuation, knn_ads, knn_shapley
from fedvalue.valuation.knn.monte_carlo import knn_loo, knn_mc_ads
from fedvalue.valuation.knn.utility import KnnUtility
from fedvalue.valuation.loo import loo
from fedvalue.valuation.result import ValuationResult

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
