"""One training round of the valuing strategy between its replies and its books, in the order
:meth:`strategies.valuing.ValuingStrategy.aggregate_train` reads it: intake → value → (accept:
:mod:`strategies.hooks.round_hooks`) → delegate → record → books.

The round starts from A_{t−1} (:class:`RoundStart`). Its random state is captured before
anything reads the replies: the counterfactual coalitions aggregate copies of the replies from
it (:mod:`strategies.counterfactual`), and the live aggregation starts from it again, so the
live run is the bare run's, bit for bit. FedAvg's family (pure aggregation) needs no copy: its
coalitions are the n-weighted mean.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import Strategy

from fedvalue.rounds.booking import BookedRound, book_round
from fedvalue.rounds.record_game import value_record
from fedvalue.run.archive import RoundRecord
from fedvalue.run.settings import RoundSettings
from fedvalue.schema import WEIGHED_STATUSES
from fedvalue.valuation.ads import AdsSettings
from fedvalue.valuation.round_game import ArraysUtility, RoundValuation, round_rng
from strategies.counterfactual import CounterfactualAggregator, aggregates_by_weighted_mean
from strategies.random_state import RandomState
from strategies.intake import RoundIntake, round_record, take_in
from strategies.arrays import arrays_to_numpy
from strategies.reaggregate import replay_state_or_reason
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


class TrainRound:
    """Round ``server_round`` from its replies to its books (module docstring).

    Made by :meth:`take_in`; then :meth:`value`, :meth:`delegate`, :meth:`record` and
    :meth:`book`, in that order. ``aggregator`` aggregates a coalition with the inner
    strategy's own code (None: FedAvg's family, the weighted mean); ``replay`` is what
    replaying the aggregation needs (a tuple), why it cannot be (a string), or None (not saved).
    """

    def __init__(self, server_round: int, intake: RoundIntake, start: RoundStart, strategy: Strategy,
                 random_state: RandomState, *, seed: int, save_records: bool, weighted_by_key: str,
                 flows: bool) -> None:
        self.server_round, self.intake, self.start, self.seed = server_round, intake, start, seed
        self.weighted_by_key, self.flows = weighted_by_key, flows
        self.random_state = random_state
        self.pure = aggregates_by_weighted_mean(strategy)
        # Made before the live aggregation, which may consume or rewrite the replies it is given.
        self.aggregator = None if self.pure else CounterfactualAggregator(
            strategy, server_round, {r.client_id: r.message for r in intake.records if r.status in WEIGHED_STATUSES},
            start.arrays, random_state)
        # Only a saved record is ever replayed (by the audit): capture nothing for one that is not saved.
        self.replay = (None if self.pure or not save_records
                       else replay_state_or_reason(strategy, random_state, intake.records))
        #: Positions of the entries the live aggregation was given, and A_t (None: nothing aggregated).
        self.passed: list[int] = []
        self.realized: dict | None = None

    @classmethod
    def take_in(cls, server_round: int, replies: Iterable[Message], start: RoundStart, strategy: Strategy, *,
                seed: int, save_records: bool, weighted_by_key: str, flows: bool, **intake) -> TrainRound:
        """The round's intake (:func:`strategies.intake.take_in`, ``intake`` its other keywords),
        the random state captured first; ``flows``: the record keeps the inference gradients."""
        random_state = RandomState.capture()
        taken = take_in(replies, start_arrays=start.arrays, model_dtypes=start.model_dtypes,
                        weighted_by_key=weighted_by_key, **intake)
        return cls(server_round, taken, start, strategy, random_state, seed=seed, save_records=save_records,
                   weighted_by_key=weighted_by_key, flows=flows)

    def rng(self) -> np.random.Generator:
        """A fresh generator of the round's own stream (``[seed, round]``)."""
        return round_rng(self.seed, self.server_round)

    def value(self, utility: ArraysUtility, methods: tuple[str, ...], ads: AdsSettings,
              progress: Callable[[int, int], None] | None) -> RoundValuation | None:
        """The round valued by ``methods`` from its record as the intake left it, by the game the
        audit rebuilds from the saved record (:mod:`fedvalue.rounds.record_game`); a reply that
        makes a coalition score as no number is rejected here and the round is valued without it."""
        return value_screened(lambda: value_record(self.record(), utility, methods, ads, self.rng(), self.aggregator,
                                                   progress),
                              self.intake.records, utility, self.start.arrays)

    def delegate(self, strategy: Strategy, accepted: set,
                 reject_non_finite: bool) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The inner strategy's live aggregation of what passes (:meth:`RoundIntake.passed`), from
        the round's random state."""
        self.passed = self.intake.passed(accepted, reject_non_finite)
        self.random_state.restore()
        records = self.intake.records
        live_arrays, live_metrics = strategy.aggregate_train(self.server_round, [records[k].message for k in self.passed])
        # A round where nothing was aggregated keeps the global state.
        self.realized = arrays_to_numpy(live_arrays) if live_arrays is not None else None
        return live_arrays, live_metrics

    def record(self, accepted: Collection = (), settings: RoundSettings | None = None) -> RoundRecord:
        """The round record as the intake stands (:func:`strategies.intake.round_record`): before the
        round is aggregated, what its valuation reads (statuses as screened so far, no accepted
        clients, default settings); after, with the ``accepted`` clients and the run's ``settings``."""
        return round_record(self.server_round, self.intake, start_arrays=self.start.arrays, accepted=set(accepted),
                            weighted_by_key=self.weighted_by_key, flows=self.flows,
                            settings=RoundSettings() if settings is None else settings,
                            replay=self.replay if isinstance(self.replay, tuple) else None)

    def book(self, record: RoundRecord, valuation: RoundValuation, utility: ArraysUtility, *,
             fairness) -> BookedRound:
        """The round's rows (:func:`fedvalue.rounds.booking.book_round`), from its record."""
        return book_round(record, valuation, utility, realized=self.realized, aggregate=self.aggregator,
                          inputs={"fairness": fairness}, unaggregatable=0 if self.aggregator is None else None)

    def end_arrays(self) -> Mapping[str, np.ndarray]:
        """A_t as the checkpoint keeps it (A_{t−1} when nothing was aggregated)."""
        return self.start.arrays if self.realized is None else self.realized
