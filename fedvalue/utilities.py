"""The torch side's public face: the torch model utility (everything public in
:mod:`fedvalue.scoring.torch_utilities`) and the group-fairness scoring that the fairness
reproductions use ([FAIRINFL], [FAIRIJ]): the binary score model and its weighted risk with their
curvature solvers, the relaxed gaps and the fairness utility, the drop scores, and the NTK and
reweighting modules whole (as ``fairness_ntk`` and ``fairness_reweighting``). Importing it loads
torch. Code inside fedvalue imports the modules, not this one.
"""

from fedvalue.scoring.fairness import ntk as fairness_ntk
from fedvalue.scoring.fairness import reweighting as fairness_reweighting
from fedvalue.scoring.fairness.curvature import drop_scores
from fedvalue.scoring.fairness.ntk import regularized_objective
from fedvalue.scoring.fairness.objectives import GAPS, GroupFairness, gap_of_scores
from fedvalue.scoring.influence_curvature import (
    BinaryScoreModel,
    DiagonalSolver,
    ExactSolver,
    WeightedRisk,
)
from fedvalue.scoring.torch_utilities import (  # noqa: F401
    TorchModelUtility,
    UTILITY_METRICS,
)

__all__ = [
    "GAPS",
    "UTILITY_METRICS",
    "BinaryScoreModel",
    "DiagonalSolver",
    "ExactSolver",
    "GroupFairness",
    "TorchModelUtility",
    "WeightedRisk",
    "drop_scores",
    "fairness_ntk",
    "fairness_reweighting",
    "gap_of_scores",
    "regularized_objective",
]
