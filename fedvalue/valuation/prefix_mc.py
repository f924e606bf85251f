"""MC-ADS, truncated MC Data Shapley and leave-one-out for models refit along permutations.

[ADS] Alg. 1 needs v at every prefix of every sampled σ-respecting permutation; with a
real model, v(S) is the test accuracy of the model retrained on S ([ADS] §6.1: MC-ADS,
MC-DS [Ghorbani & Zou's TMC Data Shapley] and LOO "implemented by retraining"). A
:class:`PrefixModel` holds a block of coalitions and grows each by one instance at a time,
so a model that refits cheaply from its previous fit (a K-NN vote updated by the entering
neighbour, a convex model warm-started from the previous prefix's optimum) walks a whole
block of permutations in one vectorized pass. Its ``values`` are those of the set function
v(S) = ``utilities(start(mask of S))``: :func:`prefix_mc_ads` draws the permutations with
:func:`fedvalue.valuation.ads.sample_ordered_permutations`, so without truncation it returns the
values of ``fedvalue.ads(v, groups, method="mc", seed=...)`` for the same seed (tested).

**Truncation** (``truncation_tolerance > 0``, the rule of ``fedvalue.ads(method="tmc")``
and Ghorbani & Zou's TMC): in group t a permutation stops once |v(U_t) − v(prefix)| <
tolerance and its remaining marginals in that group are 0.

:func:`prefix_loo` is ψ(i) = v(N) − v(N∖{i}) by refitting without each instance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from fedvalue._checks import check_integer, check_non_negative, check_seed
from fedvalue.valuation.ads import sample_ordered_permutations
from fedvalue.valuation.knn.exact import check_instance_groups
from fedvalue.valuation.result import ValuationResult, result_from_marginals

__all__ = ["PrefixModel", "prefix_loo", "prefix_mc_ads", "prefix_values"]


@runtime_checkable
class PrefixModel(Protocol):
    """A model fit on many training subsets at once, each grown one instance at a time.

    ``num_train`` instances are indexed 0..num_train−1. ``start(masks)`` fits one model per
    row of the boolean ``masks`` (B × num_train) and returns their state; ``add(state,
    rows, instances)`` adds ``instances[j]`` to the subset of row ``rows[j]`` (distinct rows,
    the state changed in place) and returns those rows' new utilities; ``utilities(state)``
    returns every row's utility. The utility of a subset must not depend on the order its
    instances were added in (a refit to the same optimum, a vote over the same neighbours).
    """

    num_train: int

    def start(self, masks: np.ndarray) -> Any: ...

    def add(self, state: Any, rows: np.ndarray, instances: np.ndarray) -> np.ndarray: ...

    def utilities(self, state: Any) -> np.ndarray: ...


def _check_model(model: object) -> PrefixModel:
    if not isinstance(model, PrefixModel):
        raise TypeError(f"model: expected a PrefixModel (num_train, start, add, utilities); got "
                        f"{type(model).__name__}.")
    check_integer("model.num_train", model.num_train)
    return model


def prefix_values(model: PrefixModel, masks: np.ndarray, *, block_size: int = 256) -> np.ndarray:
    """v(S) for each row of the boolean ``masks`` (B × num_train), fitted ``block_size`` at a time."""
    model = _check_model(model)
    masks = np.asarray(masks, dtype=bool)
    if masks.ndim != 2 or masks.shape[1] != model.num_train:
        raise ValueError(f"masks: expected a boolean (B, {model.num_train}) array; got shape {masks.shape}.")
    check_integer("block_size", block_size)
    return np.concatenate([model.utilities(model.start(masks[lo:lo + block_size]))
                           for lo in range(0, len(masks), block_size)] or [np.zeros(0)])


def prefix_loo(model: PrefixModel, *, block_size: int = 256) -> ValuationResult:
    """ψ(i) = v(N) − v(N∖{i}) for every instance, each v by a refit without it."""
    model = _check_model(model)
    n = model.num_train
    full = float(prefix_values(model, np.ones((1, n), dtype=bool))[0])
    without = prefix_values(model, ~np.eye(n, dtype=bool), block_size=block_size)
    index = pd.Index(list(range(n)), dtype=object, name="player")
    return ValuationResult(
        method="loo", values=pd.Series(full - without, index=index, name="loo"),
        stderr=pd.Series(np.zeros(n), index=index, name="stderr"), num_evaluations=n + 1,
        groups=(tuple(range(n)),), prefix_utilities=(full,), efficiency_gaps=pd.Series([], dtype=np.float64,
                                                                                      name="gap"),
    )


def prefix_mc_ads(
    model: PrefixModel,
    groups: Sequence[Sequence[int]],
    *,
    num_permutations: int,
    seed: int | np.random.Generator | None = None,
    truncation_tolerance: float = 0.0,
    block_size: int = 64,
    values_of: Sequence[int] | None = None,
) -> ValuationResult:
    """MC-ADS ([ADS] Alg. 1) of the training instances by refitting along permutations.

    Parameters
    ----------
    model
        The :class:`PrefixModel` whose utility is valued.
    groups
        σ as sequences of training indices partitioning 0..num_train−1 (one group: MC Data
        Shapley); the players of the result are in this order.
    num_permutations
        σ-respecting permutations sampled.
    seed
        Seed or Generator of the permutations (the draws of ``fedvalue.ads(method="mc")``).
    truncation_tolerance
        0: plain MC (method ``"ads-mc"``); > 0: truncated (``"ads-tmc"``, module docstring).
    block_size
        Permutations walked at once.
    values_of
        Only these groups (indices into ``groups``) are walked; the others' values are NaN.
        An ADS value in group t depends only on the permutations of group t on top of
        U_{t−1}, so the groups skipped cost nothing and change nothing.
    """
    model = _check_model(model)
    n = model.num_train
    check_instance_groups(groups, n)
    check_integer("num_permutations", num_permutations)
    check_non_negative("truncation_tolerance", truncation_tolerance)
    check_integer("block_size", block_size)
    rng = check_seed(seed)
    group_arrays = [np.asarray(g, dtype=np.int64) for g in groups]
    walked = set(range(len(groups))) if values_of is None else {int(t) for t in values_of}
    if not walked or not walked <= set(range(len(groups))):
        raise ValueError(f"values_of: expected group indices in [0, {len(groups)}); got {values_of!r}.")
    players = np.concatenate(group_arrays)
    sizes = [len(g) for g in group_arrays]
    columns = np.cumsum([0, *sizes])
    order = sample_ordered_permutations(sizes, num_permutations, rng)
    prefix_masks = np.zeros((len(groups) + 1, n), dtype=bool)
    for t, group in enumerate(group_arrays):
        prefix_masks[t + 1] = prefix_masks[t]
        prefix_masks[t + 1, group] = True
    prefix_utilities = prefix_values(model, prefix_masks)
    marginals = np.full((num_permutations, n), np.nan)
    steps = 0
    for start in range(0, num_permutations, block_size):
        rows = np.arange(start, min(start + block_size, num_permutations))
        for t in sorted(walked):
            local = order[rows, columns[t]:columns[t + 1]] - columns[t]
            block_marginals, block_steps = _walk_block(model, prefix_masks[t], players[local + columns[t]],
                                                       prefix_utilities[t], prefix_utilities[t + 1],
                                                       truncation_tolerance)
            steps += block_steps
            # Back from "j-th added" to the instance's column.
            placed = np.empty_like(block_marginals)
            np.put_along_axis(placed, local, block_marginals, axis=1)
            marginals[np.ix_(rows, np.arange(columns[t], columns[t + 1]))] = placed
    return result_from_marginals(marginals, players, group_arrays, prefix_utilities, order=order, walked=walked,
                                 method="ads-tmc" if truncation_tolerance > 0 else "ads-mc", num_evaluations=steps)


def _walk_block(model: PrefixModel, prefix_mask: np.ndarray, added: np.ndarray, begin: float, full: float,
                truncation_tolerance: float) -> tuple[np.ndarray, int]:
    """One block of permutations of one group, walked left to right on top of U_{t−1}
    (``prefix_mask``, utility ``begin``; the whole group gives ``full``): row s adds
    ``added[s, j]`` at step j. Returns the marginals in step order and the refits made; a
    permutation stops once within ``truncation_tolerance`` of ``full`` (its rest stays 0)."""
    rows, size = added.shape
    state = model.start(np.repeat(prefix_mask[None, :], rows, axis=0))
    previous = np.full(rows, begin)
    active = np.full(rows, truncation_tolerance == 0 or abs(full - begin) >= truncation_tolerance)
    marginals = np.zeros((rows, size))
    steps = 0
    for j in range(size):
        live = np.flatnonzero(active)
        if live.size == 0:
            break
        current = model.add(state, live, added[live, j])
        steps += live.size
        marginals[live, j] = current - previous[live]
        previous[live] = current
        if truncation_tolerance > 0:
            active[live] = np.abs(full - current) >= truncation_tolerance
    return marginals, steps
