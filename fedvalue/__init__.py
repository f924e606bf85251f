"""fedvalue: contributor accounting for federated learning.

The accounting core: coalition games, Asymmetric Data Shapley (exact and Monte Carlo,
[ADS]), within-round leave-one-out and the prefix and K-NN estimators; flows of influence between
clients and their reciprocity ([RECIP]); what the books are used for (noisy-client detection and
flagging, top-k retraining, payouts, staged procurement); the run directory's guard and the names
of its files and columns. Importing it loads numpy, pandas and scipy (no torch); the package never
imports flwr or ray. The torch side's face is :mod:`fedvalue.utilities`, the ledger's
:mod:`fedvalue.ledger`. Its subpackages and what each may import: docs/design.md, "The map".
"""

from fedvalue.analysis.detection import detection_curve, detection_metrics, summarize_metrics
from fedvalue.analysis.flagging import FlaggingRule, flagging_rates
from fedvalue.analysis.gains import (
    gains_table,
    honest_cost,
    listed_clients,
    manipulation_gains,
    mean_interval,
    ratio_interval,
    seed_sums,
)
from fedvalue.analysis.payout import paid_share
from fedvalue.analysis.staged_procurement import PURCHASE_RULES, Offer, ProcurementRun, StageOutcome, run_procurement
from fedvalue.analysis.top_k_selection import retrain_plan
from fedvalue.flows.marginal import marginal_flows
from fedvalue.flows.mf_flows import MfTraining, Ratings, mf_fit, mf_flows
from fedvalue.flows.reciprocity_measures import ReciprocityReport, alpha_at, reciprocity, reciprocity_ratio
from fedvalue.flows.round_flows import tracin_round_flows
from fedvalue.run.rundir import MAX_JSON_BYTES, RunDir
from fedvalue.schema import LEDGER_FILE, ROUNDS_FILE, RUN_CONFIG_FILE, VALUATION_METHODS, Method, Status
from fedvalue.valuation.ads import ads
from fedvalue.valuation.settings import COALITION_RULES, EXPANSION_METHODS, AdsSettings, ValuationSettings
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.knn.exact import KnnValuation, knn_ads, knn_shapley
from fedvalue.valuation.knn.monte_carlo import KnnAccuracyPrefixes, KnnLikelihoodPrefixes, knn_loo, knn_mc_ads
from fedvalue.valuation.knn.utility import KnnUtility
from fedvalue.valuation.loo import loo
from fedvalue.valuation.plan import MAX_EXACT_GROUP_SIZE, exact_num_coalitions, mc_num_permutations
from fedvalue.valuation.prefix_mc import prefix_loo, prefix_mc_ads, prefix_values
from fedvalue.valuation.result import ValuationResult
from fedvalue.valuation.round_game import Arrays

__all__ = [
    "COALITION_RULES",
    "EXPANSION_METHODS",
    "LEDGER_FILE",
    "MAX_EXACT_GROUP_SIZE",
    "MAX_JSON_BYTES",
    "PURCHASE_RULES",
    "ROUNDS_FILE",
    "RUN_CONFIG_FILE",
    "VALUATION_METHODS",
    "AdsSettings",
    "Arrays",
    "CoalitionGame",
    "FlaggingRule",
    "KnnAccuracyPrefixes",
    "KnnLikelihoodPrefixes",
    "KnnUtility",
    "KnnValuation",
    "Method",
    "MfTraining",
    "Offer",
    "ProcurementRun",
    "Ratings",
    "ReciprocityReport",
    "RunDir",
    "StageOutcome",
    "Status",
    "ValuationResult",
    "ValuationSettings",
    "ads",
    "alpha_at",
    "detection_curve",
    "detection_metrics",
    "exact_num_coalitions",
    "flagging_rates",
    "gains_table",
    "honest_cost",
    "knn_ads",
    "knn_loo",
    "knn_mc_ads",
    "knn_shapley",
    "listed_clients",
    "loo",
    "manipulation_gains",
    "marginal_flows",
    "mean_interval",
    "mc_num_permutations",
    "mf_fit",
    "mf_flows",
    "paid_share",
    "prefix_loo",
    "prefix_mc_ads",
    "prefix_values",
    "ratio_interval",
    "seed_sums",
    "reciprocity",
    "reciprocity_ratio",
    "retrain_plan",
    "run_procurement",
    "summarize_metrics",
    "tracin_round_flows",
]
