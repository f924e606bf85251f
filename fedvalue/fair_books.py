"""A round's fairness books: the round game valued on fairness, and each client's influence.

With a :class:`~fedvalue.fairness.GroupFairness` objective F on held-out data, a round adds,
per valid reply u (the ``ok`` clients, FedAvg weights p_u = n_u / Σ_ok n):

* ``ads_fairness`` / ``loo_fairness``: within-round ADS and LOO ([ADS] Remark 4.1, App. C.2)
  of the round game with U = −F (:func:`fedvalue.rounds.value_round`, same settings and
  seed as the accuracy game), so Σ_u φ^F_t(u) = −F(Agg(I_t)) + F(A_{t−1});
* ``fairness_influence``: I^F_t(u) = ∇F(A_{t−1}) · (p_u Δ_u) (:mod:`fedvalue.fairness`), as if
  every valid reply made the step: the score the fairness-aware policies act on;
* ``fair_weight``: under I-JACK reweighting, the factor w_u that multiplied u's weight
  ([FAIRIJ] Prop. 3.2).

The writer (the valuing strategy) and the audit both build these with :func:`fairness_round`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedvalue.ads import AdsSettings
from fedvalue.fairness import GroupFairness, client_fairness_influences, drop_k, ijack_factors
from fedvalue.rounds import Aggregator, RoundValuation, fedavg_round_game, round_game, value_round

#: The fairness-aware aggregation rules a run can record (see :func:`policy_outcome`).
FAIR_RULES = ("drop-k", "ijack")


@dataclass(frozen=True)
class FairnessBooks:
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
    """

    valuation: RoundValuation | None
    influences: Mapping[Hashable, float]
    utility: GroupFairness
    factors: Mapping[Hashable, float] | None = None


def fairness_round(
    objective: GroupFairness,
    client_ids: Sequence[Hashable],
    start_arrays: Mapping[str, np.ndarray],
    client_arrays: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
    *,
    methods: Sequence[str],
    settings: AdsSettings,
    seed: np.random.Generator,
    aggregate: Aggregator | None = None,
) -> FairnessBooks:
    """The fairness valuation and influences of a round's valid replies (module docstring).

    ``aggregate`` is the strategy's own rule for coalitions (None: the FedAvg weighted mean).
    """
    if not client_ids:
        return FairnessBooks(None, {}, objective)
    if aggregate is None:
        game = fedavg_round_game(client_ids, start_arrays, client_arrays, weights, objective)
    else:
        game = round_game(client_ids, start_arrays, aggregate, objective)
    valuation = value_round(game, methods, settings, seed=seed)
    influences = client_fairness_influences(objective.gradient(start_arrays), start_arrays,
                                            dict(zip(client_ids, client_arrays)), dict(zip(client_ids, weights)))
    return FairnessBooks(valuation, influences, objective)


def policy_outcome(rule: Mapping, influences: Mapping[Hashable, float]) -> tuple[set, dict | None]:
    """The accepted clients and I-JACK factors a recorded rule gives (the audit re-derives them).

    ``rule`` is ``{"rule": "drop-k", "k": K}`` ([FAIRIJ] Prop. 3.1) or ``{"rule": "ijack",
    "lam": λ}`` (Prop. 3.2; clients whose factor is 0 are not aggregated).
    """
    name = rule.get("rule")
    if name == "drop-k":
        return set(influences) - drop_k(influences, int(rule["k"])), None
    if name == "ijack":
        factors = ijack_factors(influences, float(rule["lam"]))
        return {c for c, f in factors.items() if f > 0}, factors
    raise ValueError(f"rule: expected one of {list(FAIR_RULES)}; got {name!r}.")
