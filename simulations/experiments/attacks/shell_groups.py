"""Shell groups in a data market: the broker of the replication market ([ADS] §6.1.2) splits
itself into m shell companies. Does that buy it anything?

Contributors own the originals (a class-balanced sample, shared equally among
``contributors``); the broker adds one exact copy of every original and splits its copies
into m shells at random. Utility: the K-NN utility on a class-balanced test sample ([ADS]
Thm 5.1). The broker's total is valued four ways for m = 1, 2, 4, ...:

* instance-level KNN-ADS, σ = (originals, shell_1, ..., shell_m) (exact, [ADS] Alg. 2): by
  group efficiency (Prop. 4.2) the shells together get v(all) − v(originals) for every m;
* party-level Shapley (DS), every contributor and every shell one player (exact over the
  2^(C+m) coalitions of parties): the shells arrive m times;
* party-level ADS, σ = (contributors, shells): group efficiency again;
* a misplaced shell: party-level ADS with one shell declared among the contributors (a lie
  about provenance, not a split) — what ordering by provenance cannot see.

gain = the broker's total with m shells / its total with one (1.0: the split buys nothing).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedvalue import CoalitionGame, KnnUtility, ads, knn_ads
from simulations.datasets import load_dataset, sample_per_class, split_holdout

METHODS = ("knn-ads", "party-ds", "party-ads", "party-ads-misplaced")


def market_data(dataset: str, seed: int, originals: int, test: int):
    """(x, y) of the originals and (x, y) of the test sample, class-balanced, from ``seed``."""
    pick_rng, test_rng, split_rng = np.random.default_rng([seed, 53]).spawn(3)
    if dataset == "fashion-mnist":
        pool, held = load_dataset(dataset, split="train"), load_dataset(dataset, split="test")
    else:
        pool, held = split_holdout(load_dataset(dataset), 0.5, seed=split_rng)
    chosen = sample_per_class(pool.y, originals, seed=pick_rng, name="shell_originals")
    tested = sample_per_class(held.y, test, seed=test_rng, name="shell_test")
    return pool.x[chosen], pool.y[chosen], held.x[tested], held.y[tested]


def _party_game(utility: KnnUtility, parties: dict[str, np.ndarray]) -> CoalitionGame:
    def value(coalition: frozenset) -> float:
        members = [parties[p] for p in coalition]
        return utility(np.concatenate(members)) if members else 0.0
    return CoalitionGame(value, list(parties))


def broker_totals(x, y, x_test, y_test, *, contributors: int, shells: int, k: int, seed: int) -> dict[str, float]:
    """The broker's total by each of :data:`METHODS` when it splits into ``shells`` shells."""
    n = len(y)
    rng = np.random.default_rng([seed, shells])
    owners = rng.permutation(np.arange(n) % contributors)
    parts = np.array_split(n + rng.permutation(n), shells)  # the copies' indices, one array a shell
    x_all, y_all = np.vstack([x, x]), np.concatenate([y, y])
    instance = knn_ads(x_all, y_all, x_test, y_test, [np.arange(n), *parts], k=k).instances.values
    utility = KnnUtility(x_all, y_all, x_test, y_test, k)
    parties = {f"contributor {c}": np.flatnonzero(owners == c) for c in range(contributors)}
    parties |= {f"shell {s}": part for s, part in enumerate(parts)}
    names = list(parties)
    contributor_names, shell_names = names[:contributors], names[contributors:]
    game = _party_game(utility, parties)
    totals = {"knn-ads": float(instance.loc[list(range(n, 2 * n))].sum())}
    for method, groups in (("party-ds", [names]), ("party-ads", [contributor_names, shell_names]),
                           ("party-ads-misplaced", [contributor_names + shell_names[:1], shell_names[1:]])):
        groups = [g for g in groups if g]
        values = ads(game, groups, method="exact").values
        totals[method] = float(values[shell_names].sum())
    return totals


def shell_groups_table(dataset: str, seed: int, shells: tuple[int, ...], *, contributors: int = 4,
                       originals: int = 200, test: int = 200, k: int = 5) -> pd.DataFrame:
    """A row per (number of shells, method): the broker's total and its gain over one shell."""
    x, y, x_test, y_test = market_data(dataset, seed, originals, test)
    rows = []
    whole = broker_totals(x, y, x_test, y_test, contributors=contributors, shells=1, k=k, seed=seed)
    for m in shells:
        totals = whole if m == 1 else broker_totals(x, y, x_test, y_test, contributors=contributors, shells=m, k=k,
                                                     seed=seed)
        rows += [{"seed": seed, "shells": m, "method": method, "broker_total": totals[method],
                  "gain": _ratio(totals[method], whole[HONEST_BASELINE.get(method, method)])} for method in METHODS]
    return pd.DataFrame(rows)


#: A misplaced shell is judged against the broker's honest ADS total (one group after the contributors).
HONEST_BASELINE = {"party-ads-misplaced": "party-ads"}


def _ratio(value: float, honest: float) -> float:
    return value / honest if honest else float("nan")
