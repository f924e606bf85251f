"""Flower records <-> numpy on the server side (the only place that converts them)."""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, Message, RecordDict

from fedvalue.schema import Status
from strategies.protocol import (
    CLIENT_RECORD_KEY,
    CURVATURE_FISHER_PREFIX,
    CURVATURE_GRADIENT_PREFIX,
    CURVATURE_KEY,
    GRADIENT_KEY,
    INFERENCE_LOSS_KEY,
    PARTITION_ID_KEY,
)



def arrays_to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord as ``{key: ndarray}`` in the record's key order."""
    return {key: array.numpy() for key, array in record.items()}


def numpy_to_arrays(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({key: Array(np.asarray(value)) for key, value in arrays.items()})


def initial_arrays(model) -> ArrayRecord:
    """A torch model's state as the run's A_0 (brought to the CPU first)."""
    return numpy_to_arrays({key: value.detach().cpu().numpy() for key, value in model.state_dict().items()})


@dataclass
class ClientReply:
    """One client's reply in a round, as the books need it."""

    client_id: int | str
    node_id: int
    status: str  # "ok", "failed" (no usable reply) or "rejected" (non-finite arrays)
    arrays: dict[str, np.ndarray] | None = None
    weight: float | None = None
    metrics: dict = field(default_factory=dict)
    error: str = ""
    message: Message | None = None


def partition_id_of(content: RecordDict) -> int | None:
    """The partition id a client put in its reply's ConfigRecord, if any."""
    record = content.config_records.get(CLIENT_RECORD_KEY)
    if record is None or PARTITION_ID_KEY not in record:
        return None
    return int(record[PARTITION_ID_KEY])


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


def read_reply(message: Message, weighted_by_key: str, node_to_client: Mapping[int, int]) -> ClientReply:
    """Turn a reply Message into a :class:`ClientReply`; malformed replies are 'failed'."""
    node_id = int(message.metadata.src_node_id)
    fallback_id = node_to_client.get(node_id, f"node-{node_id}")
    if message.has_error():
        return ClientReply(fallback_id, node_id, Status.FAILED, error=concise_reason(message.error.reason), message=message)
    content = message.content
    client_id = partition_id_of(content)
    client_id = fallback_id if client_id is None else client_id
    array_records = list(content.array_records.values())
    metric_records = list(content.metric_records.values())
    if len(array_records) != 1 or len(metric_records) != 1:
        return ClientReply(
            client_id, node_id, Status.FAILED, message=message,
            error=f"expected one ArrayRecord and one MetricRecord; got {len(array_records)} and {len(metric_records)}",
        )
    metrics = dict(metric_records[0])
    weight = metrics.get(weighted_by_key)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
        return ClientReply(
            client_id, node_id, Status.FAILED, message=message, metrics=metrics,
            error=f"expected a positive '{weighted_by_key}' metric; got {weight!r}",
        )
    arrays = arrays_to_numpy(array_records[0])
    bad = [key for key, value in arrays.items() if value.dtype.kind in "fc" and not np.isfinite(value).all()]
    if bad:
        return ClientReply(
            client_id, node_id, Status.REJECTED, arrays=arrays, weight=float(weight), metrics=metrics, message=message,
            error=f"non-finite values (NaN or inf) in {bad}",
        )
    return ClientReply(client_id, node_id, Status.OK, arrays=arrays, weight=float(weight), metrics=metrics, message=message)


@dataclass
class InferenceGradient:
    """g_v = ∇ Σ_{z'} ℓ_{z'} at the state the client received, and that summed loss."""

    client_id: int | str
    gradient: dict[str, np.ndarray]
    loss: float


def take_inference_gradient(message: Message) -> InferenceGradient | None:
    """Remove the inference-gradient record from a reply (in place) and return it.

    The inner strategy must never see it: Flower averages every ArrayRecord key and
    rejects replies with a second ArrayRecord. Replies without one give None; a
    record without a partition id or a finite loss is dropped (the client then
    receives no inflow that round).
    """
    if message.has_error() or GRADIENT_KEY not in message.content.array_records:
        return None
    record = message.content.array_records[GRADIENT_KEY]
    del message.content[GRADIENT_KEY]
    client_id = partition_id_of(message.content)
    loss = message.content.config_records.get(CLIENT_RECORD_KEY, {}).get(INFERENCE_LOSS_KEY)
    if client_id is None or isinstance(loss, bool) or not isinstance(loss, (int, float)) or not np.isfinite(loss):
        return None
    gradient = arrays_to_numpy(record)
    if not all(np.isfinite(g).all() for g in gradient.values()):
        return None
    return InferenceGradient(client_id, gradient, float(loss))


@dataclass
class CurvatureReply:
    """A client's training loss gradient G_u and Fisher diagonal d_u at the state it received."""

    gradient: dict[str, np.ndarray]
    fisher: dict[str, np.ndarray]


def take_curvature(message: Message) -> CurvatureReply | None:
    """Remove the fairness-curvature record from a reply (in place) and return it.

    Like :func:`take_inference_gradient`: the inner strategy must never see it. The caller
    books it under the id of the reply that carried it. A record with non-finite values, a
    negative Fisher entry, or gradient and Fisher keys or shapes that differ, gives None
    (the client then has no curvature influence)."""
    if message.has_error() or CURVATURE_KEY not in message.content.array_records:
        return None
    record = arrays_to_numpy(message.content.array_records[CURVATURE_KEY])
    del message.content[CURVATURE_KEY]
    gradient = {k[len(CURVATURE_GRADIENT_PREFIX):]: v for k, v in record.items() if k.startswith(CURVATURE_GRADIENT_PREFIX)}
    fisher = {k[len(CURVATURE_FISHER_PREFIX):]: v for k, v in record.items() if k.startswith(CURVATURE_FISHER_PREFIX)}
    if not gradient or set(gradient) != set(fisher) or len(gradient) + len(fisher) != len(record):
        return None
    if not all(np.isfinite(v).all() for v in (*gradient.values(), *fisher.values())):
        return None
    if any((v < 0).any() for v in fisher.values()) or any(gradient[k].shape != fisher[k].shape for k in gradient):
        return None
    return CurvatureReply(gradient, fisher)


def reweigh(records: Sequence[ClientReply], accepted: set, factors: Mapping[Hashable, float],
            weighted_by_key: str) -> None:
    """Multiply each accepted reply's weight by its factor in the reply message the inner strategy
    aggregates (it then sees n_u w_u); the books keep n_u (``ClientReply.weight``)."""
    for record in records:
        if record.client_id in accepted:
            used = float(record.weight) * float(factors[record.client_id])
            for metrics in record.message.content.metric_records.values():
                if weighted_by_key in metrics:
                    metrics[weighted_by_key] = used
