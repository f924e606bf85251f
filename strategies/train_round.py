"""One training round of the valuing strategy from its replies to its books: the round's one
conductor. :meth:`strategies.valuing.ValuingStrategy.aggregate_train` reads it in order:

    take in → (record, once) → value → accept → delegate → book

The round starts from A_{t−1} (:class:`RoundStart`). Its random state is captured before anything
reads the replies: the counterfactual coalitions aggregate copies of the replies from it
(:mod:`strategies.counterfactual`), and the live aggregation starts from it again, so the live run
is the bare run's, bit for bit. FedAvg's family (pure aggregation) needs no copy: its coalitions
are the n-weighted mean.

The round record (:class:`fedvalue.run.archive.RoundRecord`) is made once, right after intake, with
the run's settings (:class:`RoundSetup`, fixed when the books open) and what every hook notes; the
valuation, the fairness books and the audit all read it. Screening a reply that makes the game
non-finite marks its entry ``rejected``; acceptance and delegation add the accepted clients and the
replies the inner strategy was given. The books' hooks (:mod:`strategies.hooks`) are called at the
same points for every kind, in their registry's order: the round names none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import Strategy

from fedvalue.rounds.booking import BookedRound, book_round
from fedvalue.rounds.record_game import value_record
from fedvalue.run.archive import RoundRecord
from fedvalue.run.settings import BY_STRATEGY, WEIGHTED_MEAN, RoundSettings
from fedvalue.schema import WEIGHED_STATUSES, Status
from fedvalue.valuation.round_game import ArraysUtility, RoundValuation, round_rng
from fedvalue.valuation.settings import ValuationSettings
from strategies.arrays import arrays_to_numpy
from strategies.counterfactual import CounterfactualAggregator, aggregates_by_weighted_mean
from strategies.round_hook import RoundHook, merged_fields
from strategies.intake import RoundIntake, take_in
from strategies.nodes import NodeDirectory
from strategies.acceptance_policy import AcceptInputs, Acceptance
from strategies.random_state import RandomState
from strategies.reaggregate import replay_state_or_reason
from strategies.replies import reweigh
from strategies.screening import value_screened


@dataclass(frozen=True)
class RoundStart:
    """A_{t−1} as the books read it (``arrays``) and the model's own dtypes (``model_dtypes``,
    from the first state seen): an aggregation may turn an integer buffer (a batch counter) into
    floats, while the clients' models keep it integer."""

    arrays: dict
    model_dtypes: dict

    @classmethod
    def of(cls, arrays: ArrayRecord, previous: RoundStart | None) -> RoundStart:
        start = arrays_to_numpy(arrays)
        dtypes = None if previous is None else previous.model_dtypes
        return cls(start, dtypes or {k: v.dtype for k, v in start.items()})


@dataclass(frozen=True)
class ConfiguredRound:
    """What configuring a round decided, for taking its replies in: A_{t−1} (``start``), the nodes
    sent an instruction (``targets``) and the instructions (``sent``: each reply answers one), and
    the partitions the sampler chose from when some registered nodes were gone (``available``)."""

    start: RoundStart
    targets: list[int]
    sent: list[Message]
    available: list[int] | None = None


@dataclass(frozen=True)
class RoundSetup:
    """What every round of a run is taken in, valued and booked with, fixed when its books open.

    ``settings`` are the run's :class:`fedvalue.run.settings.RoundSettings` (methods, estimator,
    seed, weight key, flows, how it aggregates, what its books note); ``hooks`` the books' hooks by
    kind name; ``nodes`` which node holds which partition; ``claims`` the claim review (or None);
    ``save_records``: the audit will replay the inner strategy's aggregation from the records.
    """

    settings: RoundSettings
    utility: ArraysUtility
    acceptance: Acceptance
    hooks: Mapping[str, RoundHook]
    nodes: NodeDirectory
    claims: object | None = None
    save_records: bool = True

    @classmethod
    def of_run(cls, strategy: Strategy, utility: ArraysUtility, acceptance: Acceptance, hooks: Mapping[str, RoundHook],
               *, valuation: ValuationSettings, seed: int, weighted_by_key: str, flows: bool, reject_non_finite: bool,
               nodes: NodeDirectory, claims: object | None, save_records: bool) -> RoundSetup:
        """The setup of a run of ``strategy`` whose round records note: its valuation settings, seed,
        the strategy and how it aggregates, the weight key, flows, how non-finite replies are
        taken, the acceptance policy's marks and rule, and what every hook notes of the run."""
        noted = merged_fields(hook.settings() for hook in hooks.values())
        settings = RoundSettings(
            methods=tuple(valuation.methods), valuation=valuation.ads, seed=seed, strategy=type(strategy).__name__,
            aggregation=WEIGHTED_MEAN if aggregates_by_weighted_mean(strategy) else BY_STRATEGY,
            weighted_by_key=weighted_by_key, flows=flows, reject_non_finite=reject_non_finite,
            selection=acceptance.books_selection, acceptance=acceptance.recorded_acceptance, **noted)
        return cls(settings, utility, acceptance, hooks, nodes, claims, save_records)


class TrainRound:
    """Round ``server_round`` from its replies to its books (module docstring).

    Made by :meth:`take_in`; then :meth:`value`, :meth:`accept`, :meth:`delegate` and :meth:`book`,
    in that order. ``aggregator`` aggregates a coalition with the inner strategy's own code (None:
    FedAvg's family, the weighted mean).
    """

    def __init__(self, setup: RoundSetup, server_round: int, intake: RoundIntake, start: RoundStart,
                 strategy: Strategy, random_state: RandomState, *, available: list[int] | None = None) -> None:
        self.setup, self.server_round, self.intake, self.start = setup, server_round, intake, start
        self.random_state = random_state
        settings = setup.settings
        self.pure = settings.aggregation != BY_STRATEGY
        # Made before the live aggregation, which may consume or rewrite the replies it is given.
        self.aggregator = None if self.pure else CounterfactualAggregator(
            strategy, server_round, {r.client_id: r.message for r in intake.records if r.status in WEIGHED_STATUSES},
            start.arrays, random_state)
        # Only a saved record is ever replayed (by the audit): capture nothing for one that is not saved.
        replay = (None if self.pure or not setup.save_records
                  else replay_state_or_reason(strategy, random_state, intake.records))
        self.valuation: RoundValuation | None = None
        #: What each hook's book reads beside the record, by kind name (set by :meth:`accept`).
        self.inputs: dict[str, object] = {}
        self.realized: dict | None = None
        self.record: RoundRecord = intake.record(
            server_round, start.arrays, settings, replay=replay if isinstance(replay, tuple) else None,
            replay_missing=replay if isinstance(replay, str) else None, available=available)
        self.record = replace(self.record, **merged_fields(hook.note(self) for hook in setup.hooks.values()))

    @classmethod
    def take_in(cls, setup: RoundSetup, server_round: int, replies: Iterable[Message], configured: ConfiguredRound,
                strategy: Strategy) -> TrainRound:
        """The round's intake (:func:`strategies.intake.take_in`), the random state captured first."""
        random_state = RandomState.capture()
        start = configured.start
        taken = take_in(replies, start_arrays=start.arrays, model_dtypes=start.model_dtypes,
                        weighted_by_key=setup.settings.weighted_by_key, node_to_client=setup.nodes.node_to_client,
                        targets=configured.targets, claims=setup.claims, sent=configured.sent)
        return cls(setup, server_round, taken, start, strategy, random_state, available=configured.available)

    # -- what a hook reads (strategies.round_hook.RoundView) --------------------------------------

    @property
    def start_arrays(self) -> Mapping[str, np.ndarray]:
        return self.start.arrays

    @property
    def ok(self) -> list:
        """The valid replies, in reply order."""
        return self.intake.ok

    @property
    def gradients(self) -> Mapping:
        return self.intake.gradients

    def rng(self) -> np.random.Generator:
        """A fresh generator of the round's own stream (``[seed, round]``)."""
        return round_rng(self.setup.settings.seed, self.server_round)

    # -- the round ---------------------------------------------------------------------------

    def value(self, progress: Callable[[int, int], None] | None) -> RoundValuation | None:
        """The round valued from its record, by the game the audit rebuilds from the saved record
        (:mod:`fedvalue.rounds.record_game`); a reply that makes a coalition score as no number is
        rejected here (its entry marked so) and the round is valued without it."""
        def value_as_screened() -> RoundValuation:
            self._mark_screened()
            return value_record(self.record, self.setup.utility, self.rng(), self.aggregator, progress)

        self.valuation = value_screened(value_as_screened, self.intake.records, self.setup.utility, self.start.arrays)
        self._mark_screened()  # the last reply screened out leaves nothing to value
        return self.valuation

    def _mark_screened(self) -> None:
        """The record's entries with the statuses screening left (a rejected reply's reason with it)."""
        self.record = replace(self.record, entries=self.intake.entries())

    def accept(self) -> set:
        """The clients whose valid replies are aggregated: every hook computes what its book reads
        and offers the policy what it may read; the policy chooses (:class:`AcceptInputs`); then a
        hook's factors multiply the accepted replies' weights (the books keep n_u)."""
        hooks, ok = self.setup.hooks, self.ok
        inputs = {name: hook.inputs(self) for name, hook in hooks.items()}
        offered = {key: read for name, hook in hooks.items() for key, read in hook.offer(self, inputs[name]).items()}
        round_inputs = AcceptInputs(self.server_round, [r.client_id for r in ok], self.valuation,
                                    self.setup.settings.seed, offered)
        accepted = self.setup.acceptance.accept(round_inputs) if ok else set()
        for name, hook in hooks.items():
            if ok:
                inputs[name], factors = hook.factors(self, accepted, inputs[name])
                if factors is not None:
                    reweigh(ok, accepted, factors)
        self.inputs = {name: value for name, value in inputs.items() if value is not None}
        return accepted

    def delegate(self, strategy: Strategy, accepted: set) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The inner strategy's live aggregation of what passes (:meth:`RoundIntake.passed`), from
        the round's random state; the record takes the accepted clients and the replies passed."""
        passed = self.intake.passed(accepted, self.setup.settings.reject_non_finite)
        self.record = replace(self.record, accepted=[e.client_id for e in self.record.entries
                                                     if e.status == Status.OK and e.client_id in accepted],
                              passed=None if self.pure else passed)
        self.random_state.restore()
        records = self.intake.records
        live_arrays, live_metrics = strategy.aggregate_train(self.server_round, [records[k].message for k in passed])
        # A round where nothing was aggregated keeps the global state.
        self.realized = arrays_to_numpy(live_arrays) if live_arrays is not None else None
        return live_arrays, live_metrics

    def book(self) -> BookedRound:
        """The round's rows (:func:`fedvalue.rounds.booking.book_round`), from its record and what
        the hooks computed for their books."""
        return book_round(self.record, self.valuation, self.setup.utility, realized=self.realized,
                          aggregate=self.aggregator, inputs=self.inputs,
                          unaggregatable=0 if self.aggregator is None else None)

    def end_arrays(self) -> Mapping[str, np.ndarray]:
        """A_t as the checkpoint keeps it (A_{t−1} when nothing was aggregated)."""
        return self.start.arrays if self.realized is None else self.realized
