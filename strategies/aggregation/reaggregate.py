"""A round's aggregation replayed from its record, for strategies that aggregate by their own code.

The round game of a strategy other than the FedAvg family values coalition S by
v_t(S) = U(Agg_t(A_{t−1}; {reply_i : i ∈ S})) with Agg_t the inner strategy's
``aggregate_train`` (:mod:`strategies.aggregation.counterfactual`). To book such a round again an audit
needs Agg_t exactly as it was: the inner strategy in its state when the replies arrived
(FedAdam's moments, QFedAvg's current arrays, an adaptive clipping norm), the global random
state DP noise is drawn from, and the replies as Messages (their arrays and metric
records). The valuing strategy saves all of it as data in the round record
(:func:`replay_state`, :class:`fedvalue.run.archive.RoundRecord`'s ``replay``); an auditor who
can build the run's inner strategy afresh from its configuration (the simulation that made
the run can) gets back a :class:`~strategies.aggregation.counterfactual.CounterfactualAggregator` that
aggregates every coalition as the live run did (:func:`replay_aggregator`). Nothing is
constructed from a saved name: the saved state is applied to the strategy the auditor built
(:mod:`strategies.aggregation.server_state`), so a record cannot make the audit run code.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence

from flwr.app import Error, Message, MessageType, Metadata, MetricRecord, RecordDict
from flwr.serverapp.strategy import Strategy

from fedvalue.run.archive import RoundRecord
from fedvalue.schema import WEIGHED_STATUSES
from strategies.aggregation import server_state
from strategies.aggregation.counterfactual import Arrays, CounterfactualAggregator, copy_reply
from strategies.aggregation.random_state import RandomState
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from strategies.replies import ClientReply


def replay_state(strategy: Strategy, random_state: RandomState,
                 replies: Sequence[ClientReply]) -> tuple[object, dict]:
    """What replaying the round's aggregation needs, as data: the inner strategy's state,
    the round's random state, each ok or rejected reply's array record name and metric
    records (the first reply under each client id) and each error reply's code and reason
    (by its position among the round's entries: the live aggregation is given them too).
    Raises :class:`strategies.aggregation.server_state.StateNotCaptured` when the strategy holds
    something that is not data."""
    contents: dict[Hashable, dict] = {}
    errors: dict[int, tuple[int, str]] = {}
    for position, reply in enumerate(replies):
        if reply.message is not None and reply.message.has_error():
            errors[position] = (int(reply.message.error.code), str(reply.message.error.reason))
        elif reply.status in WEIGHED_STATUSES and reply.client_id not in contents:
            content = reply.message.content
            contents[reply.client_id] = {
                "arrays": next(iter(content.array_records)),
                "metrics": {name: dict(record) for name, record in content.metric_records.items()},
            }
    return server_state.capture({
        "strategy": strategy,
        "random": (random_state.numpy, random_state.python, random_state.torch_cpu),
        "replies": contents,
        "errors": errors,
    })


def replay_state_or_reason(strategy: Strategy, random_state: RandomState,
                           replies: Sequence[ClientReply]) -> tuple[object, dict] | str:
    """:func:`replay_state`, or why it cannot be saved (the audit then says the round is not
    verifiable)."""
    try:
        return replay_state(strategy, random_state, replies)
    except server_state.StateNotCaptured as error:
        return str(error)


def _metadata(server_round: int) -> Metadata:
    return Metadata(run_id=0, message_id="", src_node_id=0, dst_node_id=0, reply_to_message_id="",
                    group_id=str(server_round), created_at=0.0, ttl=0.0, message_type=MessageType.TRAIN)


def _reply(server_round: int, arrays: Mapping, content: Mapping) -> Message:
    """A reply Message as the strategy received it: its arrays and metric records."""
    records = RecordDict({str(content["arrays"]): numpy_to_arrays(arrays)})
    for name, metrics in content["metrics"].items():
        records[str(name)] = MetricRecord(dict(metrics))
    return Message(content=records, metadata=_metadata(server_round))


class ReplayedAggregator(CounterfactualAggregator):
    """Agg_t rebuilt from a round record: counterfactual coalitions as the live run made
    them, and :meth:`realized`, the live aggregation itself (given the error replies too,
    in the order the live run passed them)."""

    def __init__(self, *args, passed: Sequence[Message | Hashable], **keywords) -> None:
        super().__init__(*args, **keywords)
        self.passed = list(passed)

    def realized(self) -> Arrays | None:
        """A_t as the live aggregation made it; None when it returned no arrays."""
        replies = [copy_reply(item) if isinstance(item, Message) else copy_reply(self.messages[item])
                   for item in self.passed]
        arrays = self.aggregate(replies)
        return None if arrays is None or len(arrays) == 0 else arrays_to_numpy(arrays)


def replay_aggregator(build_strategy: Callable[[], Strategy]) -> Callable[[RoundRecord], ReplayedAggregator]:
    """``record -> Agg_t`` for the audit (``audit_run(..., replay=...)``): ``build_strategy``
    builds the run's inner strategy afresh from its configuration; the record's saved state
    is applied to it. ValueError naming what is missing or does not fit."""

    def aggregator_of(record: RoundRecord) -> ReplayedAggregator:
        if record.replay is None:
            why = record.replay_missing or "it was written by a version that did not save it"
            raise ValueError(f"its record holds no replay state ({why})")
        saved = server_state.load(*record.replay)
        try:
            strategy = server_state.apply(build_strategy(), saved["strategy"], "strategy")
            numpy_state, python_state, torch_state = saved["random"]
            random_state = RandomState(numpy_state, python_state, torch_state, None)
            contents, errors = saved["replies"], saved["errors"]
            messages = {client: _reply(record.round, arrays, contents[client])
                        for client, arrays in record.replies.items()}
            passed = []
            if record.passed is None:
                raise ValueError("its record does not say which replies the strategy was given")
            for position in record.passed:
                if position in errors:
                    code, reason = errors[position]
                    passed.append(Message(metadata=_metadata(record.round), error=Error(code=code, reason=reason)))
                else:
                    passed.append(record.entries[position].client_id)
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise ValueError(f"its replay state does not fit the run's strategy ({error})") from None
        return ReplayedAggregator(strategy, record.round, messages, record.start_arrays, random_state, passed=passed)

    return aggregator_of
