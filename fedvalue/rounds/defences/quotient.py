"""A round valued with its defences: the quotient game of near-duplicate clusters, free-riders
as null players, arrivals in proportion to size, and a cap on update size.

From the round game v_t over the valid replies I_t ([ADS] Remark 4.1, Eq. 10):

1. Free-riders F (:mod:`.free_riders`) are taken out: they are paid nothing, whatever their
   reply did to the aggregate.
2. The rest are clustered into near-duplicates C_1, ..., C_m (:mod:`.clusters`, or by the round's
   own spread with ``duplicate_median_fraction``: :mod:`.relative_clusters`); cluster C_k is one
   player, stood for by its first member r_k (its update, with one copy's weight).
3. The defended game is v_t restricted to R = {r_1, ..., r_m}: v'(T) = v_t(T), T ⊆ R, the
   quotient of I_t by the clusters. Its coalitions are coalitions of the round game, so they
   come from the round's coalition cache. With a norm cap c, a representative whose update is
   longer than c · median_j ‖Δ_j‖ enters v' clipped to that length (weighted-mean rounds; a new
   game then scores the clipped coalitions).
4. v' is valued by each method of the round: ADS by uniform orders ([ADS] Eq. 10, the round's
   estimator settings and its seed) or, with ``size_weighted``, by arrivals in proportion to the
   representatives' weights (:mod:`.random_order`: exact when its 2^|R| coalitions cost no more
   than the round's own valuation scored, else m* sampled orders within the round's budget);
   LOO as v'(R) − v'(R ∖ {r}).
5. A cluster's value is split equally among its members (near-duplicates are interchangeable);
   a free-rider gets 0.

So a duplicated update under k identities earns its cluster exactly what one copy would earn
in the round without the other copies (the same coalitions of v_t). Σ over R of the defended
ADS is v_t(R) − v_t(∅) (group efficiency of the quotient game), which is v_t(I_t) − v_t(∅)
when nothing was flagged or clustered; what the flagged and duplicate replies did to the
realized state is booked to no one.

TracIn outflow ([RECIP] §4) is defended the same way: the flows of the step the
representatives would make with their own weights, with the gradients of the clusters' other
members left out (they are the representative's own), split equally; free-riders get 0.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedvalue.flows.round_flows import fedavg_round_flows
from fedvalue.rounds.defences.clusters import near_duplicate_clusters, representatives
from fedvalue.rounds.defences.free_riders import FreeRiderFlag, free_rider_flags
from fedvalue.rounds.defences.random_order import (
    MAX_EXACT_PLAYERS,
    exact_random_order_values,
    sampled_random_order_values,
)
from fedvalue.rounds.defences.relative_clusters import relative_duplicate_clusters
from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.valuation.ads import ads
from fedvalue.valuation.settings import AdsSettings
from fedvalue.valuation.plan import mc_num_permutations
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.loo import loo
from fedvalue.valuation.round_game import Arrays, ArraysUtility, fedavg_round_game
from fedvalue.schema import Method

Vector = np.ndarray


@dataclass
class DefendedRound:
    """What the defences decided and what each valid reply earns with them.

    Attributes
    ----------
    flags
        Free-riders: client -> its :class:`~fedvalue.rounds.defences.free_riders.FreeRiderFlag`.
    clusters
        The other valid replies in near-duplicate clusters (reply order; singletons included).
    clip_factors
        Representative -> the factor its update was scaled by under the norm cap (< 1 only).
    values, stderr
        Method (``ads``, ``loo``, ``tracin_outflow``) -> client -> defended value / standard error.
    num_evaluations
        Utility evaluations of a game of clipped updates (0 when the round's game served).
    """

    flags: dict[Hashable, FreeRiderFlag]
    clusters: list[tuple[Hashable, ...]]
    clip_factors: dict[Hashable, float] = field(default_factory=dict)
    values: dict[str, dict[Hashable, float]] = field(default_factory=dict)
    stderr: dict[str, dict[Hashable, float]] = field(default_factory=dict)
    num_evaluations: int = 0

    def cluster_of(self, client: Hashable) -> tuple[Hashable, ...] | None:
        return next((c for c in self.clusters if client in c), None)


def flat_update(arrays: Mapping[str, np.ndarray], start: Mapping[str, np.ndarray],
                keys: Sequence[str] | None = None) -> Vector:
    """Δ = w − A_{t−1} as one float64 vector over ``keys`` (default: the start state's keys, in its order)."""
    keys = list(start) if keys is None else list(keys)
    return np.concatenate([(np.asarray(arrays[k], np.float64) - np.asarray(start[k], np.float64)).ravel()
                           for k in keys]) if keys else np.zeros(0)


def screen(updates: Mapping[Hashable, Vector], weights: Mapping[Hashable, float], previous_step: Vector | None,
           settings: DefenceSettings) -> tuple[dict, list]:
    """Steps 1 and 2 of the module docstring: (free-rider flags, clusters of the others)."""
    flags = free_rider_flags(updates, weights, previous_step, zero_tolerance=settings.zero_tolerance,
                             replay_tolerance=settings.replay_tolerance,
                             collusion_tolerance=settings.collusion_tolerance)
    kept = {c: u for c, u in updates.items() if c not in flags}
    if settings.duplicate_tolerance is None:
        return flags, [(c,) for c in kept]
    if settings.duplicate_median_fraction is not None:  # judged among the kept replies: free-riders set no spread
        return flags, relative_duplicate_clusters(kept, settings.duplicate_tolerance, settings.duplicate_median_fraction)
    return flags, near_duplicate_clusters(kept, settings.duplicate_tolerance)


def screen_replies(start: Mapping[str, np.ndarray], replies: Mapping[Hashable, Arrays],
                   weights: Mapping[Hashable, float], previous: Mapping[str, np.ndarray] | None,
                   settings: DefenceSettings) -> tuple[dict, list]:
    """:func:`screen` of the replies' updates from A_{t−1} (``start``), the previous global step from A_{t−2}
    (``previous``; None in the first round)."""
    updates = {c: flat_update(a, start) for c, a in replies.items()}
    step = None if previous is None else flat_update(start, previous)
    return screen(updates, weights, step, settings)


#: The round record's ``settings.acceptance`` when the inner strategy aggregated only the representatives.
REPRESENTATIVES = "representatives"


def accepted_representatives(start: Mapping[str, np.ndarray], replies: Mapping[Hashable, Arrays],
                             weights: Mapping[Hashable, float], previous: Mapping[str, np.ndarray] | None,
                             settings: DefenceSettings) -> set:
    """The clusters' representatives among the replies, free-riders left out: what
    :class:`strategies.policies.representatives.RepresentativesOnly` aggregates, and the audit re-derives."""
    _, clusters = screen_replies(start, replies, weights, previous, settings)
    return set(representatives(clusters))


def _clip_factors(updates: Mapping[Hashable, Vector], players: Sequence[Hashable], cap: float | None) -> dict:
    if cap is None or not updates:
        return {}
    limit = cap * float(np.median([np.linalg.norm(u) for u in updates.values()]))
    norms = {c: float(np.linalg.norm(updates[c])) for c in players}
    return {c: limit / norm for c, norm in norms.items() if norm > limit}


def _clipped(arrays: Arrays, start: Mapping[str, np.ndarray], factor: float) -> Arrays:
    return {k: (np.asarray(start[k], np.float64) + factor * (np.asarray(v, np.float64)
                                                            - np.asarray(start[k], np.float64))).astype(v.dtype)
            for k, v in arrays.items()}


#: Coalitions the size-weighted values may score exactly even when the round's game holds fewer.
EXACT_COALITIONS = 1024


def _orders(game: CoalitionGame, players: list, settings: AdsSettings) -> int | None:
    """None (exact) when the 2^n coalitions cost no more than the round's valuation scored (or
    :data:`EXACT_COALITIONS`); else MC-ADS's m* orders, within the round's budget when it has one."""
    if len(players) <= MAX_EXACT_PLAYERS and (1 << len(players)) <= max(EXACT_COALITIONS, game.num_cached):
        return None
    orders = mc_num_permutations(len(players), settings.epsilon, settings.delta, settings.r)
    return orders if settings.budget is None else max(2, min(orders, settings.budget // len(players)))


def _valued(game: CoalitionGame, players: list, weights: Mapping, methods: Sequence[str],
            settings: AdsSettings, size_weighted: bool, rng: np.random.Generator) -> tuple[dict, dict]:
    """Method -> player -> value and standard error in ``game`` restricted to ``players``."""
    values, stderr = {}, {}
    if Method.ADS in methods:
        if size_weighted:
            rates, orders = [weights[p] for p in players], _orders(game, players, settings)
            if orders is None:
                found, errors = exact_random_order_values(game, players, rates), np.zeros(len(players))
            else:
                found, errors = sampled_random_order_values(game, players, rates, orders, rng)
        else:
            result = ads(game, [players], settings, seed=rng)
            found, errors = result.values.to_numpy(), result.stderr.to_numpy()
        values[Method.ADS] = dict(zip(players, map(float, found)))
        stderr[Method.ADS] = dict(zip(players, map(float, errors)))
    if Method.LOO in methods:
        values[Method.LOO] = {p: float(v) for p, v in loo(game, players).values.items()}
        stderr[Method.LOO] = {p: 0.0 for p in players}
    return values, stderr


def defend_round(game: CoalitionGame, start: Mapping[str, np.ndarray], replies: Mapping[Hashable, Arrays],
                 weights: Mapping[Hashable, float], *, methods: Sequence[str], ads_settings: AdsSettings,
                 rng: np.random.Generator, settings: DefenceSettings, previous: Mapping[str, np.ndarray] | None,
                 utility: ArraysUtility | None, weighted_mean: bool,
                 gradients: Mapping[Hashable, Mapping[str, np.ndarray]] | None = None,
                 aggregated: Sequence[Hashable] | None = None) -> DefendedRound:
    """The round's defended books (module docstring).

    Parameters
    ----------
    game
        The round game over the valid replies (its cache serves the quotient game).
    start, replies, weights
        A_{t−1}, and each valid reply's arrays and weight, in reply order.
    methods, ads_settings, rng
        The round's valuation methods, ADS settings and MC generator (``[seed, t]``).
    previous
        A_{t−2} (None in the first round): the replay and collusion tests need it.
    utility, weighted_mean
        U, and whether the round aggregates by the weighted mean (the norm cap needs both).
    gradients, aggregated
        Inference gradients (flows) and the clients whose updates were aggregated; with
        gradients, the defended TracIn outflow is booked too.
    """
    updates = {c: flat_update(a, start) for c, a in replies.items()}
    step = None if previous is None else flat_update(start, previous)
    flags, clusters = screen(updates, weights, step, settings)
    players = representatives(clusters)
    factors = _clip_factors(updates, players, settings.norm_cap) if weighted_mean else {}
    defended = DefendedRound(flags, clusters, factors)
    arrays = {p: _clipped(replies[p], start, factors[p]) if p in factors else replies[p] for p in players}
    scored = game
    if factors and players:
        scored = fedavg_round_game(players, start, [arrays[p] for p in players], [weights[p] for p in players], utility)
    found, errors = _valued(scored, players, weights, methods, ads_settings, settings.size_weighted, rng) \
        if players else ({m: {} for m in methods}, {m: {} for m in methods})
    defended.num_evaluations = scored.num_evaluations if scored is not game else 0
    if gradients is not None:
        found[Method.TRACIN_OUTFLOW], errors[Method.TRACIN_OUTFLOW] = _outflows(
            start, arrays, weights, gradients, clusters, [p for p in players if aggregated is None or p in aggregated])
    for method in found:
        defended.values[method], defended.stderr[method] = _split(found[method], errors[method], clusters, flags,
                                                                   updates)
    return defended


def _outflows(start, arrays, weights, gradients, clusters, stepping) -> tuple[dict, dict]:
    """Representative -> outflow of the step the representatives make (their own weights)."""
    if not stepping:
        return {}, {}
    others = {c for cluster in clusters for c in cluster[1:]}
    flows, _ = fedavg_round_flows(start, {p: arrays[p] for p in stepping}, {p: weights[p] for p in stepping},
                                  {c: g for c, g in gradients.items() if c not in others})
    frame = flows.to_frame()
    return ({p: float(frame.at[p, "outflow"]) for p in stepping}, {p: 0.0 for p in stepping})


def _split(values: Mapping, errors: Mapping, clusters: list, flags: Mapping, updates: Mapping) -> tuple[dict, dict]:
    """Each cluster's value shared equally by its members; free-riders and non-stepping clients 0."""
    shared, shared_errors = {}, {}
    for cluster in clusters:
        value, error = values.get(cluster[0], 0.0), errors.get(cluster[0], 0.0)
        for member in cluster:
            shared[member], shared_errors[member] = value / len(cluster), error / len(cluster)
    for client in flags:
        shared[client], shared_errors[client] = 0.0, 0.0
    return ({c: shared[c] for c in updates}, {c: shared_errors[c] for c in updates})
