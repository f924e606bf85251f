"""A hostile federation: the project's own ClientApp, wrapped so that chosen partitions tamper
with what they send (as any client may run whatever code it likes).

Partition ``k < len(ROLES)`` plays ``ROLES[k]``; the next :data:`NUM_HONEST` partitions are
honest; the last :data:`QUERY_CLAIMS` nodes answer the server's partition-id query with an id
that is not one (so the node directory never registers them and no sampler picks them).

The train config's :data:`MODE_KEY` picks what the hostile partitions do:

* ``"attack"``: each trains honestly, then tampers with its reply as its role says;
* ``"reference"``: each fails at once (an error reply), so the round goes on without it:
  the run the honest clients' books must equal;
* ``"slow"``: as ``"reference"``, but partition 0 (``"slow"``, first in the engine's queue)
  sleeps for :data:`SLOW_S` seconds, far past the round's timeout.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from clients.app import ClientData, make_client_app, partition_id_of
from simulations.datasets.models import make_mlp
from strategies.protocol import (
    ARRAYS_KEY,
    CLIENT_RECORD_KEY,
    CONFIG_KEY,
    GRADIENT_KEY,
    INFERENCE_LOSS_KEY,
    METRICS_KEY,
    NUM_EXAMPLES_KEY,
    PARTITION_ID_KEY,
    TRAIN_LOSS_KEY,
)

FEATURES, CLASSES = 4, 3
MODE_KEY = "hostile-mode"
SLOW_S = 60.0
NUM_HONEST = 3
#: What each hostile partition does in attack mode, and (status, what its reason must contain).
ROLES: dict[str, tuple[str, str]] = {
    "slow": ("failed", "reference run: this client fails"),
    "complex-arrays": ("failed", "arrays['0.weight']: expected real floating point; got complex64"),
    "string-arrays": ("failed", "arrays['0.weight']: expected real floating point; got <U"),
    "id-zero": ("failed", "partition-id: expected an integer; got 'zero' (str)"),
    "id-list": ("failed", "partition-id: expected an integer; got [0, 1] (list)"),
    "id-float": ("failed", "partition-id: expected an integer; got 0.7 (float)"),
    "id-bool": ("failed", "partition-id: expected an integer; got True (bool)"),
    "id-bytes": ("failed", "partition-id: expected an integer; got b'2' (bytes)"),
    "id-arabic-digit": ("failed", "partition-id: expected an integer; got '٣' (str)"),
    "id-negative": ("failed", "partition-id: expected an integer >= 0; got -1"),
    "id-huge": ("failed", "partition-id: the reply claims client 1000000000000000000; its node"),
    "id-of-victim": ("failed", "partition-id: the reply claims client {victim}; its node"),
    "examples-inf": ("failed", "num-examples: expected a whole number in [1, 2**53]; got inf"),
    "examples-zero": ("failed", "num-examples: expected a whole number in [1, 2**53]; got 0"),
    "examples-negative": ("failed", "num-examples: expected a whole number in [1, 2**53]; got -1"),
    "examples-huge": ("failed", f"num-examples: expected a whole number in [1, 2**53]; got {2**60}"),
    "examples-fraction": ("failed", "num-examples: expected a whole number in [1, 2**53]; got 2.5"),
    "gradient-shape": ("failed", "inference-gradient['0.weight']: shape (2, 2) differs from the global model's"),
    "gradient-strings": ("failed", "inference-gradient['0.weight']: expected real floating point; got <U"),
    "gradient-nan": ("failed", "inference-gradient: non-finite values (NaN or inf) in ['0.weight']"),
    "loss-string": ("failed", "inference-loss: expected a finite number; got 'low' (str)"),
    "huge-arrays": ("rejected", "too large to aggregate"),
    "nan-arrays": ("rejected", "non-finite values (NaN or inf) in"),
    "metric-list": ("failed", "metrics['train-loss']: a list of 2 where the round's replies hold a number"),
    "metric-nan": ("failed", "metrics['train-loss']: expected a finite number or a list of them; got nan"),
    "renamed-arrays": ("failed", "ArrayRecord 'weights': the round's replies name it 'arrays'"),
    "second-arrays": ("failed", "expected one ArrayRecord and one MetricRecord; got 2 and 1"),
}
ROLE_NAMES = list(ROLES)
HONEST = list(range(len(ROLES), len(ROLES) + NUM_HONEST))
VICTIM = HONEST[0]
#: Partition ids the last nodes answer the directory's query with.
QUERY_CLAIMS = ["zero", [0, 1], 0.7, True, b"2", "٣"]
NUM_TRAINING = len(ROLES) + NUM_HONEST
NUM_NODES = NUM_TRAINING + len(QUERY_CLAIMS)


def expected(role: str) -> tuple[str, str]:
    """(status, reason fragment) a partition playing ``role`` must be booked with."""
    status, fragment = ROLES[role]
    return status, fragment.format(victim=VICTIM)


def model_factory() -> torch.nn.Module:
    return make_mlp(FEATURES, CLASSES, hidden=(6,), seed=0)


def load_client(partition_id: int) -> ClientData:
    rng = np.random.default_rng([11, partition_id])
    x = rng.normal(size=(16, FEATURES)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)).astype(np.int64)
    return ClientData(partition_id=partition_id, x_train=x[:10], y_train=y[:10], x_infer=x[10:], y_infer=y[10:])


def _arrays(reply: Message) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in reply.content[ARRAYS_KEY].items()}


def _record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})


def _claim(reply: Message, value) -> None:
    reply.content[CLIENT_RECORD_KEY][PARTITION_ID_KEY] = value


def _examples(reply: Message, value) -> None:
    reply.content[METRICS_KEY][NUM_EXAMPLES_KEY] = value


def _gradient(reply: Message, change) -> None:
    gradient = {k: v.numpy() for k, v in reply.content[GRADIENT_KEY].items()}
    reply.content[GRADIENT_KEY] = _record({k: change(v) if k == "0.weight" else v for k, v in gradient.items()})


def _numeric(reply: Message, fill: float) -> None:
    """Every array filled with ``fill``; no inference gradient (the books' flows stay the honest clients')."""
    reply.content[ARRAYS_KEY] = _record({k: np.full_like(v, fill) for k, v in _arrays(reply).items()})
    del reply.content[GRADIENT_KEY]


def _rename_arrays(reply: Message, name: str) -> None:
    record = reply.content[ARRAYS_KEY]
    del reply.content[ARRAYS_KEY]
    reply.content[name] = record


TAMPER = {
    "complex-arrays": lambda r: r.content.__setitem__(
        ARRAYS_KEY, _record({k: v.astype(np.complex64) for k, v in _arrays(r).items()})),
    "string-arrays": lambda r: r.content.__setitem__(
        ARRAYS_KEY, _record({k: np.full(v.shape, "abc") for k, v in _arrays(r).items()})),
    "id-zero": lambda r: _claim(r, "zero"),
    "id-list": lambda r: _claim(r, [0, 1]),
    "id-float": lambda r: _claim(r, 0.7),
    "id-bool": lambda r: _claim(r, True),
    "id-bytes": lambda r: _claim(r, b"2"),
    "id-arabic-digit": lambda r: _claim(r, "٣"),
    "id-negative": lambda r: _claim(r, -1),
    "id-huge": lambda r: _claim(r, 10**18),
    "id-of-victim": lambda r: _claim(r, VICTIM),
    "examples-inf": lambda r: _examples(r, float("inf")),
    "examples-zero": lambda r: _examples(r, 0),
    "examples-negative": lambda r: _examples(r, -1),
    "examples-huge": lambda r: _examples(r, 2**60),
    "examples-fraction": lambda r: _examples(r, 2.5),
    "gradient-shape": lambda r: _gradient(r, lambda v: np.zeros((2, 2), dtype=np.float32)),
    "gradient-strings": lambda r: _gradient(r, lambda v: np.full(v.shape, "g")),
    "gradient-nan": lambda r: _gradient(r, lambda v: np.full_like(v, np.nan)),
    "loss-string": lambda r: r.content[CLIENT_RECORD_KEY].__setitem__(INFERENCE_LOSS_KEY, "low"),
    "huge-arrays": lambda r: _numeric(r, 3e38),
    "nan-arrays": lambda r: _numeric(r, np.nan),
    "metric-list": lambda r: r.content[METRICS_KEY].__setitem__(TRAIN_LOSS_KEY, [1.0, 2.0]),
    "metric-nan": lambda r: r.content[METRICS_KEY].__setitem__(TRAIN_LOSS_KEY, float("nan")),
    "renamed-arrays": lambda r: _rename_arrays(r, "weights"),
    "second-arrays": lambda r: r.content.__setitem__("extra", _record({"x": np.zeros(2, dtype=np.float32)})),
}


def _mode(message: Message) -> str:
    configs = message.content.config_records
    return str(configs[CONFIG_KEY].get(MODE_KEY, "reference")) if CONFIG_KEY in configs else "reference"


def make_hostile_app() -> ClientApp:
    """The project's ClientApp (:func:`clients.app.make_client_app`) with the hostile partitions' tampering."""
    honest = make_client_app(load_client, model_factory)
    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        partition = partition_id_of(context)
        role = ROLE_NAMES[partition] if partition < len(ROLE_NAMES) else None
        mode = _mode(message)
        if role == "slow" and mode == "slow":
            time.sleep(SLOW_S)
        if role is not None and (mode != "attack" or role == "slow"):
            raise RuntimeError("reference run: this client fails")
        reply = honest(message, context)
        if role is not None:
            TAMPER[role](reply)
        return reply

    @app.query()
    def query(message: Message, context: Context) -> Message:
        reply = honest(message, context)
        partition = partition_id_of(context)
        if partition >= NUM_TRAINING:
            _claim(reply, QUERY_CLAIMS[partition - NUM_TRAINING])
        return reply

    return app
