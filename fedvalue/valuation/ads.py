"""Asymmetric Data Shapley over ordered groups ([ADS], §4–5).

Groups σ = (D_1, ..., D_T) are ordered; sources are exchangeable within a group and
later groups come after earlier ones. With U_{t−1} = D_1 ∪ ... ∪ D_{t−1}, the value
of z ∈ D_t is the subset form ([ADS], Prop. 4.1, Eq. 9)

    φ^σ(z) = (1/|D_t|) Σ_{S ⊆ D_t∖{z}} C(|D_t|−1, |S|)^{-1}
             [v(U_{t−1} ∪ S ∪ {z}) − v(U_{t−1} ∪ S)],

equal to the average marginal over the σ-respecting permutations (Eqs. 7–8). In
federated learning (Remark 4.1, Eq. 10) the prefix U_{t−1} is absorbed into the
realized global state A_{t−1}: the round's game is one group whose utility is
conditioned on A_{t−1}. Group efficiency (Prop. 4.2): Σ_{z∈D_t} φ^σ(z) =
v(U_t) − v(U_{t−1}); every result reports its gap.

``method="exact"`` enumerates the 2^{|D_t|} subsets of each group (1 + Σ_t (2^{|D_t|} − 1)
distinct coalitions). ``method="mc"`` is MC-ADS (Alg. 1): m* = ⌈r²/(2ε²) · log(2n/δ)⌉
σ-respecting permutations, each giving all n marginals in one left-to-right pass;
all prefixes go through the game's cache, so MC never evaluates more distinct
coalitions than exact. ``method="auto"`` takes exact whenever its coalition count is
at most MC's m*·n evaluations. Past that it takes MC with m* permutations when only
(ε, δ) is asked for (Hoeffding's m* is the cheapest of these estimators with that
guarantee: a paired sample's mean still spans r); with a ``stderr_target`` it takes
whichever of mc, antithetic, stratified and kernelshap a one-block pilot projects to reach the
target with the fewest coalitions (:func:`fedvalue.valuation.shapley_sampling.choose_sampler`).

Cheaper estimators for large rounds (each checked against exact on small rounds in
tests/fedvalue/test_cheaper_estimators.py, and by ``bench/estimators.py``):

* ``method="tmc"``, truncated MC as GTG-Shapley does within a round: walking a
  permutation of group t, once |v(U_t) − v(prefix)| < ``truncation_tolerance`` the
  remaining marginals of that group are set to 0 without evaluating them. Each
  permutation's marginals then sum to v(prefix) − v(U_{t−1}) instead of
  v(U_t) − v(U_{t−1}), so the group-efficiency gap is below the tolerance in absolute
  value; the values are biased by at most that much per group in total.
  ``truncation_tolerance=0`` never truncates.
* ``stderr_target`` (with ``mc`` or ``tmc``): permutations are drawn in blocks of
  max(10, largest group) and sampling stops once every player's standard error is at
  most the target, or at m* permutations (Alg. 1's bound stays the cap).

* ``method="antithetic"``: permutations in antithetic pairs, π and its reverse
  [SAMPLPERM], exact for games with at most pairwise interactions; at most ⌈m*/2⌉
  pairs (m* permutations).
* ``method="stratified"``: stratified by coalition size [STRAT]: the strata of sizes
  0, 1, |D_t|−2 and |D_t|−1 computed exactly (about |D_t|² coalitions), the others sampled
  by blocks of cyclic shifts of a permutation and of its reverse, in which every player
  takes every position once; at most m* permutations.
* ``method="kernelshap"``: KernelSHAP with paired sampling and the efficiency constraint
  [KERNELSHAP]; at most ⌈m*·|D_t|/2⌉ coalition pairs per group (about MC's
  coalitions). Both per group, in :mod:`fedvalue.valuation.shapley_sampling`, with or without
  ``stderr_target``.

* ``method="adaptive"``: adaptive MC-ADS (:mod:`fedvalue.valuation.adaptive`): each player's marginals
  drawn for it alone, stratified by position with the end positions exact, in looks of a fixed schedule that
  draw only the players whose side of the caller's decision (``decision``: a threshold ``cut``, or the
  ``top_k``) is still unsure; its result also books ``settled`` per player.

``budget`` (distinct coalition evaluations) replaces the sample caps: a sampling method
draws until its budget is spent, each block cut so that its worst case still fits, and
``"auto"`` takes exact when its coalitions fit, else the first of :data:`BUDGET_SAMPLERS`
whose minimum (two samples, for a standard error) fits (:func:`budget_method`). Every
sampling method books a standard error per player (``ValuationResult.stderr``): for mc and tmc
the marginals' spread post-stratified by each player's position in the permutations, each
position's moment moderated toward the group's (``AdsSettings.stderr_estimator``, the formula and
why in :mod:`fedvalue.valuation.result`), which for tmc leaves out truncation's bias (at most the
tolerance per group); for antithetic and stratified the standard deviation of their independent
samples over √samples; for KernelSHAP the sandwich estimate.

mc and tmc walk the permutations in waves — step j of every still-active permutation of a
block is one batched request to the game — so batched coalition evaluation keeps
working.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence

import numpy as np
import pandas as pd

from fedvalue._checks import check_seed
from fedvalue.valuation.adaptive import Decision, adaptive_ads
from fedvalue.valuation.game import CoalitionGame, Utility, as_game
from fedvalue.valuation.plan import AdsPlan, plan_ads
from fedvalue.valuation.result import ValuationResult, permutation_stderr, positions_in, positions_within_groups
from fedvalue.valuation.settings import METHODS, AdsSettings, Method  # noqa: F401 (the names ads() is called with)
from fedvalue.valuation.settings import ADAPTIVE
from fedvalue.valuation.shapley_sampling import SAMPLERS, choose_sampler

def validate_groups(groups: Sequence[Sequence[Hashable]]) -> tuple[tuple[Hashable, ...], ...]:
    """Check ``groups`` is a non-empty sequence of non-empty groups of unique ids."""
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
        raise TypeError(
            "groups: expected a sequence of groups, each a sequence of player ids "
            f"(for one round: [['a', 'b', 'c']]); got {type(groups).__name__}."
        )
    if len(groups) == 0:
        raise ValueError("groups: expected at least one group; got an empty sequence.")
    checked: list[tuple[Hashable, ...]] = []
    seen: dict[Hashable, int] = {}
    for t, group in enumerate(groups):
        if isinstance(group, (str, bytes)) or not isinstance(group, Sequence):
            raise TypeError(
                f"groups: expected each group to be a sequence of player ids (for one round: "
                f"[['a', 'b', 'c']]); group {t} is {group!r}."
            )
        if len(group) == 0:
            raise ValueError(
                f"groups: expected non-empty groups; group {t} is empty. Drop it, or give "
                "it its players."
            )
        for player in group:
            try:
                hash(player)
            except TypeError:
                raise TypeError(
                    f"groups: expected hashable player ids; group {t} holds {player!r}."
                ) from None
            if player in seen:
                where = "twice in that group" if seen[player] == t else f"also in group {seen[player]}"
                raise ValueError(
                    f"groups: expected each player id exactly once; {player!r} is in group {t} "
                    f"and {where}."
                )
            seen[player] = t
        checked.append(tuple(group))
    return tuple(checked)


def ads(
    utility: Utility | CoalitionGame,
    groups: Sequence[Sequence[Hashable]],
    settings: AdsSettings | None = None,
    *,
    seed: int | np.random.Generator | None = None,
    **keywords,
) -> ValuationResult:
    """Asymmetric Data Shapley of every player over ordered groups ([ADS]).

    Parameters
    ----------
    utility
        Callable from a frozenset of player ids to a float, or a :class:`~fedvalue.CoalitionGame`
        (its cache is shared with other calls).
    groups
        σ = (D_1, ..., D_T), non-empty sequences of player ids. One group is Data Shapley; the
        within-round FL case is one group whose utility is conditioned on the round's start.
    settings
        The estimator (:class:`AdsSettings`, each field explained there); None: the defaults.
        Its fields may be given as keywords instead (``ads(u, groups, method="mc")``).
    seed
        Seed or Generator for the sampled permutations and coalitions.

    Returns
    -------
    ValuationResult
        ``values`` and ``stderr`` by player, ``num_evaluations``, per-group ``efficiency_gaps``.
    """
    settings = _settings_of(settings, keywords)
    groups = validate_groups(groups)
    rng = check_seed(seed)
    plan = plan_ads(groups, settings)  # fails here, before any evaluation, when the call cannot fit

    players = [p for group in groups for p in group]
    game = as_game(utility, players)
    game.expect(plan.planned)
    evaluations_before = game.num_evaluations
    group_positions = [np.array([game.index_of(p) for p in g], dtype=np.int64) for g in groups]
    prefix_masks = [0]
    for positions in group_positions:
        prefix_masks.append(prefix_masks[-1] | _mask(positions))
    method, values, stderr, num_permutations, settled = _run(game, plan, settings, prefix_masks, group_positions, rng)

    prefix_utilities = game.values(prefix_masks)
    bounds = np.cumsum([0] + [len(g) for g in groups])
    gaps = [float(values[bounds[t]: bounds[t + 1]].sum() - (prefix_utilities[t + 1] - prefix_utilities[t]))
            for t in range(len(groups))]
    index = pd.Index(players, dtype=object, name="player")
    return ValuationResult(
        method=f"ads-{method}",
        values=pd.Series(values, index=index, name="ads"),
        stderr=pd.Series(stderr, index=index, name="stderr"),
        num_evaluations=game.num_evaluations - evaluations_before,
        groups=groups,
        prefix_utilities=tuple(float(u) for u in prefix_utilities),
        efficiency_gaps=pd.Series(gaps, index=pd.RangeIndex(len(groups), name="group"), name="gap"),
        num_permutations=num_permutations,
        settled=None if settled is None else pd.Series(settled, index=index, name="settled"),
    )


def _settings_of(settings: AdsSettings | None, keywords: dict) -> AdsSettings:
    """``settings``, or the settings the keywords name (never both)."""
    if settings is not None and not isinstance(settings, AdsSettings):
        raise TypeError(f"settings: expected AdsSettings or None; got {type(settings).__name__}.")
    unknown = sorted(set(keywords) - {f.name for f in dataclasses.fields(AdsSettings)})
    if unknown:
        raise TypeError(f"ads: unexpected keyword {unknown[0]!r}; the estimator's settings are the fields of "
                        "AdsSettings.")
    if settings is not None and keywords:
        raise TypeError(f"ads: give the estimator's settings as settings=AdsSettings(...) or as keywords, not "
                        f"both; got settings and {sorted(keywords)}.")
    return settings if settings is not None else AdsSettings(**keywords)


def _run(game: CoalitionGame, plan: AdsPlan, settings: AdsSettings, prefix_masks: list[int],
         group_positions: list[np.ndarray], rng: np.random.Generator):
    """Run the planned estimator; returns (method, values, stderr, permutations or None, settled flags or None:
    the adaptive method's, :mod:`fedvalue.valuation.adaptive`)."""
    if plan.method == ADAPTIVE:
        found = adaptive_ads(game, prefix_masks, group_positions, Decision.of(settings), plan.m_star, rng,
                             stderr_target=settings.stderr_target, budget=settings.budget)
        return ADAPTIVE, found.values, found.stderr, None, found.settled
    return (*_estimate(game, plan, settings, prefix_masks, group_positions, rng), None)


def _estimate(game: CoalitionGame, plan: AdsPlan, settings: AdsSettings, prefix_masks: list[int],
              group_positions: list[np.ndarray], rng: np.random.Generator):
    """Run the planned estimator; returns (method, values, stderr, permutations or None)."""
    method, budget, target = plan.method, settings.budget, settings.stderr_target
    estimator = settings.stderr_estimator
    if budget is not None and method in SAMPLERS:
        return _by_sampler(game, prefix_masks, group_positions, method, plan.caps, rng, target, False, budget=budget,
                           stderr_estimator=estimator)
    if plan.piloted or method in ("antithetic", "stratified", "kernelshap"):
        return _by_sampler(game, prefix_masks, group_positions, method, plan.caps, rng, target, plan.piloted,
                           stderr_estimator=estimator)
    if method == "exact":
        values = np.concatenate([_exact_group(game, base, pos) for base, pos in zip(prefix_masks, group_positions)])
        return method, values, np.zeros(len(values)), None
    if method == "mc" and target is None:
        values, stderr = _monte_carlo(game, group_positions, plan.m_star, rng, estimator)
        return method, values, stderr, plan.m_star
    tolerance = settings.truncation_tolerance if method == "tmc" else 0.0
    values, stderr, num_permutations = _blockwise_monte_carlo(
        game, group_positions, prefix_masks, plan.m_star if budget is None else budget, rng, tolerance,
        target, budget=budget, cached_cap=plan.m_star, stderr_estimator=estimator)
    return method, values, stderr, num_permutations


def _by_sampler(game, prefix_masks, group_positions, method, caps, rng, target, piloted, budget=None,
                stderr_estimator="by-position"):
    """ADS of every group by a sampler of :mod:`fedvalue.valuation.shapley_sampling` (chosen by a
    pilot when ``piloted``); returns (method, values, stderr, permutations or None). With
    ``budget`` the groups share it: each draws until its share is spent (``caps``: the
    usual caps, where a group seen whole stops). ``stderr_estimator``: the permutation sampler's."""
    groups = list(zip(prefix_masks[:-1], group_positions))
    start = game.num_evaluations
    if piloted:
        method, samplers = choose_sampler(game, groups, rng, target, stderr_estimator)
    else:
        samplers = [SAMPLERS[method](game, base, positions, rng, stderr_estimator) for base, positions in groups]
    estimates = []
    for k, sampler in enumerate(samplers):
        cap = caps.get(method, -(-caps["mc"] * sampler.size // 2))
        if budget is not None:  # what is left, shared evenly by this group and the ones after it
            share = (budget - (game.num_evaluations - start)) // (len(samplers) - k)
            # A group seen whole (every draw cached) stops at the usual cap; the budget caps samples too.
            estimates.append(sampler.run(budget, target, budget=share, cached_cap=cap))
            continue
        estimates.append(sampler.run(max(cap, sampler.samples), target))
    values = np.concatenate([e[0] for e in estimates])
    stderr = np.concatenate([e[1] for e in estimates])
    per_sample = {"mc": lambda s: 1, "antithetic": lambda s: 2, "stratified": lambda s: 2 * s.size}.get(method)
    return method, values, stderr, None if per_sample is None else max(per_sample(s) * s.samples for s in samplers)


def _mask(positions: np.ndarray) -> int:
    mask = 0
    for k in positions.tolist():
        mask |= 1 << k
    return mask


def _subset_masks(base: int, positions: np.ndarray) -> list[int]:
    """Global masks of base ∪ S for every local subset index s of the group (bit k -> positions[k])."""
    masks = [base]
    for k in positions.tolist():
        bit = 1 << k
        masks += [m | bit for m in masks]
    return masks


def _exact_group(game: CoalitionGame, base: int, positions: np.ndarray) -> np.ndarray:
    """Eq. 9 for one group on top of ``base`` = U_{t−1}; returns φ in group order."""
    return subset_form(game.values(_subset_masks(base, positions)), len(positions))


def subset_form(utilities: np.ndarray, size: int) -> np.ndarray:
    """Eq. 9 from a table of the 2^size coalition values of one group (entry s: the coalition of the
    players whose bits s holds, player k at bit k): φ_k = Σ_{S∌k} [v(S∪{k}) − v(S)] / (size · C(size−1, |S|)),
    in player order."""
    local = np.arange(1 << size, dtype=np.int64)
    popcount = np.zeros(1 << size, dtype=np.int64)
    for k in range(size):
        popcount += (local >> k) & 1
    # Weight of a marginal on top of S with |S| = s: 1 / (|D_t| · C(|D_t|−1, s)).
    weights = np.array([1.0 / (size * math.comb(size - 1, s)) for s in range(size)])
    values = np.empty(size)
    for k in range(size):
        without = local[((local >> k) & 1) == 0]
        marginals = utilities[without | (1 << k)] - utilities[without]
        values[k] = float(np.dot(weights[popcount[without]], marginals))
    return values


def sample_ordered_permutations(
    sizes: Sequence[int], num_permutations: int, rng: np.random.Generator
) -> np.ndarray:
    """Alg. 1, lines 5–8: ``num_permutations`` σ-respecting permutations, one per row.

    Entry (s, j) is the column (in the concatenated group order) of the j-th player added
    in permutation s. Shared with :mod:`fedvalue.valuation.knn.monte_carlo`, whose incremental MC must draw
    the very same permutations for the same seed.
    """
    offsets = np.cumsum([0, *sizes[:-1]])
    return np.concatenate(
        [
            offset + rng.permuted(np.tile(np.arange(size), (num_permutations, 1)), axis=1)
            for offset, size in zip(offsets, sizes)
        ],
        axis=1,
    )


def _monte_carlo(
    game: CoalitionGame,
    group_positions: list[np.ndarray],
    num_permutations: int,
    rng: np.random.Generator,
    stderr_estimator: str = "by-position",
) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 1: mean and standard error (:func:`fedvalue.valuation.result.permutation_stderr`) of the
    marginals over σ-respecting permutations.

    Columns of the returned arrays follow the concatenated group order.
    """
    sizes = [len(p) for p in group_positions]
    n = sum(sizes)
    order = sample_ordered_permutations(sizes, num_permutations, rng)
    positions = np.concatenate(group_positions)
    bit_positions = positions[order]
    if game.num_players <= 62:
        cumulative = np.cumsum(np.left_shift(np.int64(1), bit_positions), axis=1)
        prefixes = np.concatenate([np.zeros((num_permutations, 1), np.int64), cumulative], axis=1)
        masks = prefixes.ravel().tolist()
    else:
        masks = []
        for row in bit_positions.tolist():
            mask = 0
            masks.append(mask)
            for k in row:
                mask |= 1 << k
                masks.append(mask)
    utilities = game.values(masks).reshape(num_permutations, n + 1)
    step_marginals = np.diff(utilities, axis=1)
    marginals = np.empty_like(step_marginals)
    np.put_along_axis(marginals, order, step_marginals, axis=1)
    stderr = permutation_stderr(marginals, positions_within_groups(order, sizes), sizes, stderr_estimator)
    return marginals.mean(axis=0), stderr


def _blockwise_monte_carlo(
    game: CoalitionGame,
    group_positions: list[np.ndarray],
    prefix_masks: list[int],
    max_permutations: int,
    rng: np.random.Generator,
    tolerance: float,
    stderr_target: float | None,
    budget: int | None = None,
    cached_cap: int = 2,
    stderr_estimator: str = "by-position",
) -> tuple[np.ndarray, np.ndarray, int]:
    """MC (tolerance 0) or truncated MC over blocks of permutations, with an optional
    standard-error stop and an optional ``budget`` of distinct evaluations (a block is cut
    so that its worst case, n new prefixes a permutation, fits); returns (mean, stderr,
    permutations used) in group order.

    Within group t every permutation starts from U_{t−1} (earlier groups all come
    first, so a σ-respecting permutation's marginals in group t depend only on its
    order inside the group) and walks its players; a permutation stops being walked
    once |v(U_t) − v(prefix)| < tolerance. Standard errors: :func:`fedvalue.valuation.result.permutation_stderr`
    (a truncated marginal is a 0 at its position).
    """
    sizes = [len(p) for p in group_positions]
    block = max(10, max(sizes))
    columns = np.cumsum([0] + sizes)
    chunks: list[np.ndarray] = []
    places: list[np.ndarray] = []  # each player's position within its group, per permutation
    used = 0
    spent_from = game.num_evaluations
    while used < max_permutations:
        count = int(min(block, max_permutations - used))
        before = game.num_evaluations
        if budget is not None:
            count = min(count, int((budget - (before - spent_from)) // int(columns[-1])))
            if count < 1:
                break
        marginals = np.zeros((count, columns[-1]))
        place = np.empty((count, columns[-1]), dtype=np.int64)
        for t, positions in enumerate(group_positions):
            size = len(positions)
            orders = np.stack([rng.permutation(size) for _ in range(count)])
            place[:, columns[t]: columns[t + 1]] = positions_in(orders)
            full, start = game.values([prefix_masks[t + 1], prefix_masks[t]])
            masks = np.full(count, prefix_masks[t], dtype=object)
            previous = np.full(count, start)
            active = np.full(count, tolerance == 0 or abs(full - start) >= tolerance)
            for j in range(size):
                rows = np.flatnonzero(active)
                if len(rows) == 0:
                    break
                players = orders[rows, j]
                masks[rows] = [int(m) | (1 << int(positions[p])) for m, p in zip(masks[rows], players)]
                current = game.values(masks[rows].tolist())
                marginals[rows, columns[t] + players] = current - previous[rows]
                previous[rows] = current
                if tolerance > 0:
                    active[rows] = np.abs(full - current) >= tolerance
        chunks.append(marginals)
        places.append(place)
        used += count
        if budget is not None and game.num_evaluations == before and used >= cached_cap:
            break  # every prefix drawn was cached: the budget cannot be spent; stop at the usual m*
        if stderr_target is not None and used > 1:
            stderr = permutation_stderr(np.concatenate(chunks), np.concatenate(places), sizes, stderr_estimator)
            if np.all(stderr <= stderr_target):
                break
    sample = np.concatenate(chunks)
    stderr = permutation_stderr(sample, np.concatenate(places), sizes, stderr_estimator)
    return sample.mean(axis=0), stderr, used
