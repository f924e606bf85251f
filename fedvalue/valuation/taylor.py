"""Within-round values from the round game's Taylor expansion at A_{t−1}: no coalition evaluated but the anchors.

Round t of FedAvg's family starts from A = A_{t−1}; its valid replies k ∈ I_t (n of them) carry weights n_k
and updates Δ_k = w_k − A; U is differentiable at A with gradient g = ∇U(A) and Hessian H = ∇²U(A). The
round game v(S) = U(A + x_S) ([ADS] Remark 4.1, Eq. 10; :mod:`fedvalue.valuation.round_game`) has the step
x_S of its coalition rule, and its expansion to order two is

    v̂(S) − v(∅) = g·x_S + ½ x_Sᵀ H x_S.

The Shapley value of the expanded game v̂ ([ADS] Eq. 9 with one group) is computed from the round's
structure (a_k = g·Δ_k, and Hessian-vector products), with no coalition of v evaluated:

* **fixed-weight** rule, x_S = Σ_{k∈S} u_k, u_k = p_k Δ_k, p_k = n_k / Σ_{j∈I_t} n_j.
  First order (``"first-order"``): v̂(S) − v(∅) = Σ_{k∈S} g·u_k is additive, so its Shapley value is
  exactly φ_k = g·u_k = p_k a_k. Second order (``"second-order"``): v̂(S) − v(∅) = Σ_{k∈S} (g·u_k +
  ½ u_kᵀHu_k) + Σ_{j<k, j,k∈S} u_jᵀHu_k, an additive game plus pairwise terms, each pair's term shared
  equally by its two members:

      φ_k = g·u_k + ½ u_kᵀH u_k + ½ Σ_{j≠k} u_jᵀH u_k = u_k·(g + ½ H U),   U = Σ_{j∈I_t} u_j,

  with ONE Hessian-vector product H U (U is the round's realized step A_t − A, to rounding). A reply with
  Δ_k = 0 (a free-rider's) is a null player of v̂: φ_k = 0.0 exactly.
* **renormalized** rule, x_S = Σ_{k∈S} q^S_k Δ_k, q^S_k = n_k / n_S, n_S = Σ_{j∈S} n_j (S ≠ ∅). First
  order: v̂(S) − v(∅) = Σ_{k∈S} (n_k / n_S) a_k, the n-weighted mean of the a_k over S: not additive (a
  member shifts every other member's share), so the game is valued as it is (below). With equal weights
  its Shapley value is φ_k = (1/n)[a_k + (H_n − 1)(a_k − mean_{j≠k} a_j)], H_n the n-th harmonic number.
  Second order: v̂(S) − v(∅) = Σ_{k∈S} q^S_k a_k + ½ Σ_{j,k∈S} q^S_j q^S_k M_jk with M_jk = Δ_jᵀ H Δ_k:
  n Hessian-vector products H Δ_k (M symmetrized, (M + Mᵀ)/2, against rounding). A free-rider's Δ_k = 0
  still dilutes every coalition's step, so it is not a null player.

  The expanded game is a function of n scalars and an n×n matrix: its Shapley value is computed by
  enumeration (the subset form of :func:`fedvalue.valuation.ads.subset_form`) for n ≤
  :data:`MAX_ENUMERATED_PLAYERS`, else by MC-ADS (Alg. 1, m* permutations of the settings' ε, δ, r) on
  the scalar game with the round's generator, booking its sampling standard error.

Every estimate is efficient for v̂ (Σ_k φ_k = v̂(I_t) − v(∅)), not for v: the booked efficiency gap,
Σ_k φ_k − (v(I_t) − v(∅)) with v(∅) = U(A) and v(I_t) evaluated as for every estimator (2 evaluations),
is the expansion's remainder at I_t. Nothing bounds the remainder (it grows with the steps and with U's
higher derivatives); the standard error booked is 0.0 (no sampling), except past enumeration.

Only a round game of FedAvg's family has this structure (:func:`fedvalue.valuation.round_game.fedavg_round_game`
attaches it as :class:`FedAvgRound`), and only a differentiable U: ``differentiable`` true, with
``gradient(arrays)`` and ``hessian_vector_product(arrays, vector)``
(:class:`fedvalue.scoring.torch_utilities.TorchModelUtility` with ``metric="neg_loss"`` or ``"neg_mse"``).
First-order influence as a client's value: [FEDIF]; the fixed-weight step is the FL form
of [RECIP]'s TracIn term, −(p_u Δ_u)·g.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedvalue._checks import check_seed
from fedvalue.valuation.ads import ads, subset_form
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.plan import plan_expansion
from fedvalue.valuation.result import ValuationResult
from fedvalue.valuation.settings import EXPANSION_METHODS, FIXED_WEIGHT, RENORMALIZED, AdsSettings

#: Past this many players the renormalized rule's expanded game is valued by MC-ADS, not enumerated (2^16
#: scalar coalitions take about 0.2 s on one core; 2^20 take seconds).
MAX_ENUMERATED_PLAYERS = 16
#: Coalitions of the expanded game tabulated at once when it is enumerated (memory: this × n floats).
TABLE_CHUNK = 1 << 14


@dataclass(frozen=True)
class FedAvgRound:
    """What a round game of FedAvg's family is built from, for the expansions at A_{t−1}: the players in
    round order, A_{t−1}, their replies and weights, U and the coalition rule."""

    client_ids: tuple[Hashable, ...]
    start_arrays: Mapping[str, np.ndarray]
    client_arrays: tuple[Mapping[str, np.ndarray], ...]
    weights: tuple[float, ...]
    utility: object
    rule: str


def expansion_shortfall(utility: object, method: str) -> str | None:
    """None when ``utility`` can expand the round game by ``method``: differentiable (``differentiable`` true)
    with ``gradient`` (both methods) and ``hessian_vector_product`` (second order); else what it is, for an
    error's "got" ("TorchModelUtility with metric='accuracy' (not differentiable)")."""
    missing = [name for name in _derivatives_needed(method) if not callable(getattr(utility, name, None))]
    if getattr(utility, "differentiable", False) is True and not missing:
        return None
    metric = getattr(utility, "metric", None)
    return f"{type(utility).__name__}" + (f" with metric={metric!r}" if metric is not None else "") + (
        f" (no {', '.join(missing)})" if missing else " (not differentiable)")


def _derivatives_needed(method: str) -> tuple[str, ...]:
    return ("gradient",) if method == "first-order" else ("gradient", "hessian_vector_product")


def check_expandable(utility: object, method: str) -> None:
    """ValueError naming ``method`` unless ``utility`` can expand the round game by it (:func:`expansion_shortfall`)."""
    got = expansion_shortfall(utility, method)
    if got is None:
        return
    needs = _derivatives_needed(method)
    raise ValueError(f"method: {method!r} expands the round game at A_{{t−1}} and needs a differentiable utility "
                     f"with differentiable=True and {' and '.join(f'{n}()' for n in needs)} of U itself "
                     "(TorchModelUtility with metric='neg_loss' or 'neg_mse'); got "
                     f"{got}. Use such a utility, or an estimator of coalitions ('auto', 'exact', 'mc', ...).")


def expansion_ads(game: CoalitionGame, settings: AdsSettings, *,
                  seed: int | np.random.Generator | None = None) -> ValuationResult:
    """ADS of the round's players by ``settings.method`` (``"first-order"`` or ``"second-order"``, module
    docstring) from the :class:`FedAvgRound` that ``game`` carries; the anchors v(∅), v(I_t) are evaluated
    on ``game`` (its only evaluations) for the efficiency gap. ValueError naming ``method`` for a game
    without that structure (a round aggregated by the inner strategy's own code) or a utility that is not
    differentiable, naming ``budget`` or ``max_evaluations`` when the anchors do not fit."""
    method = settings.method
    if method not in EXPANSION_METHODS:
        raise ValueError(f"method: expected one of {list(EXPANSION_METHODS)}; got {method!r}.")
    structure = getattr(game, "fedavg_round", None)
    if not isinstance(structure, FedAvgRound):
        raise ValueError(f"method: {method!r} values a round of FedAvg's family from its structure (A_{{t−1}}, the "
                         "updates and weights); this round game holds coalition values only (a round aggregated by "
                         "the inner strategy's own code): use an estimator of coalitions ('auto', 'exact', 'mc', ...).")
    check_expandable(structure.utility, method)
    rng = check_seed(seed)
    game.expect(plan_expansion(settings))
    before_count = game.num_evaluations
    values, stderr, permutations = expansion_values(structure, method, settings, rng)
    before, after = game.values([0, game.full_mask])
    players = list(structure.client_ids)
    index = pd.Index(players, dtype=object, name="player")
    gap = float(values.sum() - (after - before))
    return ValuationResult(
        method=f"ads-{method}",
        values=pd.Series(values, index=index, name="ads"),
        stderr=pd.Series(stderr, index=index, name="stderr"),
        num_evaluations=game.num_evaluations - before_count,
        groups=(tuple(players),),
        prefix_utilities=(float(before), float(after)),
        efficiency_gaps=pd.Series([gap], index=pd.RangeIndex(1, name="group"), name="gap"),
        num_permutations=permutations,
    )


def expansion_values(structure: FedAvgRound, method: str, settings: AdsSettings | None = None,
                     seed: int | np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray, int | None]:
    """(φ, standard errors, MC permutations or None) of the expanded game of ``structure`` by ``method``,
    in round order (module docstring); ``settings`` and ``seed`` serve the renormalized rule past
    :data:`MAX_ENUMERATED_PLAYERS` only."""
    utility, start = structure.utility, structure.start_arrays
    weights = np.asarray(structure.weights, dtype=np.float64)
    deltas = [_flat_update(arrays, start) for arrays in structure.client_arrays]
    gradient = _flat(utility.gradient(start), start)
    a = np.array([_dot(gradient, delta) for delta in deltas])
    n = len(deltas)
    if structure.rule == FIXED_WEIGHT:
        shares = weights / float(weights.sum())
        if method == "first-order":
            return shares * a, np.zeros(n), None
        step = sum(share * delta for share, delta in zip(shares, deltas))
        curvature = _flat(utility.hessian_vector_product(start, _arrays_of(step, start)), start)
        return shares * (a + 0.5 * np.array([_dot(delta, curvature) for delta in deltas])), np.zeros(n), None
    if structure.rule != RENORMALIZED:
        raise ValueError(f"rule: expected {FIXED_WEIGHT!r} or {RENORMALIZED!r}; got {structure.rule!r}.")
    pairs = None
    if method == "second-order":
        products = [_flat(utility.hessian_vector_product(start, _arrays_of(delta, start)), start) for delta in deltas]
        pairs = np.array([[_dot(delta, product) for product in products] for delta in deltas])
        pairs = 0.5 * (pairs + pairs.T)
    return renormalized_shapley(a, weights, pairs, settings, seed)


def renormalized_values(bits: np.ndarray, a: np.ndarray, weights: np.ndarray,
                        pairs: np.ndarray | None) -> np.ndarray:
    """v̂(S) − v(∅) of the renormalized rule's expanded game for the coalitions whose 0/1 rows are ``bits``:
    Σ_{k∈S} q^S_k a_k (+ ½ q^Sᵀ M q^S with ``pairs`` M), q^S_k = n_k / n_S; 0 for S = ∅."""
    mass = bits @ weights
    shares = np.divide(bits * weights, mass[:, None], out=np.zeros_like(bits), where=mass[:, None] > 0)
    values = shares @ a
    if pairs is not None:
        values = values + 0.5 * ((shares @ pairs) * shares).sum(axis=1)
    return values


def renormalized_shapley(a: np.ndarray, weights: np.ndarray, pairs: np.ndarray | None,
                         settings: AdsSettings | None = None, seed: int | np.random.Generator | None = None
                         ) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Shapley value of the renormalized rule's expanded game (:func:`renormalized_values`): exact by
    enumeration up to :data:`MAX_ENUMERATED_PLAYERS` players (stderr 0), else MC-ADS on the scalar game
    with ``settings``' ε, δ, r and ``seed`` (its standard errors and permutations)."""
    n = len(a)
    if n <= MAX_ENUMERATED_PLAYERS:
        local = np.arange(1 << n, dtype=np.int64)
        table = np.concatenate([
            renormalized_values(((local[start:start + TABLE_CHUNK, None] >> np.arange(n)) & 1).astype(np.float64),
                                a, weights, pairs)
            for start in range(0, 1 << n, TABLE_CHUNK)])
        return subset_form(table, n), np.zeros(n), None
    settings = AdsSettings() if settings is None else settings

    def batch(coalitions: Sequence[frozenset]) -> list[float]:
        bits = np.zeros((len(coalitions), n))
        for row, coalition in enumerate(coalitions):
            bits[row, list(coalition)] = 1.0
        return renormalized_values(bits, a, weights, pairs).tolist()

    scalar = CoalitionGame(None, range(n), batch_utility=batch)
    sampled = AdsSettings(method="mc", epsilon=settings.epsilon, delta=settings.delta, r=settings.r)
    result = ads(scalar, [list(range(n))], sampled, seed=check_seed(seed))
    return result.values.to_numpy(), result.stderr.to_numpy(), result.num_permutations


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    """x·y by numpy's pairwise sum of the products: the same order on every machine, and no BLAS threads (whose
    wake-ups cost milliseconds a call on a busy machine)."""
    return float(np.sum(x * y))


def _flat(arrays: Mapping[str, np.ndarray], like: Mapping[str, np.ndarray]) -> np.ndarray:
    """The entries of ``arrays`` in ``like``'s key order, raveled and joined, in float64."""
    return np.concatenate([np.asarray(arrays[key], dtype=np.float64).ravel() for key in like])


def _flat_update(arrays: Mapping[str, np.ndarray], start: Mapping[str, np.ndarray]) -> np.ndarray:
    """Δ_k = w_k − A_{t−1} in the arrays' own dtype (as the fixed-weight rule forms it), then float64, flat."""
    return np.concatenate([np.asarray(np.asarray(arrays[key]) - start[key], dtype=np.float64).ravel()
                           for key in start])


def _arrays_of(flat: np.ndarray, like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A flat float64 vector cut back into arrays shaped as ``like``'s entries, in its key order."""
    arrays, offset = {}, 0
    for key, value in like.items():
        size = int(np.size(value))
        arrays[key] = flat[offset:offset + size].reshape(np.shape(value))
        offset += size
    return arrays
