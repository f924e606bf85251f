"""A Flower client mod giving any ClientApp what the valuation books need, in one line.

Flower's convention for behaviour that cuts across a ClientApp is a mod (as its
differential-privacy mods are): ``ClientApp(mods=[valuation_mod()])``. The mod

- puts the client's partition id in every train and evaluate reply (the ConfigRecord
  ``"client"``, key ``"partition-id"``; :mod:`strategies.protocol`), from the node's config
  ``partition-id`` (a SuperNode's ``--node-config``; the simulation engine sets it) or from a
  function of the :class:`flwr.app.Context` the user gives;
- answers the server's own queries (the config key ``"fedvalue-query"``) without calling the
  app: the node directory's (which partition this node holds) and TracIn's gradient query
  (g = ∇ Σ_{z' ∈ inference split} ℓ_{z'} at the arrays the query carries, [RECIP] Eq. 5), and,
  when the server asks for the inference gradient with a train message, adds it to the train
  reply, computed at the RECEIVED arrays before the app trains.

Flower dispatches a message to a mod only when the ClientApp registered a handler for its type
(``flwr.clientapp.ClientApp.__call__`` looks the handler up first and raises ``ValueError: No
query function registered with name 'default'`` without one; the runtime logs that as an ERROR
traceback and sends an error reply). Flower's app template registers ``train`` and ``evaluate``
only, so the recipe registers the no-op query handler :func:`valuation_query` beside the mod:

    app = ClientApp(mods=[valuation_mod()])
    app.query()(valuation_query)

and the server's queries reach the mod at once. Without it the server still finds the
partitions: it asks a node that answered its ``query`` with an error again with an ``evaluate``
message carrying the marker (:class:`strategies.NodeDirectory`), which this mod answers before
the app's own evaluate handler is reached; but every node then logs Flower's error first.

Gradients need the model and the client's inference data: give ``inference_gradient`` (e.g.
:class:`TorchInferenceGradient`). Without it, a server that books TracIn flows gets an error
reply naming the parameter; every other book works without it.

Under Ray the mod travels to the workers pickled with the ClientApp: it is a plain object
holding picklable functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from clients.training import LOSSES, set_model_arrays, summed_loss_gradient
from fedvalue._checks import check_integer
from strategies.protocol import (
    ARRAYS_KEY,
    CLIENT_RECORD_KEY,
    CONFIG_KEY,
    GRADIENT_KEY,
    INFERENCE_LOSS_KEY,
    PARTITION_ID_KEY,
    QUERY_KEY,
)

#: (summed inference loss, its gradient per state key) at the given arrays.
GradientFn = Callable[[Mapping[str, np.ndarray], Context], tuple[float, Mapping[str, np.ndarray]]]


class TorchInferenceGradient:
    """g = ∇_w Σ_{z' ∈ inference split} ℓ_{z'}(w) for a torch model ([RECIP] Eq. 5).

    Parameters
    ----------
    model_factory
        Builds the model whose ``state_dict`` keys the server's arrays carry (a module-level
        function: it is pickled to the workers).
    load_inference_data
        ``context -> (x, y)``: the client's inference split as arrays or tensors (e.g. its
        validation split), read in the worker.
    loss
        ``"cross_entropy"`` or ``"mse"``, the per-example loss local training averages.
    """

    def __init__(self, model_factory: Callable[[], torch.nn.Module],
                 load_inference_data: Callable[[Context], tuple], *, loss: str = "cross_entropy") -> None:
        if not callable(model_factory) or isinstance(model_factory, torch.nn.Module):
            raise TypeError("model_factory: expected a callable that builds a fresh torch.nn.Module; got "
                            f"{type(model_factory).__name__}.")
        if not callable(load_inference_data):
            raise TypeError("load_inference_data: expected a callable context -> (x, y); got "
                            f"{type(load_inference_data).__name__}.")
        if loss not in LOSSES:
            raise ValueError(f"loss: expected one of {list(LOSSES)}; got {loss!r}.")
        self.model_factory = model_factory
        self.load_inference_data = load_inference_data
        self.loss = loss

    def __call__(self, arrays: Mapping[str, np.ndarray], context: Context) -> tuple[float, dict[str, np.ndarray]]:
        x, y = self.load_inference_data(context)
        model = set_model_arrays(self.model_factory(), arrays)
        return summed_loss_gradient(model, x, y, loss=self.loss)


class ValuationMod:
    """The mod :func:`valuation_mod` returns (module docstring)."""

    def __init__(self, partition_id: Callable[[Context], int] | None = None,
                 inference_gradient: GradientFn | None = None) -> None:
        if partition_id is not None and not callable(partition_id):
            raise TypeError("partition_id: expected None (the node config's 'partition-id') or a callable "
                            f"context -> int; got {type(partition_id).__name__}.")
        if inference_gradient is not None and not callable(inference_gradient):
            raise TypeError("inference_gradient: expected None or a callable (arrays, context) -> (loss, gradients), "
                            f"e.g. clients.TorchInferenceGradient; got {type(inference_gradient).__name__}.")
        self.partition_id = partition_id
        self.inference_gradient = inference_gradient

    def __repr__(self) -> str:
        return f"valuation_mod(partition_id={self.partition_id!r}, inference_gradient={self.inference_gradient!r})"

    def client_id(self, context: Context) -> int:
        """This node's partition id, checked."""
        if self.partition_id is None:
            return check_integer(f"context.node_config[{PARTITION_ID_KEY!r}]", context.node_config.get(PARTITION_ID_KEY),
                                 0, why="the simulation engine sets it; a SuperNode needs --node-config "
                                        "'partition-id=N', or give valuation_mod(partition_id=...)")
        return check_integer("valuation_mod's partition_id(context)", self.partition_id(context), 0)

    def __call__(self, message: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        if _config(message.content).get(QUERY_KEY) is not None:
            return Message(self._identified(message, context, gradient=_wants_gradient(message)), reply_to=message)
        kind = str(message.metadata.message_type).split(".", 1)[0]
        # The gradient is taken at the arrays the server sent, before the app trains on them.
        gradient = (self._gradient(message, context) if kind == MessageType.TRAIN and _wants_gradient(message)
                    else None)
        reply = call_next(message, context)
        if reply.has_error() or kind not in (MessageType.TRAIN, MessageType.EVALUATE):
            return reply
        record = reply.content.config_records.get(CLIENT_RECORD_KEY)
        if record is None:
            reply.content[CLIENT_RECORD_KEY] = record = ConfigRecord()
        if PARTITION_ID_KEY not in record:
            record[PARTITION_ID_KEY] = self.client_id(context)
        if gradient is not None and GRADIENT_KEY not in reply.content.array_records:
            _add_gradient(reply.content, gradient)
        return reply

    def _identified(self, message: Message, context: Context, *, gradient: bool) -> RecordDict:
        """The answer to the server's query: the partition id, and the inference gradient when asked."""
        content = RecordDict({CLIENT_RECORD_KEY: ConfigRecord({PARTITION_ID_KEY: self.client_id(context)})})
        if gradient:
            _add_gradient(content, self._gradient(message, context))
        return content

    def _gradient(self, message: Message, context: Context) -> tuple[float, Mapping[str, np.ndarray]]:
        if self.inference_gradient is None:
            raise ValueError("inference_gradient: the server asks for this client's inference gradient (it books "
                             "TracIn flows), but valuation_mod was given none; pass valuation_mod(inference_gradient="
                             "clients.TorchInferenceGradient(model_factory, load_inference_data)).")
        records = message.content.array_records
        if ARRAYS_KEY not in records:
            raise ValueError(f"message content: expected the global model under {ARRAYS_KEY!r} with the gradient "
                             f"request; got array records {list(records)}.")
        arrays = {key: array.numpy() for key, array in records[ARRAYS_KEY].items()}
        loss, gradient = self.inference_gradient(arrays, context)
        return float(loss), gradient


def valuation_mod(partition_id: Callable[[Context], int] | None = None, *,
                  inference_gradient: GradientFn | None = None) -> ValuationMod:
    """A Flower client mod adding what the valuation books need to any ClientApp.

    ``ClientApp(mods=[valuation_mod()])`` (module docstring).

    Parameters
    ----------
    partition_id
        ``context -> int``: this client's partition id; None reads the node config's
        ``partition-id`` (what the simulation engine and ``--node-config`` set).
    inference_gradient
        ``(arrays, context) -> (summed loss, gradients)`` for TracIn flows
        (:class:`TorchInferenceGradient`); None: flows are not served.
    """
    return ValuationMod(partition_id, inference_gradient)


def valuation_query(message: Message, context: Context) -> Message:
    """The query handler a ClientApp with :func:`valuation_mod` registers: ``app.query()(valuation_query)``.

    Flower hands a ``query`` message to the app's mods only when a query handler is registered
    (module docstring); with this one the mod answers the server's queries and no node logs an
    error. The server's own queries never reach it (the mod answers them first); any other query
    gets an empty reply. A server query that does reach it means the mod is missing from the
    ClientApp: that is said as an error reply naming the fix.
    """
    if _config(message.content).get(QUERY_KEY) is not None:
        raise ValueError("valuation_query: the server's query reached the app's query handler, so the ClientApp "
                         "has no valuation mod; build it as ClientApp(mods=[clients.valuation_mod()]).")
    return Message(RecordDict(), reply_to=message)


def _config(content: RecordDict) -> ConfigRecord | dict:
    return content.config_records.get(CONFIG_KEY, {})


def _wants_gradient(message: Message) -> bool:
    return _config(message.content).get(GRADIENT_KEY) is True


def _add_gradient(content: RecordDict, gradient: tuple[float, Mapping[str, np.ndarray]]) -> None:
    loss, arrays = gradient
    content[GRADIENT_KEY] = ArrayRecord({key: Array(np.asarray(value)) for key, value in arrays.items()})
    content[CLIENT_RECORD_KEY][INFERENCE_LOSS_KEY] = float(loss)
