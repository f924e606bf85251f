"""Reference answers for the estimator tests: brute force and small closed-form games."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Sequence

import numpy as np


def ordered_permutation_values(
    utility: Callable[[frozenset], float], groups: Sequence[Sequence[Hashable]]
) -> dict[Hashable, float]:
    """ADS by its permutation form ([ADS], Eqs. 7–8): the mean marginal over every
    permutation that keeps the group order, 1/Π|D_t|! each."""
    totals = {p: 0.0 for g in groups for p in g}
    count = 0
    for parts in itertools.product(*(itertools.permutations(g) for g in groups)):
        order = [p for part in parts for p in part]
        prefix: frozenset = frozenset()
        before = utility(prefix)
        for player in order:
            prefix = prefix | {player}
            after = utility(prefix)
            totals[player] += after - before
            before = after
        count += 1
    return {p: total / count for p, total in totals.items()}


def shapley_subset_formula(utility: Callable[[frozenset], float], players: Sequence[Hashable]) -> dict:
    """Classical Shapley value, Σ_S |S|!(n−|S|−1)!/n! [v(S∪i) − v(S)]."""
    n = len(players)
    values = {}
    for player in players:
        others = [p for p in players if p != player]
        total = 0.0
        for size in range(n):
            weight = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
            for subset in itertools.combinations(others, size):
                s = frozenset(subset)
                total += weight * (utility(s | {player}) - utility(s))
        values[player] = total
    return values


def random_table_game(players: Sequence[Hashable], seed: int) -> Callable[[frozenset], float]:
    """A game with an independent uniform value per coalition (no structure to exploit)."""
    rng = np.random.default_rng(seed)
    table = {
        frozenset(c): float(rng.uniform())
        for size in range(len(players) + 1)
        for c in itertools.combinations(players, size)
    }
    return lambda coalition: table[frozenset(coalition)]


class CountingUtility:
    """Wraps a utility and records every coalition it is asked for."""

    def __init__(self, utility: Callable[[frozenset], float]) -> None:
        self.utility = utility
        self.calls: list[frozenset] = []

    def __call__(self, coalition: frozenset) -> float:
        self.calls.append(coalition)
        return self.utility(coalition)
