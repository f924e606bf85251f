"""A round's messages on the server side, and the only place that turns a reply into arrays: the
server's own queries (:func:`query_message`), which node a reply answers (:func:`sent_nodes`,
:func:`reply_node`) and which client it is booked under (:func:`sender_identity`: the partition its
node registered, never what the reply claims), and each reply read into a :class:`ClientReply`,
every field checked (:func:`read_reply`)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.logger import log

from fedvalue.schema import Status
from strategies.arrays import arrays_to_numpy
from strategies.protocol import (
    ARRAYS_KEY,
    CLIENT_RECORD_KEY,
    CONFIG_KEY,
    CURVATURE_FISHER_PREFIX,
    CURVATURE_GRADIENT_PREFIX,
    CURVATURE_KEY,
    GRADIENT_KEY,
    INFERENCE_LOSS_KEY,
    NUM_EXAMPLES_KEY,
    PARTITION_ID_KEY,
    QUERY_KEY,
)
from strategies.reply_checks import array_problems, id_problem, loss_problem, metric_problem, shown, weight_problem



def sent_nodes(messages: Iterable[Message]) -> dict[str, int]:
    """message id -> the node it was sent to, for the messages the grid gave ids (it sets them
    when it pushes the messages); empty when ids are missing or repeat (an in-process grid)."""
    pairs = [(str(m.metadata.message_id), int(m.metadata.dst_node_id)) for m in messages]
    ids = [i for i, _ in pairs]
    if not ids or "" in ids or len(set(ids)) != len(ids):
        return {}
    return dict(pairs)


def reply_node(reply: Message, sent_to: Mapping[str, int]) -> int:
    """The node ``reply`` answers for: the one its instruction was sent to, else its sender."""
    node = sent_to.get(str(reply.metadata.reply_to_message_id))
    return int(reply.metadata.src_node_id) if node is None else node


def query_message(content: RecordDict, node_id: int, message_type: str, query: str) -> Message:
    """The server's own query ``query`` to ``node_id`` as a message of ``message_type``: its
    ``"config"`` carries the marker ``"fedvalue-query"`` (``content`` is not changed)."""
    records = dict(content.items())
    config = dict(records.get(CONFIG_KEY, {}))
    records[CONFIG_KEY] = ConfigRecord({**config, QUERY_KEY: query})
    return Message(RecordDict(records), dst_node_id=node_id, message_type=message_type)


def send_in_batches(grid: Grid, queries: list[Message], timeout: float, batch: int | None,
                    what: str = "queries") -> list[Message]:
    """The replies to ``queries``, sent ``batch`` at a time (None: all at once), each batch answered (or timed out)
    before the next goes, all within ``timeout`` seconds; queries not sent by then are logged as ``what``. Flower's
    in-memory link state scans every queued message on each node's poll, so a thousand queries queued at once cost
    O(nodes × queued) a poll (docs/benchmarks.md, the flows at 1,000 clients)."""
    size = len(queries) if batch is None else batch
    deadline, replies = time.monotonic() + timeout, []
    for start in range(0, len(queries), max(size, 1)):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            log(logging.WARNING, "%d %s not sent: the query timeout (%.0f s) ran out", len(queries) - start, what,
                timeout)
            break
        replies += list(grid.send_and_receive(queries[start:start + size], timeout=remaining))
    return replies


def claimed_partition(content: RecordDict) -> tuple[int | None, str | None]:
    """The partition id a reply claims in its ConfigRecord ``"client"``, as (id, None); (None,
    None) when it claims none; (None, why) when the claim is not an integer ≥ 0."""
    record = content.config_records.get(CLIENT_RECORD_KEY)
    if record is None or PARTITION_ID_KEY not in record:
        return None, None
    value = record[PARTITION_ID_KEY]
    problem = id_problem(value)
    return (None, f"{PARTITION_ID_KEY}: {problem}") if problem else (value, None)


def sender_identity(content: RecordDict, node_id: int, node_to_client: Mapping[int, Hashable],
                    client_to_node: Mapping[Hashable, int]) -> tuple[Hashable, str | None]:
    """The client a reply from ``node_id`` is booked under, and why the reply fails (or None).

    A registered node's reply is its registered partition's; a claim that is not an integer,
    or names another partition, fails it. An unregistered node (a run that never asked the
    directory) is booked under its claim when that is an integer no registered node holds,
    else under ``node-<id>``.
    """
    claimed, problem = claimed_partition(content)
    registered = node_to_client.get(node_id)
    if registered is not None:
        if problem is None and claimed is not None and claimed != registered:
            problem = (f"{PARTITION_ID_KEY}: the reply claims client {claimed}; its node {node_id} registered "
                       f"partition {registered}")
        return registered, problem
    if problem is None and claimed is not None and claimed in client_to_node:
        problem = (f"{PARTITION_ID_KEY}: the reply claims client {claimed}, which node {client_to_node[claimed]} "
                   "registered")
    if problem is not None or claimed is None:
        return f"node-{node_id}", problem
    return claimed, None


@dataclass
class InferenceGradient:
    """g_v = ∇ Σ_{z'} ℓ_{z'} at the state the client received, and that summed loss."""

    client_id: int | str
    gradient: dict[str, np.ndarray]
    loss: float


@dataclass
class CurvatureReply:
    """A client's training loss gradient G_u and Fisher diagonal d_u at the state it received."""

    gradient: dict[str, np.ndarray]
    fisher: dict[str, np.ndarray]


@dataclass
class ClientReply:
    """One client's reply in a round, as the books need it: every field checked
    (:mod:`strategies.reply_checks`), the client the sender's node registered."""

    client_id: int | str
    node_id: int
    status: str  # "ok", "failed" (no usable reply) or "rejected" (arrays too large or not finite)
    arrays: dict[str, np.ndarray] | None = None
    weight: float | None = None
    metrics: dict = field(default_factory=dict)
    error: str = ""
    message: Message | None = None
    #: The inference gradient and the curvature this very reply carried (None: none, or not checked).
    gradient: InferenceGradient | None = None
    curvature: CurvatureReply | None = None
    #: The metric its weight was read from (the inner strategy's ``weighted_by_key``).
    weight_key: str = NUM_EXAMPLES_KEY

    @property
    def by_examples(self) -> bool:
        """Whether its weight is an example count (the default weight key)."""
        return self.weight_key == NUM_EXAMPLES_KEY

    def weigh(self, weight: float) -> None:
        """Put ``weight`` in the reply message the inner strategy aggregates (under :attr:`weight_key`);
        the books keep :attr:`weight`."""
        if self.message is not None and not self.message.has_error():
            for metrics in self.message.content.metric_records.values():
                if self.weight_key in metrics:
                    metrics[self.weight_key] = weight


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Longest reason booked in the ledger (a client's traceback can be pages long).
MAX_REASON_CHARS = 300


def concise_reason(text: str) -> str:
    """A client error as one readable line: terminal colours and Ray's wrapping removed (the
    client's own message follows Flower's "Message: "), whitespace collapsed, length capped."""
    text = _ANSI.sub("", str(text))
    if "Message: " in text:
        text = text.rsplit("Message: ", 1)[1].rstrip("'>) \n")
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def read_arrays(record: ArrayRecord, field: str) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """A reply's ArrayRecord as numpy arrays, or why it cannot be read (its bytes are the sender's)."""
    try:
        return arrays_to_numpy(record), None
    except Exception as error:  # noqa: BLE001 - any decoding failure of untrusted bytes is the reply's fault
        return None, f"{field}: cannot be read as numpy arrays ({concise_reason(f'{type(error).__name__}: {error}')})"


def take_record(message: Message, key: str) -> ArrayRecord | None:
    """Remove the ArrayRecord ``key`` from a reply (in place) and return it, unread.

    Inference gradients and curvature travel so; the inner strategy must never see them:
    Flower averages every ArrayRecord key and rejects replies with a second ArrayRecord."""
    if message.has_error() or key not in message.content.array_records:
        return None
    record = message.content.array_records[key]
    del message.content[key]
    return record


def read_reply(message: Message, weighted_by_key: str, node_to_client: Mapping[int, int], *,
               node_id: int | None = None, model: Mapping[str, np.ndarray] | None = None,
               client_to_node: Mapping[int, int] | None = None,
               extras: tuple[ArrayRecord | None, ArrayRecord | None] = (None, None)) -> ClientReply:
    """Turn a reply Message into a :class:`ClientReply`, every field checked.

    ``node_id`` is the node the instruction was sent to (default: the reply's sender); the
    reply is that node's registered client's (:func:`sender_identity`).
    ``model`` (A_{t−1}) gives the keys, shapes and dtypes the arrays must have; ``extras`` are
    the inference-gradient and curvature records taken out of this reply
    (:func:`take_record`). A reply no aggregation can take, or whose id, weight, gradient,
    curvature or metrics fail their checks, is ``failed``; one whose arrays are not finite
    or too large to aggregate is ``rejected``; each with a reason naming the field.
    """
    node_id = int(message.metadata.src_node_id) if node_id is None else int(node_id)
    if message.has_error():
        return ClientReply(node_to_client.get(node_id, f"node-{node_id}"), node_id, Status.FAILED,
                           error=concise_reason(message.error.reason), message=message)
    client_to_node = {c: n for n, c in node_to_client.items()} if client_to_node is None else client_to_node
    client_id, problem = sender_identity(message.content, node_id, node_to_client, client_to_node)
    reply = ClientReply(client_id, node_id, Status.FAILED, message=message, weight_key=weighted_by_key)
    if problem is None:
        problem = _read_update(reply, model)
    if problem is None:
        problem = _read_extras(reply, model, *extras)
    if problem is None and reply.status == Status.OK:
        problem = next((f"metrics[{k!r}]: {p}" for k, v in reply.metrics.items() if (p := metric_problem(v))), None)
    if problem is not None:
        reply.status, reply.error = Status.FAILED, problem
    return reply


def _read_update(reply: ClientReply, model: Mapping[str, np.ndarray] | None) -> str | None:
    """Read the update's arrays and weight into ``reply`` (ok, or rejected when they are
    numerically unusable); the reason it fails otherwise."""
    content = reply.message.content
    array_records = list(content.array_records.values())
    metric_records = list(content.metric_records.values())
    if len(array_records) != 1 or len(metric_records) != 1:
        return f"expected one ArrayRecord and one MetricRecord; got {len(array_records)} and {len(metric_records)}"
    reply.metrics = dict(metric_records[0])
    weight = reply.metrics.get(reply.weight_key)
    problem = weight_problem(weight, whole=reply.by_examples)
    if problem is not None:
        return f"{reply.weight_key}: {problem}"
    arrays, problem = read_arrays(array_records[0], ARRAYS_KEY)
    if problem is not None:
        return problem
    fatal, numeric = array_problems(arrays, model, ARRAYS_KEY)
    if fatal is not None:
        return fatal
    reply.arrays, reply.weight = arrays, float(weight)
    reply.status, reply.error = (Status.OK, "") if numeric is None else (Status.REJECTED, numeric)
    return None


def _read_extras(reply: ClientReply, model: Mapping[str, np.ndarray] | None, gradient: ArrayRecord | None,
                 curvature: ArrayRecord | None) -> str | None:
    """Read the inference gradient and curvature this reply carried into it; the reason the
    reply fails when either is malformed."""
    if gradient is not None:
        read = read_inference_gradient(gradient, reply.message.content, model)
        if isinstance(read, str):
            return read
        reply.gradient = InferenceGradient(reply.client_id, *read)
    if curvature is not None:
        read = read_curvature(curvature, model)
        if isinstance(read, str):
            return read
        reply.curvature = read
    return None


def read_inference_gradient(record: ArrayRecord, content: RecordDict,
                            model: Mapping[str, np.ndarray] | None) -> tuple[dict[str, np.ndarray], float] | str:
    """(g, loss) from an inference-gradient record and the reply's ``"inference-loss"``, or why
    they are malformed: g must have the model's keys and shapes, a real floating dtype,
    finite values of a magnitude the flows' dot products can carry; the loss a finite number."""
    gradient, problem = read_arrays(record, GRADIENT_KEY)
    if problem is not None:
        return problem
    fatal, numeric = array_problems(gradient, model, GRADIENT_KEY)
    if fatal is not None or numeric is not None:
        return fatal or f"{GRADIENT_KEY}: {numeric}"
    client = content.config_records.get(CLIENT_RECORD_KEY)
    loss = None if client is None else client.get(INFERENCE_LOSS_KEY)
    problem = loss_problem(loss)
    return f"{INFERENCE_LOSS_KEY}: {problem}" if problem else (gradient, float(loss))


def read_curvature(record: ArrayRecord, model: Mapping[str, np.ndarray] | None) -> CurvatureReply | str:
    """G_u and d_u from a fairness-curvature record, or why it is malformed: both halves the
    model's keys and shapes, real floating point, finite and of bounded magnitude, d_u ≥ 0."""
    arrays, problem = read_arrays(record, CURVATURE_KEY)
    if problem is not None:
        return problem
    gradient, fisher = _unprefixed(arrays, CURVATURE_GRADIENT_PREFIX), _unprefixed(arrays, CURVATURE_FISHER_PREFIX)
    if not gradient or set(gradient) != set(fisher) or len(gradient) + len(fisher) != len(arrays):
        return (f"{CURVATURE_KEY}: expected '{CURVATURE_GRADIENT_PREFIX}KEY' and '{CURVATURE_FISHER_PREFIX}KEY' for "
                f"the same keys; got {shown(list(arrays))}")
    for prefix, half in ((CURVATURE_GRADIENT_PREFIX, gradient), (CURVATURE_FISHER_PREFIX, fisher)):
        field = f"{CURVATURE_KEY} {prefix.rstrip('/')}"
        fatal, numeric = array_problems(half, model if model is not None else gradient, field)
        if fatal is not None or numeric is not None:
            return fatal or f"{field}: {numeric}"
    if any((v < 0).any() for v in fisher.values()):
        return f"{CURVATURE_KEY} fisher: expected a Fisher diagonal >= 0; got negative entries"
    return CurvatureReply(gradient, fisher)


def reweigh(records: Sequence[ClientReply], accepted: set, factors: Mapping[Hashable, float]) -> None:
    """Multiply each accepted reply's weight by its factor in the reply message the inner strategy
    aggregates (it then sees n_u w_u); the books keep n_u (``ClientReply.weight``)."""
    for record in records:
        if record.client_id in accepted:
            record.weigh(float(record.weight) * float(factors[record.client_id]))


def _unprefixed(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The arrays whose keys start with ``prefix``, under the keys that follow it."""
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
