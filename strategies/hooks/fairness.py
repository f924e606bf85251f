"""The strategy's half of the fairness books, the hook of :mod:`fedvalue.rounds.kinds.fairness`: what
a round asks of the clients, values and decides when the run keeps a
:class:`fedvalue.scoring.fairness.objectives.GroupFairness` objective.

Each round books the round game with U = −gap (``ads_fairness`` / ``loo_fairness``, the
same methods and settings as accuracy) and each valid reply's fairness influence
(:class:`fedvalue.rounds.fairness_round.FairnessPlugin`, from the round record, as the audit values
it); with a damping δ the sampled clients also send their training loss gradient and Fisher
diagonal at A_{t−1} (the train config's ``CURVATURE_KEY``) and the influence with curvature is
booked too (:mod:`fedvalue.scoring.fairness.curvature`). A fairness policy
(:class:`strategies.policies.acceptance.FairDropK`, :class:`~strategies.policies.acceptance.FairReweight`)
acts on the scores its rule names (the hook's offer ``"fairness"``); I-JACK's factors reweigh the
accepted replies' messages (the live aggregation sees n_u w_u, the books keep n_u).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from flwr.app import ConfigRecord

from fedvalue.rounds.fairness_round import FairnessPlugin, RoundFairness
from fedvalue.run.settings import FairnessNote
from strategies.round_hook import HookContext, RoundHook, RoundView
from strategies.acceptance_policy import FAIRNESS, Acceptance
from strategies.protocol import CURVATURE_KEY

if TYPE_CHECKING:  # torch modules: loaded when a run books fairness
    from fedvalue.scoring.fairness.objectives import GroupFairness


def check_policy(acceptance: Acceptance, fair_curvature: float | None) -> None:
    """ValueError when ``acceptance``'s fairness rule acts on curvature influences the run does not book."""
    score = dict(acceptance.fairness_rule or {}).get("score")
    if fair_curvature is None and score is not None and score in _curvature_scores():
        raise ValueError(f"fair_curvature: the acceptance policy {acceptance!r} acts on curvature "
                         "influences; pass fair_curvature=DAMPING (> 0).")


def _curvature_scores() -> tuple[str, ...]:
    from fedvalue.scoring.fairness.curvature import CURVATURE_SCORES

    return CURVATURE_SCORES


class FairnessHook(RoundHook):
    """The fairness books of one run (module docstring), by the policy's fairness ``rule`` (None: none)."""

    offers = frozenset({FAIRNESS})

    def __init__(self, fairness: GroupFairness, fair_curvature: float | None, rule: Mapping | None) -> None:
        self.fairness = fairness
        self.fair_curvature = fair_curvature
        # The one computation of the round's fairness books: the audit builds the same plug-in.
        self.plugin = FairnessPlugin(fairness, fair_curvature, rule)

    def settings(self) -> dict:
        """The round settings' note of the fairness books and rule."""
        rule = self.plugin.rule
        return {"fairness": FairnessNote(gap=self.fairness.gap, utility_gap=self.fairness.utility_gap,
                                         rule=dict(rule or {}) or None, damping=self.fair_curvature)}

    def train_config(self, config: ConfigRecord) -> ConfigRecord:
        """The train config, asking for G_u and d_u when influence with curvature is booked."""
        return config if self.fair_curvature is None else ConfigRecord({**dict(config), CURVATURE_KEY: True})

    def inputs(self, round: RoundView) -> RoundFairness:
        """The round game valued on fairness (U = −gap) and each valid reply's fairness influence
        (with curvature from the valid replies that sent G_u and d_u), by the plug-in from the
        round's record, as the audit values it."""
        return self.plugin.value_record(round.record, seed=round.rng(), aggregate=round.aggregator)

    def offer(self, round: RoundView, inputs: RoundFairness) -> dict:
        """The scores the policy's rule acts on (the plug-in's, which the audit recomputes)."""
        return {FAIRNESS: lambda: self.plugin.scores(inputs)}

    def factors(self, round: RoundView, accepted: set, inputs: RoundFairness) -> tuple[RoundFairness, Mapping | None]:
        """With a reweighing rule (I-JACK): the plug-in's factors, booked and multiplying each
        accepted reply's weight."""
        _, books = self.plugin.decide(inputs)
        return books, books.factors


def fairness_hook(context: HookContext) -> FairnessHook | None:
    """The run's fairness hook (None without a fairness objective); ValueError when the policy acts on
    fairness scores the run does not book."""
    books, acceptance = context.books, context.acceptance
    if books.fairness is None:
        return None
    check_policy(acceptance, books.fair_curvature)
    return FairnessHook(books.fairness, books.fair_curvature, acceptance.fairness_rule)
