"""The round game of a record: v_t(S) = U(Agg_t(A_{t−1}; S)) over the round's valid replies
([ADS] §3, the within-round game; :mod:`fedvalue.valuation.round_game`), built from the
:class:`~fedvalue.run.archive.RoundRecord` alone. The valuing strategy values each round from its
record as the intake left it, and the audit recomputes it from the saved record, through these
same two functions, so the two cannot build different games."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np

from fedvalue.run.archive import RoundRecord
from fedvalue.schema import Status
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.round_game import Aggregator, ArraysUtility, RoundValuation, round_game_for, value_round


def valid_clients(record: RoundRecord) -> list[Hashable]:
    """The players of the round game: every client with a reply whose first entry is ``ok``,
    in reply order."""
    statuses = record.statuses
    return [c for c in record.replies if statuses.get(c) == Status.OK]


def record_game(record: RoundRecord, utility: ArraysUtility, aggregate: Aggregator | None = None) -> CoalitionGame:
    """v_t over :func:`valid_clients`, each weighted by its entry's n_u: the weighted mean of the
    FedAvg family under the record's coalition rule (``aggregate`` None) or the inner strategy's own Agg_t
    (:func:`fedvalue.valuation.round_game.round_game_for`)."""
    ok, weights = valid_clients(record), record.weights
    return round_game_for(ok, record.start_arrays, [record.replies[c] for c in ok], [weights[c] for c in ok],
                          utility, aggregate, record.settings.coalition_rule)


def value_record(record: RoundRecord, utility: ArraysUtility, seed: np.random.Generator,
                 aggregate: Aggregator | None = None,
                 progress: Callable[[int, int], None] | None = None) -> RoundValuation:
    """The record's round game valued by the methods and ADS estimator its settings name, with the
    round's generator ``seed`` (:func:`fedvalue.valuation.round_game.value_round`)."""
    settings = record.settings
    return value_round(record_game(record, utility, aggregate), settings.methods, settings.valuation, seed=seed,
                       progress=progress)
