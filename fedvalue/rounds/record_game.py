"""The round game of a record: v_t(S) = U(Agg_t(A_{t−1}; S)) over the round's valid replies
([ADS] §3, the within-round game; :mod:`fedvalue.valuation.round_game`), built from the
:class:`~fedvalue.run.archive.RoundRecord` alone. The valuing strategy values each round from its
record as the intake left it, and the audit recomputes it from the saved record, through these
same two functions, so the two cannot build different games."""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable

import numpy as np

from fedvalue.run.archive import RoundRecord, read_round_record, round_record_paths
from fedvalue.schema import Status
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.round_game import (
    Aggregator,
    ArraysUtility,
    RoundValuation,
    round_game_for,
    round_rng,
    value_round,
)
from fedvalue.valuation.settings import AdsSettings


def valid_clients(record: RoundRecord) -> list[Hashable]:
    """The players of the round game: every client with a reply whose first entry is ``ok``,
    in reply order."""
    statuses = record.statuses
    return [c for c in record.replies if statuses.get(c) == Status.OK]


def record_game(record: RoundRecord, utility: ArraysUtility, aggregate: Aggregator | None = None,
                rule: str | None = None) -> CoalitionGame:
    """v_t over :func:`valid_clients`, each weighted by its entry's n_u: the weighted mean of the
    FedAvg family under the record's coalition rule (or ``rule``; ``aggregate`` None) or the inner strategy's own
    Agg_t (:func:`fedvalue.valuation.round_game.round_game_for`)."""
    ok, weights = valid_clients(record), record.weights
    return round_game_for(ok, record.start_arrays, [record.replies[c] for c in ok], [weights[c] for c in ok],
                          utility, aggregate, record.settings.coalition_rule if rule is None else rule)


def value_record(record: RoundRecord, utility: ArraysUtility, seed: np.random.Generator,
                 aggregate: Aggregator | None = None,
                 progress: Callable[[int, int], None] | None = None, *, rule: str | None = None,
                 estimator: AdsSettings | None = None) -> RoundValuation:
    """The record's round game valued by the methods and ADS estimator its settings name, with the
    round's generator ``seed`` (:func:`fedvalue.valuation.round_game.value_round`); ``rule`` and ``estimator``
    (None: the record's own) value it under another coalition rule or ADS estimator."""
    settings = record.settings
    return value_round(record_game(record, utility, aggregate, rule), settings.methods,
                       settings.valuation if estimator is None else estimator, seed=seed, progress=progress)


def value_recorded_rounds(run_dir: str | os.PathLike, utility: ArraysUtility,
                          aggregate: Aggregator | None = None, *, rule: str | None = None,
                          estimator: AdsSettings | None = None) -> dict[int, RoundValuation]:
    """Every saved round of ``run_dir`` valued again under ``utility`` (another test set, another metric), each by
    its record's own game, methods, estimator and round seed (:func:`value_record` with ``[seed, t]``), so that
    with the run's own utility the books come back as booked; round -> its valuation (rounds with no valid reply
    are left out). ``rule`` and ``estimator`` value the same rounds under another coalition rule
    (:data:`fedvalue.valuation.settings.COALITION_RULES`) or ADS estimator. A round aggregated by its strategy's
    own code needs that ``aggregate`` (ValueError naming the round otherwise)."""
    valued = {}
    for server_round, path in round_record_paths(run_dir).items():
        record = read_round_record(path)
        if record.settings.by_strategy and aggregate is None:
            raise ValueError(f"aggregate: round {server_round} of {os.fspath(run_dir)!r} was aggregated by its "
                             "strategy's own code; expected that aggregation to value it again; got None")
        if valid_clients(record):
            valued[server_round] = value_record(record, utility, round_rng(record.settings.seed, server_round),
                                                aggregate, rule=rule, estimator=estimator)
    return valued
