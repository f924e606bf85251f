"""The round game of federated learning and its valuation ([ADS], Remark 4.1).

Round t samples clients I_t; the server holds the realized state A_{t−1} and client i
returns arrays w_i with weight n_i. The round game is

    v_t(S) = U(Agg_t(A_{t−1}; {w_i : i ∈ S})),   S ⊆ I_t,   v_t(∅) = U(A_{t−1}),

with Agg_t the strategy's own aggregation rule and U a held-out utility. Within-round
ADS is ADS with the single group I_t on this game (Eq. 10); within-round LOO is
v_t(I_t) − v_t(I_t ∖ {i}) (App. C.2). Both share one coalition cache.

For FedAvg's family the coalition rule is a setting (:data:`fedvalue.valuation.settings.COALITION_RULES`):

* ``renormalized`` (the default): Agg_t applied to S as FedAvg would, A_S = Σ_{k∈S} (n_k / Σ_{j∈S} n_j) w_k.
  A reply equal to A_{t−1} (a free-rider's) dilutes every coalition's step, and may earn credit
  where the steps overshoot.
* ``fixed-weight``: each member keeps the weight it has in the round,
  A_S = A_{t−1} + Σ_{k∈S} p_k Δ_k, p_k = n_k / Σ_{j∈I_t} n_j, Δ_k = w_k − A_{t−1}. The grand coalition is
  A_t (to rounding: summed in this form, so that a reply with Δ_k = 0 is a null player exactly, its ADS
  and LOO 0.0, not a rounding error).

Arrays are ``dict[str, np.ndarray]`` in a fixed key order (a model's state).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedvalue.valuation.ads import ads

from fedvalue.valuation.plan import exact_num_coalitions
from fedvalue.valuation.game import CoalitionGame, Progress
from fedvalue.valuation.loo import loo
from fedvalue.valuation.result import ValuationResult
from fedvalue.valuation.settings import COALITION_RULES, EXPANSION_METHODS, FIXED_WEIGHT, RENORMALIZED, AdsSettings
from fedvalue.valuation.taylor import FedAvgRound, expansion_ads
from fedvalue._checks import check_choice
from fedvalue.schema import Method, VALUATION_METHODS as SCHEMA_VALUATION_METHODS

Arrays = dict[str, np.ndarray]
#: Aggregates the replies of a coalition (ids in round order) into new global arrays.
Aggregator = Callable[[Sequence[Hashable]], Arrays]
ArraysUtility = Callable[[Mapping[str, np.ndarray]], float]
BatchArraysUtility = Callable[[Sequence[Mapping[str, np.ndarray]]], Sequence[float]]

#: Coalition states materialized at once for a batch utility (memory: this many model states).
STATES_PER_BATCH = 64
#: Valuation methods the platform computes per round (named in fedvalue.schema).
VALUATION_METHODS = SCHEMA_VALUATION_METHODS


def weighted_mean(
    client_arrays: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> Arrays:
    """FedAvg's rule: Σ_i (n_i / Σ_j n_j) w_i, accumulated in the arrays' own dtype and
    in client order, exactly as Flower's ``aggregate_arrayrecords`` does, so the full
    coalition reproduces the realized state bit for bit."""
    if len(client_arrays) == 0:
        raise ValueError("client_arrays: expected at least one client's arrays; got none.")
    total = float(sum(weights))
    if not total > 0:
        raise ValueError(f"weights: expected a positive total weight; got {list(weights)}.")
    result: Arrays = {}
    for arrays, weight in zip(client_arrays, weights):
        factor = weight / total
        for key, value in arrays.items():
            if key in result:
                result[key] += value * factor
            else:
                result[key] = value * factor
    return result


def fedavg_aggregator(
    client_ids: Sequence[Hashable],
    client_arrays: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
) -> Aggregator:
    """Aggregator of the FedAvg family (FedAvg, FedProx): the n-weighted mean, pure."""
    position = {c: k for k, c in enumerate(client_ids)}

    def aggregate(coalition: Sequence[Hashable]) -> Arrays:
        members = sorted(position[c] for c in coalition)
        return weighted_mean([client_arrays[k] for k in members], [weights[k] for k in members])

    return aggregate


def fixed_weight_aggregator(
    client_ids: Sequence[Hashable],
    start_arrays: Mapping[str, np.ndarray],
    client_arrays: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
) -> Aggregator:
    """The fixed-weight coalition rule: A_S = A_{t−1} + Σ_{k∈S} p_k Δ_k, p_k = n_k / Σ_{j∈I_t} n_j, summed in
    that form for every S, the grand coalition included (a Δ_k of zeros then leaves A_S bit for bit as it
    was: a reply equal to A_{t−1} is a null player exactly, not to rounding; A_{I_t} is FedAvg's A_t to
    rounding, not bit for bit)."""
    position = {c: k for k, c in enumerate(client_ids)}
    total = float(sum(weights))
    deltas = update_arrays(start_arrays, client_arrays)

    def aggregate(coalition: Sequence[Hashable]) -> Arrays:
        members = sorted(position[c] for c in coalition)
        state = {key: value * 1.0 for key, value in start_arrays.items()}  # the dtype FedAvg's mean has
        for k in members:
            share = weights[k] / total
            for key, delta in deltas[k].items():
                state[key] += delta * share
        return state

    return aggregate


def update_arrays(start_arrays: Mapping[str, np.ndarray],
                  client_arrays: Sequence[Mapping[str, np.ndarray]]) -> list[Arrays]:
    """Δ_k = w_k − A_{t−1} of each reply, in the arrays' own dtype (exactly zero for a reply equal to A_{t−1})."""
    return [{key: np.asarray(arrays[key]) - start_arrays[key] for key in start_arrays} for arrays in client_arrays]


def coalition_aggregator(
    rule: str,
    client_ids: Sequence[Hashable],
    start_arrays: Mapping[str, np.ndarray],
    client_arrays: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
) -> Aggregator:
    """Agg_t of FedAvg's family under the coalition ``rule`` (module docstring), on the plain path."""
    if rule == FIXED_WEIGHT:
        return fixed_weight_aggregator(client_ids, start_arrays, client_arrays, weights)
    return fedavg_aggregator(client_ids, client_arrays, weights)


def fedavg_round_game(
    client_ids: Sequence[Hashable],
    start_arrays: Mapping[str, np.ndarray],
    client_arrays: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
    utility: ArraysUtility,
    rule: str = RENORMALIZED,
) -> CoalitionGame:
    """v_t of the FedAvg family under the coalition ``rule``, with coalitions scored as linear
    combinations.

    A coalition's state is A_{t−1} for S = ∅ and Σ_{i∈S} (n_i / Σ_{j∈S} n_j) w_i
    otherwise (renormalized), or (Σ_{j∉S} n_j / N) A_{t−1} + Σ_{i∈S} (n_i / N) w_i with N = Σ_{j∈I_t} n_j
    (fixed-weight): a row of coefficients over the basis (A_{t−1}, w_1, ..., w_n). A
    utility with a ``linear`` method (:class:`~fedvalue.scoring.torch_utilities.TorchModelUtility`)
    scores whole batches of such rows without materializing each state, reusing the
    first layer's products; others get the materialized states. v(∅) = U(A_{t−1}) and
    v(I_t) = U(A_t) are always scored on the plain path, so the round's anchors equal
    what anyone recomputes from the saved states, bit for bit.

    The game carries the round it was built from as ``fedavg_round`` (a
    :class:`~fedvalue.valuation.taylor.FedAvgRound`), from which :func:`value_round` computes the
    expansion methods (:data:`~fedvalue.valuation.settings.EXPANSION_METHODS`).
    """
    check_choice("coalition_rule", rule, COALITION_RULES)
    structure = FedAvgRound(tuple(client_ids), start_arrays, tuple(client_arrays), tuple(float(w) for w in weights),
                            utility, rule)
    aggregate = coalition_aggregator(rule, client_ids, start_arrays, client_arrays, weights)
    if not getattr(utility, "supports_linear", False):
        game = round_game(client_ids, start_arrays, aggregate, utility, batch_utility=getattr(utility, "batch", None))
        game.fedavg_round = structure
        return game
    position = {c: k for k, c in enumerate(client_ids)}
    weights = np.asarray(weights, dtype=np.float64)
    total = float(weights.sum())
    full = frozenset(client_ids)
    scorer = None
    # Under the fixed-weight rule a reply equal to A_{t−1} (Δ_k = 0) leaves every coalition's state as it was, so
    # S ∪ {k} is scored as S itself: a null player exactly, whatever path or kernel would have scored it.
    # Over the basis (A_{t−1}, Δ_1, ..., Δ_n) under the fixed-weight rule, (A_{t−1}, w_1, ..., w_n) otherwise.
    basis = update_arrays(start_arrays, client_arrays) if rule == FIXED_WEIGHT else client_arrays
    null = frozenset(c for c, delta in zip(client_ids, basis)
                     if not any(np.any(d) for d in delta.values())) if rule == FIXED_WEIGHT else frozenset()
    known: dict[frozenset, float] = {}

    def canonical(coalition: frozenset) -> frozenset:
        """The coalition without its null replies; the grand coalition's own key when that is all the others."""
        kept = coalition - null
        return full if kept and kept == full - null else kept

    def arrays_of(coalition: frozenset) -> Mapping[str, np.ndarray]:
        if not coalition:
            return start_arrays
        return aggregate(sorted(coalition, key=position.__getitem__))

    def row_of(coalition: frozenset) -> np.ndarray:
        row = np.zeros(len(client_ids) + 1)
        if not coalition:
            row[0] = 1.0
            return row
        members = [1 + position[c] for c in coalition]
        row[members] = weights[[m - 1 for m in members]]
        if rule == FIXED_WEIGHT:  # over the basis (A_{t−1}, Δ_1, ..., Δ_n): A_{t−1} + Σ_{k∈S} p_k Δ_k
            row[0] = total
            return row / total
        return row / row.sum()

    def batch(coalitions: Sequence[frozenset]) -> list[float]:
        nonlocal scorer
        keys = [canonical(coalition) for coalition in coalitions]
        fast = []
        for key in dict.fromkeys(keys):
            if key in known:
                continue
            if not key or key == full:
                known[key] = utility(arrays_of(key))
            else:
                fast.append(key)
        if fast:
            if scorer is None:
                scorer = utility.linear([start_arrays, *basis])
            rows = np.stack([row_of(key) for key in fast])
            scored = scorer.values(rows, materialize=lambda j: arrays_of(fast[j]), progress=game.advance)
            for key, value in zip(fast, scored):
                known[key] = float(value)
        return [known[key] for key in keys]

    game = CoalitionGame(None, client_ids, batch_utility=batch)
    game.fedavg_round = structure
    return game


@dataclass
class RoundValuation:
    """What valuing one round produced."""

    results: dict[str, ValuationResult]
    game: CoalitionGame
    utility_before: float
    utility_after: float
    seconds: float

    @property
    def num_evaluations(self) -> int:
        return self.game.num_evaluations


def round_game(
    client_ids: Sequence[Hashable],
    start_arrays: Mapping[str, np.ndarray],
    aggregate: Aggregator,
    utility: ArraysUtility,
    *,
    batch_utility: BatchArraysUtility | None = None,
) -> CoalitionGame:
    """v_t as a :class:`CoalitionGame` over ``client_ids`` (see module docstring).

    The coalitions given to ``aggregate`` list client ids in round order, so a
    strategy that depends on reply order sees the realized order.
    """
    order = {c: k for k, c in enumerate(client_ids)}

    def arrays_of(coalition: frozenset) -> Mapping[str, np.ndarray]:
        if not coalition:
            return start_arrays
        return aggregate(sorted(coalition, key=order.__getitem__))

    def single(coalition: frozenset) -> float:
        return utility(arrays_of(coalition))

    batch = None
    if batch_utility is not None:
        def batch(coalitions: Sequence[frozenset]) -> Sequence[float]:
            # A batch can be thousands of coalitions (MC asks for every prefix at once), each
            # state a model's size: materialize them a chunk at a time.
            values: list[float] = []
            for start in range(0, len(coalitions), STATES_PER_BATCH):
                chunk = coalitions[start:start + STATES_PER_BATCH]
                values.extend(batch_utility([arrays_of(c) for c in chunk]))
                game.advance(len(chunk))
            return values

    game = CoalitionGame(single, client_ids, batch_utility=batch)
    return game


def round_game_for(
    client_ids: Sequence[Hashable],
    start_arrays: Mapping[str, np.ndarray],
    client_arrays: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
    utility: ArraysUtility,
    aggregate: Aggregator | None = None,
    rule: str = RENORMALIZED,
) -> CoalitionGame:
    """v_t over ``client_ids``: the FedAvg family's weighted mean under the coalition ``rule``
    (``aggregate`` None, :func:`fedavg_round_game`), or the inner strategy's own Agg_t (:func:`round_game`,
    with the utility's batch scoring when it has one; the renormalized rule only: a coalition is what
    the strategy makes of its replies). The live books, the fairness books and the audit all build a
    round's game here."""
    if aggregate is None:
        return fedavg_round_game(client_ids, start_arrays, client_arrays, weights, utility, rule)
    if rule != RENORMALIZED:
        raise ValueError(f"coalition_rule: {rule!r} is defined for FedAvg's weighted mean; a round aggregated by "
                         "the inner strategy's own code takes 'renormalized' (its own rule on each coalition).")
    return round_game(client_ids, start_arrays, aggregate, utility, batch_utility=getattr(utility, "batch", None))


def ads_share_of_budget(budget: int, num_players: int, methods: Sequence[str]) -> int:
    """The coalition evaluations of a round's ``budget`` that ADS may spend: all of them, or
    all but LOO's n + 1 when LOO is booked too and exact ADS (whose coalitions include LOO's)
    does not fit. :func:`value_round` spends it so; a run checks its budget against it first."""
    if Method.LOO in methods and exact_num_coalitions([range(num_players)]) > budget:
        return budget - (num_players + 1)
    return budget


def round_rng(seed: int, server_round: int) -> np.random.Generator:
    """The generator of round t's MC permutations: ``[seed, t]``. The writer and the audit
    both take it from here, so an audit reproduces an MC-valued round."""
    return np.random.default_rng([int(seed), int(server_round)])


def value_round(
    game: CoalitionGame,
    methods: Sequence[str] = VALUATION_METHODS,
    settings: AdsSettings | None = None,
    *,
    seed: int | np.random.Generator | None = None,
    progress: Progress | None = None,
) -> RoundValuation:
    """Within-round ADS (one group I_t, Eq. 10) with ``settings`` and LOO on one shared cache.

    ``utility_before`` is v_t(∅) = U(A_{t−1}); ``utility_after`` is v_t(I_t), which for
    FedAvg is U(A_t), the realized next state. A ``settings.budget`` bounds the round's
    distinct coalition evaluations, LOO's n + 1 included: ADS gets the budget less n + 1
    unless exact enumeration fits in it (exact covers LOO's coalitions). ``progress`` is told
    (coalitions evaluated, coalitions planned) as the valuation goes
    (:meth:`fedvalue.valuation.game.CoalitionGame.watch`); it changes nothing that is computed.

    An expansion method (``settings.method`` ``"first-order"`` or ``"second-order"``) values ADS from the
    structure a game of :func:`fedavg_round_game` carries (:func:`fedvalue.valuation.taylor.expansion_ads`),
    evaluating the anchors v(∅) and v(I_t) only; ValueError naming ``method`` for any other game.
    """
    settings = AdsSettings() if settings is None else settings
    if not isinstance(settings, AdsSettings):
        raise TypeError(f"settings: expected a fedvalue.valuation.settings.AdsSettings or None; got {type(settings).__name__}.")
    unknown = [m for m in methods if m not in VALUATION_METHODS]
    if unknown:
        raise ValueError(
            f"methods: expected a subset of {list(VALUATION_METHODS)}; got unknown {unknown}."
        )
    started = time.perf_counter()
    players = list(game.players)
    results: dict[str, ValuationResult] = {}
    game.watch(progress)
    try:
        if Method.ADS in methods:
            if settings.budget is not None:  # LOO's evaluations come out of the same budget
                settings = dataclasses.replace(settings, budget=ads_share_of_budget(settings.budget, len(players),
                                                                                    methods))
            if settings.method in EXPANSION_METHODS:
                results[Method.ADS] = expansion_ads(game, settings, seed=seed)
            else:
                results[Method.ADS] = ads(game, [players], settings, seed=seed)
        if Method.LOO in methods:
            results[Method.LOO] = loo(game, players)
        before, after = game.values([0, game.full_mask])
        game.finish()
    finally:
        game.watch(None)
    return RoundValuation(
        results=results,
        game=game,
        utility_before=float(before),
        utility_after=float(after),
        seconds=time.perf_counter() - started,
    )


def __getattr__(name: str):
    """``ValuationSettings`` at its earlier import path, with a DeprecationWarning (its home is
    :mod:`fedvalue.valuation.settings`)."""
    if name == "ValuationSettings":
        import warnings

        from fedvalue.valuation.settings import ValuationSettings

        warnings.warn("fedvalue.valuation.settings.ValuationSettings moved to fedvalue.valuation.settings "
                      "(or the faces: fedvalue, strategies); import it from there.", DeprecationWarning, stacklevel=2)
        return ValuationSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
