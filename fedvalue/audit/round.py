"""The audit's recomputation: every recomputable field of a round's books, from its record.

For a round aggregated by the FedAvg family the round game is rebuilt from the record
(A_{t−1}, the replies and their weights) and booked again by the writer's own
:func:`fedvalue.rounds.booking.book_round`: ADS and LOO with their standard errors (MC reruns with
the recorded seed, round t's generator ``[seed, t]``), v_t(∅), v_t(I_t), U(A_t) (A_t =
the weighted mean of the accepted replies, which must also be the next round's start
state), the harm of rejected replies, the ``selected`` marks and the TracIn flows (through a
projection, from the projected vectors the record keeps, each projected update checked against
its reply: :mod:`fedvalue.audit.projected_vectors`). Every
ledger row of the round must then equal the recomputed one in ``value``, ``stderr``,
``status`` and ``num_examples`` (the weight, when the strategy weighs by examples; the
``noisy`` column is the run's ground truth, checked against it over the whole ledger by
:mod:`fedvalue.audit.noisy_column`), the round must book exactly the
recomputed rows, and its ``rounds.csv`` row must equal the recomputed one in
``clients``, ``num_clients``, ``num_failed``, the utilities, ``num_evaluations``,
``ads_method``, ``efficiency_gap`` and ``num_unaggregatable``. A seeded sample of the
round's coalitions is scored again on the plain path (:func:`plain_path_problems`), so a
fast-path error the recomputation repeats cannot hide. The record's valuation
settings, methods and seed must equal run.json's where run.json names them, and its
sampled clients the sampler's choice where the caller knows the sampler.

A round that booked fairness (:mod:`fedvalue.rounds.fairness_round`) is recomputed with the run's
fairness objective too: ``ads_fairness``, ``loo_fairness``, ``fairness_influence``, the
clients a drop-K or I-JACK rule accepts and the I-JACK factors (re-derived from the
recomputed influences and the rule saved in the record; A_t is then the mean weighted by
n_u w_u), and group efficiency of ``ads_fairness``; with curvature, the
``fairness_influence_curvature`` and ``fairness_weight_derivative`` rows from the loss
gradients and Fisher diagonals the record keeps, and a drop rule's choice by the score it
names (first-order, renormalized, curvature or exact).

A round that booked the fixed-weight game's second-order expansion
(:mod:`fedvalue.rounds.kinds.fixed_second_order`) has its ``ads_fixed_second_order`` rows booked again
from the record and the run's utility (one gradient and one Hessian-vector product at A_{t−1}, and the
two anchor evaluations rounds.csv counts), compared like every other row, and its record's switch
against run.json's where run.json names it; with the defences on too, its ``ads_fixed_second_order_defended``
rows are booked again from the same values and the record's screen of the replies
(:mod:`fedvalue.rounds.defences.second_order`).

A value-weighted round (:mod:`fedvalue.rounds.kinds.value_weights`) has its factors and accepted
clients re-derived from the recomputed values and the rule saved in its record; A_t is then the
mean weighted by n_u w_u and its ``value_weight`` rows are checked like every other row.

With a utility that rounds by the machine's kernels (a float32 loss: ``neg_loss``, ``neg_mse``), a
round whose numbers differ from its books past the tolerance is compared again within the float32
rounding of U measured on the auditor's machine (:mod:`fedvalue.audit.rounding_envelope`), and a
value-weighted round then aggregates A_t by the factors it booked (checked within their envelope).

The record holds every sampled client's outcome in reply order, with its example count
and reason, and the claim review's flags: a round's ``clients`` order, ``num_examples``,
the ``reason`` of failed and rejected clients and the claim rows are checked against it
(a record of an older version holds none of these: there only ``num_examples`` of weighed
replies are checked, and claim rows are not). Not recomputable from the files (only a
signature or a published head protects them): ``valuation_seconds`` (a timing), and what
the record itself says a client reported (its reason, its claim) or which client sent
which arrays, when record and books agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from fedvalue.audit import rounding_envelope
from fedvalue.audit.rounding_envelope import EnvelopeTally, RoundEnvelope, state_digest
from fedvalue.audit.training_replay import ReplayTally, reply_problem
from fedvalue.run.archive import RoundRecord
from fedvalue.rounds.booking import BookedRound, CountingAggregator, book_round
from fedvalue.rounds.record_game import valid_clients, value_record
from fedvalue.rounds.fairness_round import FairnessPlugin, RoundFairness
from fedvalue.rounds.kinds.value_weights import value_weight_outcome
from fedvalue.scoring.fairness.objectives import GroupFairness
from fedvalue.run.ledger_tables import spreadsheet_safe
from fedvalue.valuation.round_game import (
    ArraysUtility,
    RoundValuation,
    coalition_aggregator,
    round_rng,
    weighted_mean,
)
from fedvalue.run.rundir import printable
from fedvalue.schema import CLAIM_PREFIX, ROUND_COLUMNS, WEIGHED_STATUSES, LedgerRow, Method, RoundRow, Status

#: Runs written before run.json held ``valuation`` (``AdsSettings.as_dict()``) named the
#: estimator by the simulations' option names; read only to audit such a run.
LEGACY_SETTING_KEYS = {"ads_method": "method", "epsilon": "epsilon", "delta": "delta",
                       "truncation_tolerance": "truncation_tolerance", "stderr_target": "stderr_target"}


def close(booked, recomputed, tolerance: float, allowance: float = 0.0) -> bool:
    """Equal up to ``tolerance`` × max(1, |booked|) + ``allowance`` (a rounding envelope:
    :mod:`fedvalue.audit.rounding_envelope`); missing equals missing only."""
    missing_booked = booked is None or (isinstance(booked, float) and math.isnan(booked))
    if missing_booked or recomputed is None:
        return missing_booked and recomputed is None
    try:
        return abs(float(booked) - float(recomputed)) <= tolerance * max(1.0, abs(float(booked))) + allowance
    except (TypeError, ValueError, OverflowError):
        return False


class CappedUtility:
    """The run's utility for one round's recompute, counting the states it scores: past
    ``limit`` (what the round booked, plus the books' own scorings) it raises
    :class:`CappedUtility.Exceeded`, past the audit's budget :class:`fedvalue.audit.audit_files.BudgetExceeded`.
    Batched and linear scoring (:mod:`fedvalue.scoring.linear`) are counted row by row."""

    class Exceeded(Exception):
        """The recompute needs more evaluations than the round booked."""

    def __init__(self, utility: ArraysUtility, limit: int, budget) -> None:
        self.utility, self.limit, self.budget, self.used = utility, int(limit), budget, 0
        self._derivatives: dict[tuple, object] = {}  # an expansion's ∇U and ∇²U v, kept for the envelope's reruns

    def count(self, states: int) -> None:
        self.used += states
        if self.used > self.limit:
            raise CappedUtility.Exceeded(f"recomputing it takes more than the {self.limit} evaluations its books "
                                         "allow (rounds.csv's num_evaluations and the round's anchors)")
        self.budget.check("recomputing the values")

    def __call__(self, arrays):
        self.count(1)
        return self.utility(arrays)

    def plain(self, arrays):
        """U on the plain path for the audit's own cross-check, outside the round's limit."""
        self.budget.check("cross-checking coalitions on the plain path")
        return self.utility(arrays)

    @property
    def supports_linear(self) -> bool:
        return bool(getattr(self.utility, "supports_linear", False))

    @property
    def differentiable(self) -> bool:
        """Whether the run's utility is differentiable (what the expansion methods need), as it says."""
        return getattr(self.utility, "differentiable", False) is True

    def gradient(self, arrays):
        """∇U, for an expansion method's recompute: no coalition is scored; the audit's budget still runs.
        Computed once per state (the rounding envelope reruns the valuation)."""
        self.budget.check("recomputing the values")
        key = ("gradient", state_digest(arrays))
        if key not in self._derivatives:
            self._derivatives[key] = self._derivative("gradient")(arrays)
        return self._derivatives[key]

    def hessian_vector_product(self, arrays, vector):
        """∇²U v, as :meth:`gradient`."""
        self.budget.check("recomputing the values")
        key = ("hessian_vector_product", state_digest(arrays), state_digest(vector))
        if key not in self._derivatives:
            self._derivatives[key] = self._derivative("hessian_vector_product")(arrays, vector)
        return self._derivatives[key]

    @property
    def rounded_by_machine(self) -> bool:
        """Whether the run's utility rounds by the machine's kernels, as it says (a float32 loss sum)."""
        return getattr(self.utility, "rounded_by_machine", False) is True

    def float64_value(self, arrays):
        """U in float64, for the rounding envelope, outside the round's limit (None where the utility
        has none)."""
        self.budget.check("measuring float32 rounding of the utility")
        method = getattr(self.utility, "float64_value", None)
        return method(arrays) if callable(method) else None

    def _derivative(self, name: str):
        method = getattr(self.utility, name, None)
        if not callable(method):
            raise TypeError(f"the run's utility has no {name}(), which the round's expansion method needs")
        return method

    @property
    def batch(self):
        batch = getattr(self.utility, "batch", None)
        if batch is None:
            return None

        def counted(states):
            self.count(len(states))
            return batch(states)
        return counted

    def linear(self, basis):
        scorer = self.utility.linear(basis)
        capped = self

        class Counted:
            def values(self, rows, **keywords):
                capped.count(len(rows))
                return scorer.values(rows, **keywords)

            def __getattr__(self, name):
                return getattr(scorer, name)
        return Counted()


def replay_problems(record: RoundRecord, example_counts: Callable[[Hashable], int] | None,
                    retrain: Callable[[int, Hashable, Mapping], Mapping] | None,
                    tally: ReplayTally | None = None) -> list[str]:
    """Where a reply's weight is not its client's example count, or its arrays are not what
    its local training gives from the round's start, the run's settings and seed (both
    rebuilt by the simulation that made the run), to within float rounding on this machine
    (:mod:`fedvalue.audit.training_replay`; ``tally`` counts how each reply matched)."""
    problems, t = [], record.round
    for client, arrays in record.replies.items():
        if example_counts is not None:
            try:
                expected = example_counts(client)
            except (KeyError, IndexError, TypeError, ValueError):
                problems.append(f"round {t}: client {client!r} is not one of the run's clients")
                continue
            if record.weights.get(client) != expected:
                problems.append(f"round {t} client {client}: its weight is {record.weights.get(client)!r}; its data, "
                                f"drawn from the run's seed, hold {expected} examples")
        if retrain is not None and record.statuses.get(client) == Status.OK:
            problem = reply_problem(t, client, arrays, record.start_arrays, retrain, tally)
            if problem is not None:
                problems.append(problem)
    return problems


def _run_settings(config: Mapping) -> dict:
    """The estimator settings run.json fixes, as the record writes them
    (:meth:`fedvalue.valuation.settings.AdsSettings.as_dict`); from the older option names for a run
    written before (a zero ``stderr_target`` then meant none)."""
    written = config.get("valuation")
    if isinstance(written, Mapping):
        return dict(written)
    return {field: (config[key] or None) if key == "stderr_target" else config[key]
            for key, field in LEGACY_SETTING_KEYS.items() if key in config}


def settings_problems(record: RoundRecord, config: Mapping) -> list[str]:
    """Where the record's estimator, methods, seed, coalition rule, flows projection or fixed-weight second-order
    book disagree with run.json (each where run.json names it)."""
    settings, problems = record.settings, []
    valuation = settings.valuation.as_dict()
    for field, expected in _run_settings(config).items():
        if valuation.get(field) != expected:
            problems.append(f"its {field} is {valuation.get(field)!r}, run.json says {expected!r}")
    if "methods" in config and list(settings.methods) != list(config["methods"]):
        problems.append(f"its methods are {list(settings.methods)!r}, run.json says {config['methods']!r}")
    if "seed" in config and settings.seed != config["seed"]:
        problems.append(f"its seed is {settings.seed!r}, run.json says {config['seed']!r}")
    if "coalition_rule" in config and settings.coalition_rule != config["coalition_rule"]:
        problems.append(f"its coalition rule is {settings.coalition_rule!r}, run.json says {config['coalition_rule']!r}")
    if "flows_projection" in config and settings.flows_projection != config["flows_projection"]:
        problems.append(f"its flows projection is {settings.flows_projection!r}, run.json says "
                        f"{config['flows_projection']!r}")
    if "fixed_second_order" in config and settings.fixed_second_order != config["fixed_second_order"]:
        problems.append(f"its fixed_second_order is {settings.fixed_second_order!r}, run.json says "
                        f"{config['fixed_second_order']!r}")
    return problems


def _fairness_books(record: RoundRecord, fairness: GroupFairness, accepted: list,
                    aggregator=None) -> tuple[RoundFairness, dict, list[str]]:
    """A round's fairness books from its record by the live strategy's own
    :class:`~fedvalue.rounds.fairness_round.FairnessPlugin` (the run's objective, the recorded damping
    and rule), the I-JACK factors, and where the rule's choice or ``ads_fairness``'s group
    efficiency disagree."""
    note, problems = record.settings.fairness, []
    rule = note.rule
    plugin = FairnessPlugin(fairness, note.damping, rule)
    fair = plugin.value_record(record, seed=round_rng(record.settings.seed, record.round), aggregate=aggregator)
    chosen, fair = plugin.decide(fair)
    if chosen is not None and chosen != set(accepted):
        problems.append(f"round {record.round}: the {rule['rule']} rule accepts {sorted(chosen, key=str)} from the "
                        f"recomputed fairness influences; the record accepted {sorted(accepted, key=str)}")
    factors = dict(fair.factors or {})
    if fair.valuation is not None and Method.ADS in fair.valuation.results:
        values = fair.valuation.results[Method.ADS].values
        gap = float(values.sum()) - (fair.valuation.utility_after - fair.valuation.utility_before)
        if not abs(gap) <= 1e-9 * max(1.0, float(np.abs(values).sum())):
            problems.append(f"round {record.round}: ads_fairness breaks group efficiency by {gap:.3g}")
    return fair, factors, problems


def _value_weights(record: RoundRecord, valuation, ok: list, accepted: list) -> tuple[dict, list[str]]:
    """A value-weighted round's factors re-derived from its recomputed values
    (:mod:`fedvalue.rounds.kinds.value_weights`), and where the record accepted other clients."""
    rule = record.settings.weighting
    values = valuation.results[rule["score"]].values
    chosen, factors = value_weight_outcome(rule, {c: float(values[c]) for c in ok})
    problems = []
    if chosen != set(accepted):
        problems.append(f"round {record.round}: the value-weighting rule accepts {sorted(chosen, key=str)} from the "
                        f"recomputed values; the record accepted {sorted(accepted, key=str)}")
    return factors, problems


class ReplayUnavailable(Exception):
    """The round's aggregation by the inner strategy cannot be replayed (the message says why)."""


class ReplayedRound(CountingAggregator, Protocol):
    """Agg_t of a round aggregated by the inner strategy's own code, rebuilt from its record
    (:class:`strategies.aggregation.reaggregate.ReplayedAggregator`): a counting aggregator of coalitions, and
    the live aggregation itself."""

    def realized(self) -> Mapping[str, np.ndarray] | None: ...


def _replayed(replay: Callable[[RoundRecord], ReplayedRound], record: RoundRecord) -> ReplayedRound:
    try:
        return replay(record)
    except ValueError as error:
        raise ReplayUnavailable(str(error)) from None


@dataclass
class Recomputed:
    """One round rebuilt from its record (:func:`recompute`): its books, A_t, whether weights are
    example counts, the record's own disagreements, the round game's valuation over the ``ok``
    clients, Agg_t (None for the FedAvg family's weighted mean), and the clients A_t aggregates
    with their factors w_i on n_i (value weighting's or I-JACK's; none: 1)."""

    books: BookedRound
    realized: Mapping[str, np.ndarray] | None
    by_examples: bool
    problems: list[str]
    valuation: RoundValuation | None
    ok: list[Hashable]
    aggregator: ReplayedRound | None
    aggregated: list[Hashable]
    factors: dict

    def state_of(self, record: RoundRecord) -> Callable[[frozenset], Mapping[str, np.ndarray]]:
        """coalition -> its state as the round game materializes it: A_{t−1} for ∅, else Agg_t of its
        members in round order (the weighted mean under the record's coalition rule)."""
        position = {c: k for k, c in enumerate(self.ok)}
        aggregate = self.aggregator or coalition_aggregator(
            record.settings.coalition_rule, self.ok, record.start_arrays, [record.replies[c] for c in self.ok],
            [record.weights[c] for c in self.ok])

        def state(coalition: frozenset) -> Mapping[str, np.ndarray]:
            if not coalition:
                return record.start_arrays
            with np.errstate(all="ignore"):
                return aggregate(sorted(coalition, key=position.__getitem__))
        return state


def recompute_books(record: RoundRecord, utility: ArraysUtility, fairness: GroupFairness | None = None,
                    replay: Callable[[RoundRecord], ReplayedRound] | None = None):
    """The books of one round rebuilt from its record alone, A_t, whether weights are
    example counts, and the fairness rule's disagreements (:func:`recompute`)."""
    done = recompute(record, utility, fairness, replay)
    return done.books, done.realized, done.by_examples, done.problems


def recompute(record: RoundRecord, utility: ArraysUtility, fairness: GroupFairness | None = None,
              replay: Callable[[RoundRecord], ReplayedRound] | None = None) -> Recomputed:
    """One round rebuilt from its record alone (:class:`Recomputed`). A FedAvg-family round
    aggregates by the weighted mean; any other round by ``replay(record)``, the inner
    strategy's own aggregation from its saved state (:func:`strategies.aggregation.reaggregate.replay_aggregator`)."""
    statuses, round_settings = record.statuses, record.settings
    ok = valid_clients(record)
    accepted = [c for c in ok if c in set(record.accepted)]
    aggregator = None if replay is None else _replayed(replay, record)
    valuation = None
    if ok:
        valuation = value_record(record, utility, round_rng(round_settings.seed, record.round), aggregator)
    fair, factors, problems = None, {}, []
    if round_settings.fairness is not None and fairness is not None:
        fair, factors, problems = _fairness_books(record, fairness, accepted, aggregator)
    if round_settings.weighting and valuation is not None:
        factors, problems = _value_weights(record, valuation, ok, accepted)
    rejected = [c for c in record.replies if statuses.get(c) == Status.REJECTED]
    # Replies with NaN/inf reach the inner strategy only when the run was told to pass them through.
    aggregated = accepted + ([] if round_settings.reject_non_finite else rejected)
    realized = None
    if aggregator is not None:  # the live aggregation as it was given the replies, error replies included
        realized = aggregator.realized()
    elif aggregated:
        with np.errstate(all="ignore"):
            realized = weighted_mean([record.replies[c] for c in aggregated],
                                     [record.weights[c] * factors[c] if c in factors else record.weights[c]
                                      for c in aggregated])
    by_examples = round_settings.by_examples
    books = book_round(record, valuation, utility, realized=realized, aggregate=aggregator,
                       inputs={"fairness": fair}, unaggregatable=0 if aggregator is None else None)
    problems += entry_problems(record, by_examples)
    if aggregator is None and valuation is not None:
        problems += plain_path_problems(record, valuation.game, ok, utility)
    return Recomputed(books, realized, by_examples, problems, valuation, ok, aggregator, aggregated, factors)


#: Coalitions of each FedAvg-family round the audit scores again on the plain path.
PLAIN_PATH_SAMPLE = 4
#: Relative difference allowed between a coalition's fast and plain scores: float32 rounding of
#: summed losses (accuracies are equal, near ties being re-scored on the plain path).
PLAIN_PATH_TOLERANCE = 1e-5


def plain_path_problems(record: RoundRecord, game, ok: Sequence[Hashable], utility: ArraysUtility) -> list[str]:
    """Where a seeded sample of the round's coalitions, scored by the recomputation (the fast
    path of :func:`fedvalue.valuation.round_game.fedavg_round_game` when the utility has one),
    differs from U(the coalition's state under the record's coalition rule) on the plain path, so
    an error of the fast path cannot hide behind a recomputation that repeats it. The sample is
    drawn from ``[seed, round, 2]`` among the coalitions other than ∅ and I_t (always scored plainly)."""
    position, values = {c: k for k, c in enumerate(ok)}, game.cached_values()
    aggregate = coalition_aggregator(record.settings.coalition_rule, ok, record.start_arrays,
                                     [record.replies[c] for c in ok], [record.weights[c] for c in ok])
    coalitions = sorted((sorted(c, key=position.__getitem__) for c in values if 0 < len(c) < len(ok)),
                        key=lambda c: [position[m] for m in c])
    if not coalitions:
        return []
    rng = np.random.default_rng([int(record.settings.seed), int(record.round), 2])
    picked = rng.choice(len(coalitions), size=min(PLAIN_PATH_SAMPLE, len(coalitions)), replace=False)
    score, problems = getattr(utility, "plain", utility), []
    for k in sorted(picked.tolist()):
        members = coalitions[k]
        with np.errstate(all="ignore"):
            plain = score(aggregate(members))
        fast = values[frozenset(members)]
        if not close(fast, plain, PLAIN_PATH_TOLERANCE):
            problems.append(f"round {record.round}: coalition {members[:6]} scores {fast!r} as the books value it and "
                            f"{plain!r} on the plain path (U of its weighted mean)")
    return problems


def entry_problems(record: RoundRecord, by_examples: bool) -> list[str]:
    """Where the record's entries contradict themselves: a reply without an ok or rejected
    entry, or (weighing by examples) an ok entry whose example count is not its weight."""
    t, problems = record.round, []
    weighed = {e.client_id for e in record.entries if e.status in WEIGHED_STATUSES}
    strays = [c for c in record.replies if c not in weighed]
    if strays:
        problems.append(f"round {t}: the record holds arrays of clients {strays[:4]} it books neither ok nor rejected")
    if by_examples and record.lossless:
        for entry in record.entries:
            if entry.status == Status.OK and (entry.weight is None or entry.num_examples != int(entry.weight)):
                problems.append(f"round {t} client {entry.client_id}: the record books {entry.num_examples!r} "
                                f"examples for a reply weighed {entry.weight!r}")
    return problems


def _text(value) -> str:
    """A typed cell as a message shows it (None as nothing)."""
    return "" if value is None else str(value)


#: rounds.csv's columns compared as numbers, to the tolerance; the rest must be equal.
_ROUND_NUMBERS = ("utility_before", "utility_after", "utility_realized", "efficiency_gap")


def round_problems(record: RoundRecord, utility: ArraysUtility, booked: BookedRound, tolerance: float, *,
                   next_start: Mapping[str, np.ndarray] | None, fairness: GroupFairness | None = None,
                   replay: Callable[[RoundRecord], ReplayedRound] | None = None,
                   envelopes: EnvelopeTally | None = None) -> tuple[list[str], float]:
    """What in round t's ``booked`` rows (its rounds.csv row and ledger rows, read back typed)
    differs from the rows recomputed from its record, and the largest value difference seen:
    values, standard errors and utilities to ``tolerance`` × max(1, |booked|), everything else
    exactly; and whether the next round started from the aggregate of this one's replies (the projected
    vectors of its flows are checked beside it: :mod:`fedvalue.audit.projected_vectors`).

    With a utility that rounds by the machine (a float32 loss), a round whose numbers differ by
    more is compared again to within its rounding envelope measured here
    (:mod:`fedvalue.audit.rounding_envelope`); ``envelopes`` counts what passed only so."""
    done = recompute(record, utility, fairness, replay)
    books, problems = done.books, list(done.problems)
    compared = _compared(record, done, booked, tolerance, None)
    envelope, by_recomputed_factors = None, done.realized
    if compared.numbers_differ and rounding_envelope.applies(utility):
        _aggregated_by_booked_factors(record, done, booked, utility)
        budget = getattr(utility, "budget", None)
        envelope = rounding_envelope.measure(record, done.valuation, utility, state_of=done.state_of(record),
                                             realized=done.realized, recomputed=books.round_row, ok=done.ok,
                                             budget=None if budget is None else budget.check)
        if envelope.unmeasured is None:
            compared = _compared(record, done, booked, tolerance, envelope)
    problems += compared.problems
    if envelope is not None and envelope.unmeasured is not None:
        problems.append(f"round {record.round}: its float32 rounding envelope was not measured: {envelope.unmeasured}")
    elif envelope is not None and envelopes is not None and not compared.problems:
        for difference, allowance in compared.within_envelope:
            envelopes.count(record.round, difference, allowance)
        if (done.realized is not by_recomputed_factors and _starts(done.realized, next_start)
                and not _starts(by_recomputed_factors, next_start)):
            envelopes.starts_by_booked_factors += 1
    if done.realized is not None and next_start is not None and not _starts(done.realized, next_start):
        problems.append(f"round {record.round}: the state after it is not the aggregate of its accepted replies (the "
                        "next round started elsewhere)")
    return problems, compared.worst


def _starts(realized: Mapping[str, np.ndarray] | None, next_start: Mapping[str, np.ndarray] | None) -> bool:
    """Whether the next round started from ``realized``, bit for bit (False when either is unknown)."""
    return realized is not None and next_start is not None and set(realized) == set(next_start) and all(
        np.array_equal(realized[k], next_start[k]) for k in next_start)


def _aggregated_by_booked_factors(record: RoundRecord, done: Recomputed, booked: BookedRound,
                                  utility: ArraysUtility) -> None:
    """A value-weighted round of the FedAvg family whose recomputed factors w_i differ from its booked
    ones (its values rounded otherwise on this machine): A_t = the mean weighted by n_i w_i with the
    booked w_i, and U(A_t) of it, in ``done``. The booked factors are compared with the recomputed
    ones within their envelope; A_t from them is the run's own, bit for bit, which the next round's
    start must equal."""
    if not record.settings.weighting or done.aggregator is not None or not done.factors or not done.aggregated:
        return
    written = {str(row.client_id): row.value for row in booked.ledger_rows if str(row.method) == Method.VALUE_WEIGHT}
    factors = {c: written.get(str(c)) for c in done.factors}
    if factors == done.factors or not all(isinstance(f, float) and math.isfinite(f) for f in factors.values()):
        return
    with np.errstate(all="ignore"):
        done.realized = weighted_mean([record.replies[c] for c in done.aggregated],
                                      [record.weights[c] * factors[c] if c in factors else record.weights[c]
                                       for c in done.aggregated])
    done.books.round_row = replace(done.books.round_row, utility_realized=float(utility(done.realized)))


@dataclass
class _Comparison:
    """A round's booked rows against its recomputed ones: the findings, the largest value difference,
    whether a number differed past the tolerance, and (difference, K E_x) of each number that
    passed only within its rounding envelope."""

    problems: list[str]
    worst: float
    numbers_differ: bool
    within_envelope: list[tuple[float, float]]


def _compared(record: RoundRecord, done: Recomputed, booked: BookedRound, tolerance: float,
              envelope: RoundEnvelope | None) -> _Comparison:
    """The round's ledger rows and rounds.csv row compared (:func:`_ledger_problems`,
    :func:`_round_row_problems`), numbers to ``tolerance`` plus their ``envelope``'s allowance."""
    comparison = _Comparison([], 0.0, False, [])
    comparison.problems, comparison.worst = _ledger_problems(record, done.books.ledger_rows, booked.ledger_rows,
                                                             done.by_examples, tolerance, envelope, comparison)
    comparison.problems += _round_row_problems(record.round, done.books.round_row, booked.round_row, tolerance,
                                               envelope, comparison)
    return comparison


def _number_close(booked, recomputed, tolerance: float, key: tuple, envelope: RoundEnvelope | None,
                  comparison: _Comparison | None) -> tuple[bool, str]:
    """Whether a booked number equals its recomputation to ``tolerance``, or else within its envelope's
    allowance K E_x (noted in ``comparison``); and what a failure message adds."""
    if close(booked, recomputed, tolerance):
        return True, ""
    if comparison is not None:
        comparison.numbers_differ = True
    allowance = 0.0 if envelope is None else envelope.allowance(key)
    if allowance > 0 and close(booked, recomputed, tolerance, allowance):
        if comparison is not None:
            comparison.within_envelope.append((abs(float(booked) - float(recomputed)), allowance))
        return True, ""
    if allowance > 0:
        return False, (f" (off by {abs(float(booked) - float(recomputed)):.2e}; float32 rounding of the utility moves "
                       f"it by at most {allowance / rounding_envelope.ENVELOPE_FACTOR:.2e} on this machine, "
                       f"{rounding_envelope.ENVELOPE_FACTOR:g} times that allowed)")
    return False, ""


def _ledger_problems(record: RoundRecord, expected_rows: list[LedgerRow], booked_rows: list[LedgerRow],
                     by_examples: bool, tolerance: float, envelope: RoundEnvelope | None = None,
                     comparison: _Comparison | None = None) -> tuple[list[str], float]:
    """Where the round's booked ledger rows differ from the recomputed ones (a row missing or
    extra, or a cell), and the largest value difference. An older record holds no claim flags
    (its claim rows are not compared) and example counts only as weights."""
    t, lossless = record.round, record.lossless
    expected = {(str(row.method), str(row.client_id)): row for row in expected_rows}
    booked = {(str(row.method), str(row.client_id)): row for row in booked_rows
              if lossless or not str(row.method).startswith(CLAIM_PREFIX)}
    problems = []
    missing = [key for key in expected if key not in booked]
    extra = [key for key in booked if key not in expected]
    if missing:
        problems.append(f"round {t}: the books lack rows the record implies: {missing[:4]}")
    if extra:
        problems.append(f"round {t}: rows booked that the record does not imply: {extra[:4]}")
    worst = 0.0
    for key, want in expected.items():
        got = booked.get(key)
        if got is None:
            continue
        counted = lossless or (by_examples and want.status in WEIGHED_STATUSES)
        found, difference = _cell_problems(f"round {t} {key[0]} of client {key[1]}", got, want, tolerance,
                                           reasons=lossless, counts=counted, key=key, envelope=envelope,
                                           comparison=comparison)
        problems += found
        worst = max(worst, difference)
    return problems, worst


def _cell_problems(where: str, got: LedgerRow, want: LedgerRow, tolerance: float, *, reasons: bool,
                   counts: bool, key: tuple = (), envelope: RoundEnvelope | None = None,
                   comparison: _Comparison | None = None) -> tuple[list[str], float]:
    """Where one booked ledger row differs from its recomputed row: its reason as written
    (``reasons``), value and standard error (to ``tolerance``, or within the row's rounding
    ``envelope``), status and example count (``counts``); and the difference of its value."""
    problems, difference = [], 0.0
    written = None if want.reason is None else (spreadsheet_safe(want.reason) or None)
    if reasons and got.reason != written:
        problems.append(f"{where}: its reason is booked {printable(_text(got.reason), 80)!r}; the record gives "
                        f"{printable(_text(written), 80)!r}")
    for column, value, wanted in (("value", got.value, want.value), ("stderr", got.stderr, want.stderr)):
        same, why = _number_close(value, wanted, tolerance, (*key, column), envelope, comparison)
        if not same:
            problems.append(f"{where}: {column} is booked {value!r}; the saved arrays give {wanted!r}{why}")
        elif column == "value" and value is not None and wanted is not None:
            difference = abs(float(value) - float(wanted))
    if got.status != want.status:
        problems.append(f"{where}: status is booked {str(got.status)!r}; the record says {str(want.status)!r}")
    if counts and got.num_examples != want.num_examples:
        problems.append(f"{where}: num_examples is booked {_text(got.num_examples)!r}; the record's weight gives "
                        f"{_text(want.num_examples)!r}")
    return problems, difference


def _round_row_problems(t: int, want: RoundRow, got: RoundRow, tolerance: float,
                        envelope: RoundEnvelope | None = None, comparison: _Comparison | None = None) -> list[str]:
    """Where the round's booked rounds.csv row differs from the recomputed one: the utilities and
    the efficiency gap to ``tolerance`` (the gap also absolutely, being a difference near 0) or
    within their rounding ``envelope``, every other cell exactly (``valuation_seconds``, a timing,
    is not recomputable)."""
    problems = []
    for column in ROUND_COLUMNS[:-1]:
        if column in ("round", "valuation_seconds"):
            continue
        booked, recomputed = getattr(got, column), getattr(want, column)
        why = ""
        if column in _ROUND_NUMBERS:
            same = column == "efficiency_gap" and booked is not None and recomputed is not None and (
                abs(booked - recomputed) <= tolerance)
            if not same:
                same, why = _number_close(booked, recomputed, tolerance, ("round", column), envelope, comparison)
        else:
            same = booked == recomputed
        if not same:
            problems.append(f"round {t} {column}: booked {_text(booked)!r} in rounds.csv; the saved arrays give "
                            f"{_text(recomputed)!r}{why}")
    return problems


def sample_problems(record: RoundRecord, sampled: Callable[..., Sequence] | None) -> list[str]:
    """Where the record's sampled clients are not the sampler's choice for its round: from every
    partition, or, when the record notes that some nodes were gone (``available``), from
    the partitions it lists (``sampled(round, available)``)."""
    if sampled is None:
        return []
    available = None if record.available is None else list(record.available)
    if available is not None and not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in available):
        return [f"round {record.round}: its record's 'available' is not a list of partition ids ({available!r:.80})"]
    try:
        expected = [str(c) for c in (sampled(record.round) if available is None else sampled(record.round, available))]
    except (TypeError, ValueError) as error:
        return [f"round {record.round}: the run's sampler cannot choose from the partitions its record lists as "
                f"available {available} ({error})"]
    got = [str(c) for c in record.statuses]
    if sorted(got) != sorted(expected):
        return [f"round {record.round}: clients {sorted(got)} were booked; the run's sampler chose {sorted(expected)}"]
    replied = [str(c) for c in record.replies]
    if replied != [c for c in expected if c in replied]:
        return [f"round {record.round}: replies are recorded in the order {replied}; the engine returns them in the "
                f"order sent, {[c for c in expected if c in replied]}"]
    return []
