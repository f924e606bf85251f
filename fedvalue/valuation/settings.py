"""The valuation layer's settings, checked once when made and passed whole: the ADS estimator's
(:class:`AdsSettings`, [ADS] Alg. 1 and §5) and how each round is valued (:class:`ValuationSettings`).
:func:`fedvalue.valuation.ads.ads`, :func:`fedvalue.valuation.round_game.value_round`, the valuing
strategy, the round records and the audit all take them from here."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from fedvalue._checks import check_choice, check_integer, check_non_negative, check_number, check_open_unit, check_positive
from fedvalue.schema import VALUATION_METHODS
from fedvalue.valuation.result import STDERR_ESTIMATORS

Method = Literal["auto", "exact", "mc", "tmc", "antithetic", "stratified", "kernelshap", "first-order",
                 "second-order", "adaptive"]
#: :data:`fedvalue.valuation.result.STDERR_ESTIMATORS`.
StderrEstimator = Literal["by-position", "plain"]
DecisionKind = Literal["threshold", "top-k"]
#: The estimators that value a round of FedAvg's family from its structure (the round game's Taylor
#: expansion at A_{t−1}, :mod:`fedvalue.valuation.taylor`), with no coalition evaluated but v(∅) and v(I_t).
EXPANSION_METHODS = ("first-order", "second-order")
#: Every ``method`` :class:`AdsSettings` takes: :func:`fedvalue.valuation.ads.ads`'s, and the expansions that
#: :func:`fedvalue.valuation.round_game.value_round` computes from a FedAvg round's structure.
#: The method that spends its evaluations on a decision of the caller's (:mod:`fedvalue.valuation.adaptive`).
ADAPTIVE = "adaptive"
METHODS = ("auto", "exact", "mc", "tmc", "antithetic", "stratified", "kernelshap", *EXPANSION_METHODS, ADAPTIVE)
#: The decisions ``method="adaptive"`` settles: a threshold cut on each value, or the top k.
THRESHOLD, TOP_K = "threshold", "top-k"
DECISIONS = (THRESHOLD, TOP_K)
#: The fields only ``method="adaptive"`` takes, with their defaults; :meth:`AdsSettings.as_dict` leaves them out
#: for every other method, so that the settings the records and run.json hold read as they did before.
ADAPTIVE_FIELDS = {"decision": None, "cut": None, "top_k": None, "z": 2.0}


@dataclass(frozen=True)
class AdsSettings:
    """The ADS estimator's settings, checked once when made and passed whole (to :func:`fedvalue.valuation.ads.ads`,
    :func:`fedvalue.valuation.round_game.value_round`, the valuing strategy and the round records the
    audit reads); :mod:`fedvalue.valuation.plan` turns them into what a call runs.

    Parameters
    ----------
    method
        ``"exact"`` (subset form, Eq. 9), ``"mc"`` (Alg. 1), ``"tmc"``, ``"antithetic"``,
        ``"stratified"``, ``"kernelshap"`` (:mod:`fedvalue.valuation.ads`) or ``"auto"``: exact when
        1 + Σ_t (2^{|D_t|} − 1) ≤ m*·n, otherwise MC, or with ``stderr_target`` the sampler a
        pilot projects to be cheapest. ``"first-order"`` and ``"second-order"`` value a round of
        FedAvg's family from the Taylor expansion of its round game at A_{t−1} (the Shapley value of the
        expanded game, :mod:`fedvalue.valuation.taylor`), for a differentiable utility only; they evaluate
        no coalition but v(∅) and v(I_t) and are efficient for the expanded game, not for the round game.
        ``"adaptive"`` (adaptive MC-ADS, :mod:`fedvalue.valuation.adaptive`) draws each player's marginals
        stratified by position and spends them only on the players whose ``decision`` is still unsure.
    epsilon, delta, r
        MC accuracy: P(‖φ̂ − φ‖_∞ ≤ ε) ≥ 1 − δ when one-step marginals lie in a range of width r
        (r = 1 for accuracy).
    max_evaluations
        Upper bound on real utility evaluations; a method whose worst case exceeds it raises
        instead of running.
    truncation_tolerance
        ``"tmc"`` only: absolute |v(U_t) − v(prefix)| under which the rest of a permutation's
        group is truncated (:mod:`fedvalue.valuation.ads`); 0 never truncates.
    stderr_target
        Sampling methods: stop sampling once every standard error is ≤ this (None: always their
        cap of samples).
    budget
        Most distinct coalition evaluations to spend (cached coalitions are free). ``"auto"``
        then takes exact when its coalitions fit, else the sampler of
        :data:`~fedvalue.valuation.plan.BUDGET_SAMPLERS` whose minimum fits; a sampling method
        draws until the budget is spent, or until ``stderr_target`` is met, instead of stopping
        at m*.
    stderr_estimator
        ``"mc"`` and ``"tmc"``: how each player's standard error is estimated
        (:data:`~fedvalue.valuation.result.STDERR_ESTIMATORS`, the formulas in :mod:`fedvalue.valuation.result`):
        ``"by-position"``, post-stratified by the player's position in each permutation, or ``"plain"``, the
        marginals' sample standard deviation over √m, which with a dozen permutations often understates the error
        (the standard error runs booked before; a round record that does not name the estimator was booked with
        it). ``stderr_target`` stops on it (and a pilot compares it), so with a target the permutations drawn, and
        the values, depend on it; without one the values are the same under both. ``"adaptive"`` books its own
        (stratified) standard error and takes the default.
    decision
        ``"adaptive"`` only: what the values decide, where the evaluations are spent
        (:mod:`fedvalue.valuation.adaptive`): ``"threshold"`` (player i settled when |φ̂_i − cut| ≥ z_L·se_i)
        or ``"top-k"`` (settled when its interval lies wholly on its side of the top ``top_k``'s boundary).
    cut
        ``"threshold"`` only: the cut c (0: "is this client harmful?").
    top_k
        ``"top-k"`` only: how many players the decision takes.
    z
        ``"adaptive"`` only: the one-look quantile of the decision's intervals (2: one-sided level 0.023); each
        of the L looks the schedule fixes tests at z_L with P(Z ≥ z_L) = P(Z ≥ z) / L (Bonferroni over looks).
        ``stderr_target`` stops drawing a player whose standard error is at most it, settled or not;
        ``budget`` caps the distinct evaluations, else ε, δ, r cap the draws (Alg. 1's m* marginals a player).
    """

    method: Method = "auto"
    epsilon: float = 0.1
    delta: float = 0.05
    r: float = 1.0
    max_evaluations: int | None = None
    truncation_tolerance: float = 1e-3
    stderr_target: float | None = None
    budget: int | None = None
    stderr_estimator: StderrEstimator = "by-position"
    decision: DecisionKind | None = None
    cut: float | None = None
    top_k: int | None = None
    z: float = 2.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"method: expected 'auto', 'exact', 'mc', 'tmc', 'antithetic', 'stratified' or 'kernelshap'; "
                f"got {self.method!r} (a round of FedAvg's family also takes 'first-order' or 'second-order'); a "
                "decision of yours (decision=...) takes 'adaptive'."
            )
        check_non_negative("truncation_tolerance", self.truncation_tolerance)
        check_number("stderr_target", self.stderr_target, low=0.0, low_open=True, none_ok=True)
        check_positive("epsilon", self.epsilon)
        check_open_unit("delta", self.delta)
        check_positive("r", self.r)
        check_integer("max_evaluations", self.max_evaluations, none_ok=True)
        check_integer("budget", self.budget, none_ok=True)
        check_choice("stderr_estimator", self.stderr_estimator, STDERR_ESTIMATORS)
        self._check_decision()

    def _check_decision(self) -> None:
        """The decision fields: all of what ``"adaptive"`` needs, and none of them for another method."""
        if self.method != ADAPTIVE:
            for name, default in ADAPTIVE_FIELDS.items():
                value = getattr(self, name)
                if value is not default and value != default:
                    raise ValueError(f"{name}: only method='adaptive' takes a decision; got {name}={value!r} with "
                                     f"method={self.method!r}. Set method='adaptive', or leave {name} out.")
            return
        if self.decision not in DECISIONS:
            raise ValueError(f"decision: method='adaptive' spends its evaluations on a decision; expected one of "
                             f"{list(DECISIONS)}; got {self.decision!r}.")
        if self.decision == THRESHOLD:
            check_number("cut", self.cut, why="the threshold the values are decided against")
            if self.top_k is not None:
                raise ValueError(f"top_k: a 'threshold' decision takes a cut, not top_k; got top_k={self.top_k!r}. "
                                 "Use decision='top-k', or leave top_k out.")
        else:
            check_integer("top_k", self.top_k, why="how many players the 'top-k' decision takes")
            if self.cut is not None:
                raise ValueError(f"cut: a 'top-k' decision takes top_k, not a cut; got cut={self.cut!r}. Use "
                                 "decision='threshold', or leave cut out.")
        check_positive("z", self.z)
        if self.stderr_estimator != "by-position":
            raise ValueError(f"stderr_estimator: method='adaptive' books its own stratified standard error; expected "
                             f"the default 'by-position'; got {self.stderr_estimator!r}.")

    def as_dict(self) -> dict:
        """The settings as the round records and run.json write them (JSON: names to numbers); the decision
        fields (:data:`ADAPTIVE_FIELDS`) only for ``"adaptive"``."""
        written = dataclasses.asdict(self)
        if self.method != ADAPTIVE:
            for name in ADAPTIVE_FIELDS:
                del written[name]
        return written


#: How the round game aggregates a coalition (:class:`ValuationSettings`' ``coalition_rule``).
RENORMALIZED, FIXED_WEIGHT = "renormalized", "fixed-weight"
COALITION_RULES = (RENORMALIZED, FIXED_WEIGHT)


@dataclass(frozen=True)
class ValuationSettings:
    """How each round is valued, checked once when made and passed whole.

    Parameters
    ----------
    methods
        Valuations per round, a subset of ``("ads", "loo")`` (none: the round is booked
        unvalued, its clients' statuses and weights only).
    ads
        The ADS estimator's settings (:class:`fedvalue.valuation.settings.AdsSettings`; its ``budget``
        bounds the round's distinct coalition evaluations, ADS and LOO together).
    coalition_rule
        How the round game aggregates a coalition S of the round's valid replies I_t
        (:mod:`fedvalue.valuation.round_game`): ``"renormalized"`` (the default, [ADS] Remark 4.1 as
        the inner strategy's own rule applied to S: FedAvg's weights n_k / Σ_{j∈S} n_j) or
        ``"fixed-weight"`` (A_{t−1} + Σ_{k∈S} p_k Δ_k with the round's weights p_k = n_k / Σ_{j∈I_t} n_j,
        for FedAvg's family only: a reply equal to A_{t−1} is then a null player).

    A display of the valuation's progress is a callback of the run, not a setting
    (:class:`strategies.valuing_settings.RunCallbacks`).
    """

    methods: tuple[str, ...] = tuple(VALUATION_METHODS)
    ads: AdsSettings = field(default_factory=AdsSettings)
    coalition_rule: str = "renormalized"

    def __post_init__(self) -> None:
        if isinstance(self.methods, str) or not isinstance(self.methods, Sequence | frozenset | set):
            raise TypeError(f"methods: expected a sequence of names from {list(VALUATION_METHODS)}; got "
                            f"{self.methods!r}.")
        unknown = [m for m in self.methods if m not in VALUATION_METHODS]
        if unknown:
            raise ValueError(f"methods: expected a subset of {list(VALUATION_METHODS)}; got unknown {unknown}.")
        object.__setattr__(self, "methods", tuple(self.methods))
        if not isinstance(self.ads, AdsSettings):
            raise TypeError(f"ads: expected a fedvalue.valuation.settings.AdsSettings; got {type(self.ads).__name__}.")
        check_choice("coalition_rule", self.coalition_rule, COALITION_RULES)
