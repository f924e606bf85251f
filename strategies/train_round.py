"""One training round of the valuing strategy from its replies to its books: the round's one
conductor. :meth:`strategies.valuing.ValuingStrategy.aggregate_train` reads it in order:

    take in → (record, once) → value → accept → delegate → book

The round starts from A_{t−1} (:class:`RoundStart`). Its random state is captured before anything
reads the replies: the counterfactual coalitions aggregate copies of the replies from it
(:mod:`strategies.aggregation.counterfactual`), and the live aggregation starts from it again, so the live run
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
from dataclasses import replace

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import Strategy

from fedvalue.rounds.booking import BookedRound, book_round
from fedvalue.rounds.record_game import value_record
from fedvalue.run.archive import RoundRecord
from fedvalue.valuation.round_game import RoundValuation, round_rng
from strategies.acceptance_policy import AcceptInputs
from strategies.aggregation.counterfactual import CounterfactualAggregator
from strategies.aggregation.random_state import RandomState
from strategies.aggregation.reaggregate import replay_state_or_reason
from strategies.arrays import arrays_to_numpy
from strategies.intake.round_intake import RoundIntake, take_in
from strategies.intake.screening import value_screened
from strategies.round_hook import merged_fields
from strategies.round_setup import ConfiguredRound, RoundSetup, RoundStart


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
        self.pure = not settings.by_strategy
        # Made before the live aggregation, which may consume or rewrite the replies it is given.
        self.aggregator = None if self.pure else CounterfactualAggregator(
            strategy, server_round, intake.weighed_messages(), start.arrays, random_state)
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
                        weighted_by_key=setup.settings.weighted_by_key, node_to_client=setup.node_to_client,
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
        self.setup.log.taken_in(self.server_round, self.intake.records)  # statuses final: who was not valued, why
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
                for reply in ok if factors is not None else ():  # n_u w_u in the message; the books keep n_u
                    if reply.client_id in accepted:
                        reply.weigh(float(reply.weight) * float(factors[reply.client_id]))
        self.inputs = {name: value for name, value in inputs.items() if value is not None}
        return accepted

    def delegate(self, strategy: Strategy, accepted: set) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The inner strategy's live aggregation of what passes (:meth:`RoundIntake.passed`), from
        the round's random state; the record takes the accepted clients and the replies passed."""
        passed = self.intake.passed(accepted, self.setup.settings.reject_non_finite)
        self.record = replace(self.record, accepted=self.intake.accepted(accepted),
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
