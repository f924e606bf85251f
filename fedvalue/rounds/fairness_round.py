"""A round's fairness books: the round game valued on fairness, and each client's influence.

With a :class:`~fedvalue.scoring.fairness.objectives.GroupFairness` objective F on held-out data, a round adds,
per valid reply u (the ``ok`` clients, FedAvg weights p_u = n_u / Σ_ok n):

* ``ads_fairness`` / ``loo_fairness``: within-round ADS and LOO ([ADS] Remark 4.1, App. C.2)
  of the round game with U = −F (:func:`fedvalue.valuation.round_game.value_round`, same settings and
  seed as the accuracy game), so Σ_u φ^F_t(u) = −F(Agg(I_t)) + F(A_{t−1});
* ``fairness_influence``: I^F_t(u) = ∇F(A_{t−1}) · (p_u Δ_u) (:mod:`fedvalue.scoring.fairness.objectives`), as if
  every valid reply made the step: the score the fairness-aware policies act on;
* ``fair_weight``: under I-JACK reweighting, the factor w_u that multiplied u's weight
  ([FAIRIJ] Prop. 3.2);
* with the clients' loss gradients and Fisher diagonals (:mod:`fedvalue.scoring.fairness.curvature`),
  ``fairness_influence_curvature`` I^H_t(u) and ``fairness_weight_derivative``, its
  FedAvg-renormalized derivative (booked by :mod:`fedvalue.rounds.kinds.fairness_curvature`).

A drop rule acts on one of :data:`fedvalue.scoring.fairness.curvature.SCORES` (``rule["score"]``,
first-order by default): the first-order influence, its renormalized derivative, the
curvature one, or the exact drop effect −loo_fairness.

The writer (the valuing strategy) and the audit both build these with one :class:`FairnessPlugin`:
the same valuation, scores, accepted clients and factors from the same round data.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from fedvalue.rounds.record_game import valid_clients
from fedvalue.run.archive import RoundRecord
from fedvalue.valuation.settings import RENORMALIZED, AdsSettings
from fedvalue.valuation.round_game import Aggregator, RoundValuation, round_game_for, value_round
from fedvalue.schema import Method

if TYPE_CHECKING:
    from fedvalue.scoring.fairness.objectives import GroupFairness
# The scoring modules run on torch: imported where a round is scored, so that the books (and the
# Flower adapter above them) load without torch until fairness is booked.

#: The fairness-aware aggregation rules a run can record (see :func:`policy_outcome`).
FAIR_RULES = ("drop-k", "ijack")


@dataclass(frozen=True)
class RoundFairness:
    """What a round books on fairness.

    Attributes
    ----------
    valuation
        The round game with U = −F over the valid replies (None when none replied usably).
    influences
        Client -> I^F_t(u), valid replies only.
    utility
        The objective (for the harms of rejected replies).
    factors
        Client -> I-JACK factor w_u, when the round was reweighted; None otherwise.
    weights
        Client -> n_u of the valid replies (FedAvg's weights before renormalization).
    curvature
        Client -> I^H_t(u), when the clients sent loss gradients and Fisher diagonals; None otherwise.
    """

    valuation: RoundValuation | None
    influences: Mapping[Hashable, float]
    utility: GroupFairness
    factors: Mapping[Hashable, float] | None = None
    weights: Mapping[Hashable, float] | None = None
    curvature: Mapping[Hashable, float] | None = None

    def scores(self, score: str = "first-order") -> dict[Hashable, float]:
        """Client -> how much it raises the gap by ``score`` (:func:`fedvalue.scoring.fairness.curvature.drop_scores`)."""
        from fedvalue.scoring.fairness.curvature import drop_scores

        loo = None
        if self.valuation is not None and Method.LOO in self.valuation.results:
            values = self.valuation.results[Method.LOO].values
            loo = {c: float(values[c]) for c in self.influences}
        return drop_scores(score, influences=self.influences, weights=self.weights or {}, curvature=self.curvature,
                           loo_fairness=loo)


class FairnessPlugin:
    """The fairness books of a run's rounds, computed in one place: what the live strategy
    values and decides with, what the fairness book kinds book, and what the audit recomputes
    from a round record (:mod:`fedvalue.rounds.kinds.fairness`, [FAIRINFL], [FAIRIJ]).

    Built from the run's objective F, the curvature damping δ (None: no curvature books) and
    the recorded acceptance rule (None: every valid reply, no factors). Per round,
    :meth:`value` gives the :class:`RoundFairness` of the valid replies, :meth:`scores` the
    scores the rule acts on (what the acceptance policy reads) and :meth:`decide` the rule's
    accepted clients with its I-JACK factors booked ([FAIRIJ] Props. 3.1, 3.2). The live strategy
    and the audit both value a round through :meth:`value_record`, from its record.
    """

    def __init__(self, objective: GroupFairness, damping: float | None = None, rule: Mapping | None = None) -> None:
        self.objective, self.damping = objective, damping
        self.rule = dict(rule) if rule else None

    def value_record(self, record: RoundRecord, *, seed: np.random.Generator,
                     aggregate: Aggregator | None = None) -> RoundFairness:
        """:meth:`value` of the record's valid replies (:func:`fedvalue.rounds.record_game.valid_clients`,
        weighted by their entries, with the G_u and d_u the record keeps), by the methods and
        estimator its settings name: what the live strategy values before it accepts, and what the
        audit values again from the saved record."""
        ok, weights, settings = valid_clients(record), record.weights, record.settings
        return self.value(ok, record.start_arrays, [record.replies[c] for c in ok], [weights[c] for c in ok],
                          methods=settings.methods, settings=settings.valuation, seed=seed, aggregate=aggregate,
                          coalition_rule=settings.coalition_rule,
                          loss_gradients=record.loss_gradients, fisher_diagonals=record.fisher_diagonals)

    def value(
        self,
        client_ids: Sequence[Hashable],
        start_arrays: Mapping[str, np.ndarray],
        client_arrays: Sequence[Mapping[str, np.ndarray]],
        weights: Sequence[float],
        *,
        methods: Sequence[str],
        settings: AdsSettings,
        seed: np.random.Generator,
        aggregate: Aggregator | None = None,
        loss_gradients: Mapping[Hashable, Mapping[str, np.ndarray]] | None = None,
        fisher_diagonals: Mapping[Hashable, Mapping[str, np.ndarray]] | None = None,
        coalition_rule: str = RENORMALIZED,
    ) -> RoundFairness:
        """The fairness valuation and influences of a round's valid replies (module docstring).

        The round game with U = −F is valued by ``methods`` with ``settings`` and the round's
        generator ``seed`` (the accuracy game's); I^F_t(u) = ∇F(A_{t−1}) · (p_u Δ_u).
        ``aggregate`` is the strategy's own rule for coalitions (None: the FedAvg weighted mean, under
        ``coalition_rule``).
        With a damping, ``loss_gradients`` and ``fisher_diagonals`` (client -> G_u, d_u) give
        I^H_t(u) = −∇Fᵀ(D + δI)⁻¹G_u of the valid replies that sent both
        (:mod:`fedvalue.scoring.fairness.curvature`; D sums theirs).
        """
        from fedvalue.scoring.fairness.curvature import curvature_influences
        from fedvalue.scoring.fairness.objectives import client_fairness_influences

        objective, damping = self.objective, self.damping
        if not client_ids:
            return RoundFairness(None, {}, objective, curvature=None if damping is None else {})
        game = round_game_for(client_ids, start_arrays, client_arrays, weights, objective, aggregate, coalition_rule)
        valuation = value_round(game, methods, settings, seed=seed)
        gradient = objective.gradient(start_arrays)
        by_client = dict(zip(client_ids, weights))
        influences = client_fairness_influences(gradient, start_arrays, dict(zip(client_ids, client_arrays)),
                                                by_client)
        curvature = None
        if damping is not None:
            sent = [c for c in client_ids if c in (loss_gradients or {}) and c in (fisher_diagonals or {})]
            curvature = curvature_influences(gradient, {c: loss_gradients[c] for c in sent},
                                             {c: fisher_diagonals[c] for c in sent}, damping=damping)
        return RoundFairness(valuation, influences, objective, weights=by_client, curvature=curvature)

    def scores(self, fair: RoundFairness) -> dict[Hashable, float]:
        """Client -> the score the rule acts on (``rule["score"]``; first-order when it names none)."""
        return fair.scores(str((self.rule or {}).get("score", "first-order")))

    def decide(self, fair: RoundFairness) -> tuple[set | None, RoundFairness]:
        """(the clients the rule accepts among the valid replies, ``fair`` with the rule's I-JACK
        factors w_u booked): :func:`policy_outcome` on :meth:`scores`. Without a rule, or with no
        valid reply, (None, ``fair``): nothing to decide."""
        if self.rule is None or not fair.influences:
            return None, fair
        chosen, factors = policy_outcome(self.rule, self.scores(fair))
        return chosen, fair if factors is None else replace(fair, factors=factors)


def policy_outcome(rule: Mapping, influences: Mapping[Hashable, float]) -> tuple[set, dict | None]:
    """The accepted clients and I-JACK factors a recorded rule gives (the audit re-derives them).

    ``rule`` is ``{"rule": "drop-k", "k": K}`` ([FAIRIJ] Prop. 3.1) or ``{"rule": "ijack",
    "lam": λ}`` (Prop. 3.2; clients whose factor is 0 are not aggregated); ``influences``
    the scores it acts on (:meth:`FairnessPlugin.scores`: ``rule["score"]``, if any).
    """
    from fedvalue.scoring.fairness.objectives import drop_k, ijack_factors

    name = rule.get("rule")
    if name == "drop-k":
        return set(influences) - drop_k(influences, int(rule["k"])), None
    if name == "ijack":
        factors = ijack_factors(influences, float(rule["lam"]))
        return {c for c, f in factors.items() if f > 0}, factors
    raise ValueError(f"rule: expected one of {list(FAIR_RULES)}; got {name!r}.")
