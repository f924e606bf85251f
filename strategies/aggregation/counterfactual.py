"""Counterfactual aggregations of a round, made by the inner strategy's own code.

The round game values coalition S by v_t(S) = U(Agg_t(A_{t−1}; {reply_i : i ∈ S})) with
Agg_t the inner strategy's ``aggregate_train``. For that number to be the one the
strategy would really have produced, without the live run noticing, three rules hold:

1. **Replies are immutable inputs.** Flower strategies consume or rewrite the replies
   they aggregate (FedMedian, FedTrimmedAvg and QFedAvg ``pop`` the arrays out of each
   reply, Bulyan converts them with ``keep_input=False``, server-side DP clipping replaces
   each reply's ArrayRecord with the clipped one). Every counterfactual aggregation gets
   its own copy of the replies it aggregates (:func:`copy_reply`), made from copies taken
   before the live aggregation, and the live aggregation gets the untouched originals.
   A copy is new Message, RecordDict and record containers around the SAME
   ``flwr.app.Array`` objects: an Array's bytes are immutable and ``Array.numpy()``
   deserializes a fresh ndarray, so no model-size data is copied.
2. **A coalition is valued under the noise the round really drew** (common random
   numbers). Randomized strategies (DP Gaussian noise, adaptive clipping's noised count)
   draw from numpy's global generator. The round's random state — numpy's global
   generator, Python's ``random``, torch's generators — is captured when the round's
   replies arrive (:class:`RandomState`); every counterfactual aggregation starts from
   it and puts back the state it found, and the live aggregation starts from it too.
   So the full coalition draws exactly the realized step's noise, v_t(I_t) = U(A_t)
   holds for randomized strategies, and the live trajectory is the bare run's, bit for
   bit.
3. **A coalition the rule cannot aggregate leaves the state where it was.** When
   ``aggregate_train`` returns no arrays (Bulyan below 4f + 3 replies, a DP accountant
   refusing the count), Flower keeps the current global arrays; so does the game:
   v_t(S) = v_t(∅) = U(A_{t−1}). Such coalitions are counted
   (:attr:`CounterfactualAggregator.unaggregatable`) and booked per round.

Each coalition also aggregates on a fresh deep copy of the strategy as it was at round
start, so optimizer moments (FedAdam, FedYogi, FedAvgM), QFedAvg's current arrays and
adaptive clipping norms are never advanced by a counterfactual.

Flower calls ``gc.collect()`` after every ``keep_input=False`` conversion (QFedAvg, Bulyan):
a full collection of a server heap holding torch costs about 0.2 s, paid per reply of every
coalition. During a counterfactual aggregation the objects that existed before it are
frozen (``gc.freeze``), so those collections scan only what the aggregation made; garbage
among the frozen objects is collected as usual once they are unfrozen after it.
"""

from __future__ import annotations

import copy
import gc
import logging
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, FedProx, Strategy
from flwr.supercore.logger import FLOWER_LOGGER

from strategies.arrays import arrays_to_numpy
from strategies.aggregation.random_state import RandomState

Arrays = dict[str, np.ndarray]


@contextmanager
def _older_objects_frozen() -> Iterator[None]:
    """Explicit ``gc.collect()`` calls in the block scan only the objects made in it."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def _flower_silenced() -> Iterator[None]:
    """Flower logs nothing a counterfactual coalition would say about itself (an INFO line
    per call, warnings about coalitions smaller than the round): it is not the live run."""
    previous = FLOWER_LOGGER.level
    FLOWER_LOGGER.setLevel(max(logging.CRITICAL, previous))
    try:
        yield
    finally:
        FLOWER_LOGGER.setLevel(previous)


def _copy_record(record):
    if isinstance(record, ArrayRecord):
        return ArrayRecord(dict(record.items()))  # the same immutable Array objects
    if isinstance(record, MetricRecord):
        return MetricRecord(copy.deepcopy(dict(record)))
    if isinstance(record, ConfigRecord):
        return ConfigRecord(copy.deepcopy(dict(record)))
    return copy.deepcopy(record)


def copy_reply(message: Message) -> Message:
    """A reply an aggregation may consume or rewrite without touching ``message``: fresh
    containers (Message, RecordDict, records), shared immutable Array objects."""
    metadata = copy.copy(message.metadata)
    if message.has_error():
        return Message(metadata=metadata, error=copy.copy(message.error))
    content = RecordDict({key: _copy_record(record) for key, record in message.content.items()})
    return Message(metadata=metadata, content=content)


#: Strategies whose aggregate_train is the pure n-weighted mean of the replies.
PURE_WEIGHTED_MEAN = (FedAvg, FedProx)


def aggregates_by_weighted_mean(strategy: Strategy) -> bool:
    """Whether ``strategy`` aggregates by FedAvg's own ``aggregate_train``: FedAvg, FedProx
    and their subclasses that do not override it (a user's ``MyFedAvg``). Their coalitions
    are the n-weighted mean; every other strategy's need :class:`CounterfactualAggregator`."""
    return isinstance(strategy, PURE_WEIGHTED_MEAN) and type(strategy).aggregate_train in {
        cls.aggregate_train for cls in PURE_WEIGHTED_MEAN}


def snapshot_strategy(strategy: Strategy) -> Strategy:
    """A deep copy of ``strategy`` (its state at round start), with a clear error when it
    cannot be copied."""
    try:
        return copy.deepcopy(strategy)
    except Exception as error:  # noqa: BLE001 - any deepcopy failure gets the same advice
        raise TypeError(
            f"strategy: valuing a {type(strategy).__name__} needs copy.deepcopy of it at round start "
            f"(counterfactual coalitions must not touch the live optimizer state); deepcopy failed: "
            f"{error}. Make the strategy deep-copyable (hold no locks, files or grids)."
        ) from error


class CounterfactualAggregator:
    """Agg_t(S) by the inner strategy's own ``aggregate_train``, under the module's rules.

    Parameters
    ----------
    strategy
        The live inner strategy, before its live aggregation of the round (it is deep
        copied here and never touched again).
    server_round
        The round, as the live aggregation is told.
    messages
        The round's reply Messages by client id, before the live aggregation (copied
        here, so the live aggregation may consume the originals).
    start_arrays
        A_{t−1}: what a coalition the rule cannot aggregate leaves the state at.
    random_state
        The round's random state (captured when the replies arrived).
    """

    def __init__(self, strategy: Strategy, server_round: int, messages: Mapping[Hashable, Message],
                 start_arrays: Mapping[str, np.ndarray], random_state: RandomState) -> None:
        self.snapshot = snapshot_strategy(strategy)
        self.server_round = server_round
        self.messages = {client: copy_reply(message) for client, message in messages.items()}
        self.start_arrays = start_arrays
        self.random_state = random_state
        #: Coalitions (as tuples of client ids) for which the rule returned no arrays.
        self.unaggregatable: set[tuple] = set()

    def __call__(self, coalition: Sequence[Hashable]) -> Arrays:
        """The arrays the strategy aggregates from ``coalition``'s replies, in that order."""
        arrays = self.aggregate([copy_reply(self.messages[c]) for c in coalition])
        if arrays is None or len(arrays) == 0:
            self.unaggregatable.add(tuple(coalition))
            return self.start_arrays
        return arrays_to_numpy(arrays)

    def aggregate(self, replies: list[Message]) -> ArrayRecord | None:
        """``aggregate_train`` of a fresh copy of the round-start strategy on ``replies``
        (copies it may consume), from the round's random state."""
        strategy = copy.deepcopy(self.snapshot)
        with (_flower_silenced(), np.errstate(all="ignore"), self.random_state.replayed(),
              _older_objects_frozen()):
            arrays, _ = strategy.aggregate_train(self.server_round, replies)
        return arrays
