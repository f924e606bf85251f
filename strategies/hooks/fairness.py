"""The strategy's half of the fairness books: what a round asks of the clients, values and
decides when the run keeps a :class:`fedvalue.scoring.fairness.objectives.GroupFairness` objective.

Each round books the round game with U = −gap (``ads_fairness`` / ``loo_fairness``, the
same methods and settings as accuracy) and each valid reply's fairness influence
(:class:`fedvalue.rounds.fairness_round.FairnessPlugin`); with a damping δ the sampled clients also send
their training loss gradient and Fisher diagonal at A_{t−1} (the train config's
``CURVATURE_KEY``) and the influence with curvature is booked too
(:mod:`fedvalue.scoring.fairness.curvature`). A fairness policy (:class:`strategies.policies.acceptance.FairDropK`,
:class:`~strategies.policies.acceptance.FairReweight`) acts on the scores its rule names; I-JACK's
factors reweigh the accepted replies' messages (the live aggregation sees n_u w_u, the books
keep n_u).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ConfigRecord

from fedvalue.rounds.fairness_round import FairnessPlugin, RoundFairness
from fedvalue.run.archive import RoundRecord
from fedvalue.run.settings import FairnessNote
from fedvalue.valuation.round_game import Aggregator, ValuationSettings
from strategies.policies.acceptance import Acceptance
from strategies.protocol import CURVATURE_KEY
from strategies.replies import ClientReply, reweigh

if TYPE_CHECKING:  # torch modules: loaded when a run books fairness
    from fedvalue.scoring.fairness.objectives import GroupFairness


def check_policy(acceptance: Acceptance, fairness: GroupFairness | None, fair_curvature: float | None) -> None:
    """ValueError when ``acceptance`` acts on fairness influences the run does not book."""
    if getattr(acceptance, "needs_fairness", False) and fairness is None:
        raise ValueError(f"fairness: the acceptance policy {acceptance!r} acts on fairness influences; "
                         "pass fairness=GroupFairness(...) (held-out data with a sensitive attribute).")
    score = dict(getattr(acceptance, "rule", {}) or {}).get("score")
    if fair_curvature is None and score is not None and score in _curvature_scores():
        raise ValueError(f"fair_curvature: the acceptance policy {acceptance!r} acts on curvature "
                         "influences; pass fair_curvature=DAMPING (> 0).")


def _curvature_scores() -> tuple[str, ...]:
    from fedvalue.scoring.fairness.curvature import CURVATURE_SCORES

    return CURVATURE_SCORES


class FairnessRounds:
    """The fairness books of one run (module docstring)."""

    def __init__(self, fairness: GroupFairness, fair_curvature: float | None, acceptance: Acceptance) -> None:
        self.fairness = fairness
        self.fair_curvature = fair_curvature
        self.acceptance = acceptance
        # The one computation of the round's fairness books: the audit builds the same plug-in.
        self.plugin = FairnessPlugin(fairness, fair_curvature, self.rule)

    @property
    def rule(self) -> dict | None:
        return getattr(self.acceptance, "rule", None)

    def train_config(self, config: ConfigRecord) -> ConfigRecord:
        """The train config, asking for G_u and d_u when influence with curvature is booked."""
        return config if self.fair_curvature is None else ConfigRecord({**dict(config), CURVATURE_KEY: True})

    def value(self, record: RoundRecord, aggregate: Aggregator | None, valuation: ValuationSettings,
              seed: np.random.Generator) -> RoundFairness:
        """The round game valued on fairness (U = −gap) and each valid reply's fairness
        influence (with curvature from the valid replies that sent G_u and d_u), by the plug-in
        from the round's record, as the audit values it."""
        return self.plugin.value_record(record, methods=valuation.methods, settings=valuation.ads, seed=seed,
                                        aggregate=aggregate)

    def scores(self, books: RoundFairness) -> Mapping[Hashable, float]:
        """The scores the policy's rule acts on (the plug-in's, which the audit recomputes)."""
        return self.plugin.scores(books)

    def reweigh(self, books: RoundFairness, ok: list[ClientReply], accepted: set,
                weighted_by_key: str) -> RoundFairness:
        """With a reweighing rule (I-JACK): the plug-in's factors booked, and each accepted reply's
        message weight multiplied by its factor (the live aggregation sees n_u w_u)."""
        _, books = self.plugin.decide(books)
        if books.factors is not None:
            reweigh(ok, accepted, books.factors, weighted_by_key)
        return books

    def settings_note(self) -> FairnessNote:
        """The round record's note of the fairness books and rule."""
        return FairnessNote(gap=self.fairness.gap, utility_gap=self.fairness.utility_gap,
                            rule=dict(self.rule or {}) or None, damping=self.fair_curvature)

