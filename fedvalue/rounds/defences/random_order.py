"""Random-order values with arrivals in proportion to size: what one participant earns does
not grow with the number of identities it splits its data into.

Within-round ADS ([ADS] Remark 4.1) averages a player's marginal v(P ∪ {i}) − v(P) over
uniformly random orders of arrival. Under uniform orders a participant that splits its data
across k identities arrives k times: when the round's updates are nearly interchangeable (IID
data: any one update already moves the model most of the way) it collects k of the n + k − 1
first arrivals instead of one of n. Here player i arrives at an exponential time of rate
λ_i (its weight, the examples it claims): the order is drawn by picking the next player with
probability λ_i / Σ_{j not yet arrived} λ_j (a Plackett–Luce order). The k identities of a
split have rates summing to the participant's own, and the first of them arrives exactly
when the participant would have (the minimum of exponentials of rates λ/k is exponential
of rate λ), so the split buys no extra first arrivals. With equal rates the orders are
uniform and the values are Shapley's, i.e. within-round ADS itself.

The value is a random-order value: efficient (Σ_i φ_i = v(N) − v(∅)), null players get 0.

* Exact: φ_i = Σ_{S ⊆ N∖{i}} p(S) λ_i / (Λ − λ(S)) [v(S ∪ {i}) − v(S)], where p(S), the
  probability that the first |S| arrivals are S, follows p(∅) = 1,
  p(S) = Σ_{j∈S} p(S∖{j}) λ_j / (Λ − λ(S∖{j})).
* Monte Carlo: m orders (keys E_i / λ_i, E_i ~ Exp(1), sorted), each giving every player's
  marginal in one pass; the standard error is the marginals' over √m.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

from fedvalue.valuation.game import CoalitionGame

#: Most players valued exactly (2^n coalitions and an n × 2^n recursion).
MAX_EXACT_PLAYERS = 16


def _parent_masks(game: CoalitionGame, players: Sequence[Hashable]) -> np.ndarray:
    """Game mask of every subset of ``players`` (bit k of the local mask is players[k])."""
    local = np.arange(1 << len(players), dtype=np.int64)
    parent = np.zeros_like(local)
    for k, player in enumerate(players):
        parent |= ((local >> k) & 1) << game.index_of(player)
    return parent


def exact_random_order_values(game: CoalitionGame, players: Sequence[Hashable],
                              rates: Sequence[float]) -> np.ndarray:
    """φ of every player of ``players`` (a subset of the game's) by the exact recursion."""
    n = len(players)
    if n > MAX_EXACT_PLAYERS:
        raise ValueError(f"players: exact random-order values enumerate 2^n coalitions, at most "
                         f"{MAX_EXACT_PLAYERS} players; got {n}. Use Monte Carlo orders.")
    rates = np.asarray(rates, dtype=np.float64)
    local = np.arange(1 << n, dtype=np.int64)
    utilities = game.values(_parent_masks(game, players).tolist())
    arrived = np.zeros(1 << n)
    for k in range(n):
        arrived += ((local >> k) & 1) * rates[k]
    remaining = rates.sum() - arrived
    sizes = np.zeros(1 << n, dtype=np.int64)
    for k in range(n):
        sizes += (local >> k) & 1
    first = np.zeros(1 << n)
    first[0] = 1.0
    for size in range(n):
        layer = local[sizes == size]
        for k in range(n):
            sources = layer[((layer >> k) & 1) == 0]
            first[sources | (1 << k)] += first[sources] * rates[k] / remaining[sources]
    values = np.empty(n)
    for k in range(n):
        without = local[((local >> k) & 1) == 0]
        values[k] = float(np.sum(first[without] * rates[k] / remaining[without]
                                 * (utilities[without | (1 << k)] - utilities[without])))
    return values


def sampled_random_order_values(game: CoalitionGame, players: Sequence[Hashable], rates: Sequence[float],
                                num_orders: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(φ̂, standard error) from ``num_orders`` orders drawn with arrival rates ``rates``."""
    n = len(players)
    keys = rng.exponential(size=(num_orders, n)) / np.asarray(rates, dtype=np.float64)
    order = np.argsort(keys, axis=1, kind="stable")
    bits = np.array([1 << game.index_of(p) for p in players], dtype=object)
    masks = []
    for row in order.tolist():
        mask = 0
        masks.append(mask)
        for k in row:
            mask |= int(bits[k])
            masks.append(mask)
    steps = np.diff(game.values(masks).reshape(num_orders, n + 1), axis=1)
    marginals = np.empty_like(steps)
    np.put_along_axis(marginals, order, steps, axis=1)
    stderr = (marginals.std(axis=0, ddof=1) / math.sqrt(num_orders)) if num_orders > 1 else np.full(n, np.nan)
    return marginals.mean(axis=0), stderr
