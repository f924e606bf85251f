"""The Flower ClientApp of the simulations: local torch training with scripted behaviours.

Messages (Flower 1.41 Message API):

- ``train``: content ``"arrays"`` (the global model, an ArrayRecord) and ``"config"``
  (ConfigRecord: ``"lr"``, ``"local-epochs"``, ``"batch-size"`` (0 = full batch,
  default 0), ``"seed"`` (default 0), ``"server-round"`` (FedAvg adds it),
  ``"proximal-mu"`` (FedProx adds it: local training then minimizes
  ℓ(w) + (μ/2)‖w − w_global‖²)). Reply:
  ``"arrays"`` (the trained model), ``"metrics"`` (MetricRecord ``num-examples``,
  ``train-loss``) and ``"client"`` (ConfigRecord ``partition-id``). The partition id
  is in a ConfigRecord because FedAvg checks only the ArrayRecord and MetricRecord
  counts and averages every metric (a MetricRecord id would be averaged).
- ``evaluate``: the received model on the client's inference split (its training split
  when that is empty). Reply: ``"metrics"`` (``num-examples``, ``eval-loss`` and, for
  classification, ``eval-accuracy``) and ``"client"``.
- ``query``: reply ``"client"`` only, so the server can map random node ids to
  partition ids before sampling (:class:`strategies.ValuingStrategy` asks). A query
  that carries ``"arrays"`` and config ``"inference-gradient": True`` is answered
  with the inference gradient at those arrays (below), without training. A query that
  carries ``"arrays"`` and config ``"local-loss": True`` is answered with ``"local-loss"`` in
  ``"client"``: the mean training loss at those arrays on the data the client would train on
  in round ``"server-round"`` (its behaviour applied, as in ``train``), for loss-based client
  selection (Power-of-Choice, :class:`strategies.policies.power_of_choice.PowerOfChoice`).
- Inference gradients (TracIn flows, [RECIP]): when the train or query config holds
  ``"inference-gradient": True`` the reply also carries ``"inference-gradient"``, an
  ArrayRecord with g = ∇ Σ_{z' ∈ inference split} ℓ_{z'} at the RECEIVED arrays
  (computed before local training), and ``"inference-loss"`` (that sum) in the
  ``"client"`` ConfigRecord. The server takes the record out before the inner strategy
  aggregates (a second ArrayRecord breaks Flower's reply checks).
- Fairness curvature ([FAIRIJ] App. A, :mod:`fedvalue.scoring.fairness.curvature`): when the train or
  query config holds ``"fair-curvature": True`` the reply also carries ``"fair-curvature"``,
  an ArrayRecord with the training split's loss gradient Σ_n ∇ℓ_n (``"gradient/KEY"``) and
  empirical Fisher diagonal Σ_n ∇ℓ_n² (``"fisher/KEY"``) at the RECEIVED arrays (before local
  training), float64; the server takes it out likewise.

Randomness: round t of partition i with run seed s draws everything from
``SeedSequence([s, i, t])``: the same run seed gives the same training.

Device: ``make_client_app(..., device="cuda")`` trains, evaluates and takes gradients on that
device (the model is moved there; the data follow it, :mod:`clients.training`); replies are CPU
arrays either way, and on CPU the results are bit for bit those of a run without the argument. A
Ray worker sees only the GPUs of its share: Ray sets ``CUDA_VISIBLE_DEVICES=''`` for a client
holding no GPU share, so CUDA clients need ``num_gpus_per_client > 0``, and the GPU a worker is
given is its ``"cuda"`` (index 0 of what it sees). On CUDA, bit-for-bit equality across runs is not
promised (cuDNN's algorithm choice, atomic reductions) unless torch's deterministic algorithms are
on (``torch.use_deterministic_algorithms(True)``).

Under Ray the ClientApp (and what its handlers close over: ``load_client_data``,
``model_factory``) is pickled and sent to a worker with every message, so both must be
picklable (module-level functions or ``functools.partial`` of them) and should not
close over large data: load it inside ``load_client_data`` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod

from fedvalue._checks import check_integer, check_non_negative, check_positive, integer_wording
from clients.attacks.memory import prepare_round
from clients.behaviours import ClientBehaviour, HonestClient
from clients.seeding import seeded_call
from clients.training import (
    LOSSES,
    evaluate_model,
    get_model_arrays,
    loss_gradient_and_fisher,
    set_model_arrays,
    summed_loss_gradient,
    train_locally,
)
from strategies.protocol import (
    ARRAYS_KEY,
    BATCH_SIZE_KEY,
    CLIENT_RECORD_KEY,
    CONFIG_KEY,
    CURVATURE_FISHER_PREFIX,
    CURVATURE_GRADIENT_PREFIX,
    CURVATURE_KEY,
    DATA_KEY,
    GRADIENT_KEY,
    INFERENCE_LOSS_KEY,
    LEARNING_RATE_KEY,
    LOCAL_EPOCHS_KEY,
    LOCAL_LOSS_KEY,
    METRICS_KEY,
    NUM_EXAMPLES_KEY,
    PARTITION_ID_KEY,
    PROXIMAL_MU_KEY,
    SEED_KEY,
    SERVER_ROUND_KEY,
    TRAIN_LOSS_KEY,
)


@dataclass
class ClientData:
    """What one simulated client holds.

    Attributes
    ----------
    partition_id
        The client's id (its partition); replies carry it.
    x_train, y_train
        Local training data (non-empty).
    x_infer, y_infer
        Inference split (for evaluation and inference gradients); may be empty.
    behaviour
        The client's script (:mod:`clients.behaviours`); honest by default.
    loss
        ``"cross_entropy"`` or ``"mse"``.
    """

    partition_id: int
    x_train: np.ndarray
    y_train: np.ndarray
    x_infer: np.ndarray
    y_infer: np.ndarray
    behaviour: ClientBehaviour = field(default_factory=HonestClient)
    loss: str = "cross_entropy"

    def __post_init__(self) -> None:
        self.partition_id = check_integer("partition_id", self.partition_id, 0)
        for split in ("train", "infer"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
                raise TypeError(
                    f"x_{split}, y_{split}: expected numpy arrays; got {type(x).__name__} and {type(y).__name__}."
                )
            if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
                raise ValueError(
                    f"x_{split}, y_{split}: expected N x d inputs and N labels; got shapes {x.shape} and {y.shape}."
                )
        if len(self.x_train) == 0:
            raise ValueError(f"x_train: expected at least one training example for client {self.partition_id}; got 0.")
        if not isinstance(self.behaviour, ClientBehaviour):
            raise TypeError(
                f"behaviour: expected a clients.behaviours.ClientBehaviour; got {type(self.behaviour).__name__}."
            )
        if self.loss not in LOSSES:
            raise ValueError(f"loss: expected one of {list(LOSSES)}; got {self.loss!r}.")


def partition_id_of(context: Context) -> int:
    """The partition id the simulation engine put in ``context.node_config``."""
    value = context.node_config.get(PARTITION_ID_KEY)
    return check_integer(f"context.node_config[{PARTITION_ID_KEY!r}]", value, 0,
                         why="the simulation engine sets it; a deployed SuperNode needs --node-config "
                             "'partition-id=N'")


def _record(content: RecordDict, key: str, kind: str):
    """``content[key]``, or the only record of that kind when the key differs."""
    records = content.array_records if kind == "ArrayRecord" else content.config_records
    if key in records:
        return records[key]
    if len(records) == 1:
        return next(iter(records.values()))
    raise ValueError(
        f"message content: expected an {kind} under {key!r} (or exactly one {kind}); got keys {list(records)}."
    )


def _config_int(config: ConfigRecord, key: str, default: int | None, minimum: int) -> int:
    if key not in config:
        if default is None:
            raise ValueError(f"train config: expected key {key!r} ({integer_wording(minimum)}); keys sent: "
                             f"{list(config)}.")
        return default
    return check_integer(f"train config {key!r}", config[key], minimum)


def _learning_rate(config: ConfigRecord) -> float:
    try:
        return check_positive(f"train config {LEARNING_RATE_KEY!r}", config.get(LEARNING_RATE_KEY))
    except ValueError as error:
        raise ValueError(f"{error} Keys sent: {list(config)}.") from None


def _client_record(partition_id: int) -> ConfigRecord:
    return ConfigRecord({PARTITION_ID_KEY: partition_id})


def _wants_gradient(content: RecordDict, key: str = GRADIENT_KEY) -> bool:
    configs = content.config_records
    return CONFIG_KEY in configs and configs[CONFIG_KEY].get(key) is True


def _add_curvature(content: RecordDict, data: ClientData, model_factory, global_arrays, device: torch.device) -> None:
    """Put the training split's loss gradient and Fisher diagonal at ``global_arrays`` into a reply."""
    model = _model(model_factory, global_arrays, [data.partition_id], device)
    gradient, fisher = loss_gradient_and_fisher(model, data.x_train, data.y_train, loss=data.loss)
    content[CURVATURE_KEY] = ArrayRecord({
        **{CURVATURE_GRADIENT_PREFIX + key: Array(value) for key, value in gradient.items()},
        **{CURVATURE_FISHER_PREFIX + key: Array(value) for key, value in fisher.items()}})


_DEVICE_TYPES = ("cpu", "cuda")


def _client_device(device: str | torch.device) -> torch.device:
    """``device`` as a :class:`torch.device` of type ``"cpu"`` or ``"cuda"``; ValueError naming it otherwise.
    Whether this process has that device is checked where the model is built (:func:`_usable_device`)."""
    try:
        parsed = torch.device(device) if isinstance(device, (str, torch.device)) else None
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in _DEVICE_TYPES:
        raise ValueError(f"device: expected a torch device string of type {' or '.join(_DEVICE_TYPES)} "
                         f"('cpu', 'cuda', 'cuda:0', ...); got {device!r}.")
    return parsed


def _usable_device(device: str | torch.device) -> torch.device:
    """:func:`_client_device`, refused with a clear ValueError when this process sees no such CUDA device
    (in a Ray worker: a client holding no GPU share)."""
    parsed = _client_device(device)
    if parsed.type != "cuda":
        return parsed
    if not torch.cuda.is_available():
        raise ValueError(
            f"device: the clients were asked to train on {str(parsed)!r}, but this worker sees no CUDA device. Ray "
            "hides the GPUs (CUDA_VISIBLE_DEVICES='') from a client holding no GPU share: give num_gpus_per_client "
            "> 0 (e.g. 0.1: ten clients share a GPU), or train the clients on 'cpu'.")
    visible = torch.cuda.device_count()
    if (parsed.index or 0) >= visible:
        raise ValueError(f"device: the clients were asked to train on {str(parsed)!r}, but this worker sees "
                         f"{visible} CUDA device(s); use 'cuda' (a Ray worker's GPU is its cuda:0).")
    return parsed


def _model(model_factory: Callable[[], torch.nn.Module], global_arrays, entropy: list[int],
           device: str | torch.device = "cpu") -> torch.nn.Module:
    """``model_factory()`` holding ``global_arrays``, on ``device``; the factory runs with the global generators
    seeded from ``entropy`` (an unseeded factory draws the same, and leaves the caller's draws alone)."""
    device = _usable_device(device)
    model = set_model_arrays(seeded_call(model_factory, entropy, name="model_factory"), global_arrays)
    return model.to(device)


def _add_inference_gradient(content: RecordDict, data: ClientData, model_factory, global_arrays,
                            device: torch.device) -> None:
    """Put g = ∇ Σ ℓ over the inference split at ``global_arrays`` into a reply's content."""
    if len(data.x_infer) == 0:
        raise ValueError(
            f"x_infer, y_infer: the server asked client {data.partition_id} for its inference gradient (TracIn "
            "flows), but its ClientData holds no inference split; give every client one or turn flows off."
        )
    model = _model(model_factory, global_arrays, [data.partition_id], device)
    loss, gradient = summed_loss_gradient(model, data.x_infer, data.y_infer, loss=data.loss)
    content[GRADIENT_KEY] = ArrayRecord({key: Array(value) for key, value in gradient.items()})
    content[CLIENT_RECORD_KEY][INFERENCE_LOSS_KEY] = loss


def _load(load_client_data: Callable[[int], ClientData], partition_id: int, content: RecordDict | None = None) -> ClientData:
    """The client's data; a config ``"data-key"`` (one engine serving several runs, e.g. the
    seeds of a study) is passed on as ``load_client_data(partition_id, data_key=...)``."""
    configs = {} if content is None else content.config_records
    key = configs[CONFIG_KEY].get(DATA_KEY) if CONFIG_KEY in configs else None
    data = load_client_data(partition_id) if key is None else load_client_data(partition_id, data_key=key)
    if not isinstance(data, ClientData):
        raise TypeError(f"load_client_data: expected it to return a ClientData; got {type(data).__name__}.")
    if data.partition_id != partition_id:
        raise ValueError(
            f"load_client_data: asked for partition {partition_id}, got ClientData with partition_id "
            f"{data.partition_id}."
        )
    return data


def local_loss(data: ClientData, model_factory: Callable[[], torch.nn.Module],
               global_arrays: dict[str, np.ndarray], *, seed: int, server_round: int,
               device: str | torch.device = "cpu") -> float:
    """Mean training loss of ``global_arrays`` on the data the client trains on in ``server_round``
    (its behaviour's transform, drawn from the same generator as :func:`train_client`'s), computed on ``device``."""
    data_seed = np.random.SeedSequence([seed, data.partition_id, server_round]).spawn(3)[0]
    model = _model(model_factory, global_arrays, [seed, data.partition_id, server_round], device)
    x, y = data.behaviour.transform_training_data(data.x_train, data.y_train, np.random.default_rng(data_seed))
    with torch.no_grad():
        return float(evaluate_model(model, x, y, loss=data.loss)["loss"])


def train_client(
    data: ClientData,
    model_factory: Callable[[], torch.nn.Module],
    global_arrays: dict[str, np.ndarray],
    *,
    learning_rate: float,
    local_epochs: int,
    batch_size: int,
    seed: int,
    server_round: int,
    proximal_mu: float = 0.0,
    device: str | torch.device = "cpu",
) -> tuple[dict[str, np.ndarray], int, float]:
    """One client's round without Flower: behaviour, local SGD on ``device`` (``"cpu"`` or a CUDA device
    this process sees), behaviour.

    Returns
    -------
    tuple
        (arrays to send, num-examples to claim, last epoch's mean train loss).
    """
    data_seed, train_seed, reply_seed = np.random.SeedSequence([seed, data.partition_id, server_round]).spawn(3)
    model = _model(model_factory, global_arrays, [seed, data.partition_id, server_round], device)
    x, y = data.behaviour.transform_training_data(data.x_train, data.y_train, np.random.default_rng(data_seed))
    train_loss = train_locally(
        model, x, y, epochs=local_epochs, learning_rate=learning_rate,
        batch_size=batch_size or None, loss=data.loss, seed=train_seed, proximal_mu=proximal_mu,
    )
    trained = get_model_arrays(model)
    arrays, num_examples = data.behaviour.transform_reply(
        global_arrays, trained, len(x), np.random.default_rng(reply_seed)
    )
    if set(arrays) != set(trained):
        raise ValueError(
            f"behaviour {data.behaviour!r}: transform_reply must return the model's keys {list(trained)}; "
            f"got {list(arrays)}."
        )
    check_integer(f"behaviour {data.behaviour!r}: transform_reply's num_examples", num_examples)
    # Same keys, order, shapes and dtypes as the model, whatever the behaviour returned
    # (np.ascontiguousarray would turn a 0-d buffer such as BatchNorm's counter into shape (1,)).
    arrays = {key: _contiguous(np.asarray(arrays[key], dtype=trained[key].dtype)) for key in trained}
    return arrays, int(num_examples), float(train_loss)


def _contiguous(array: np.ndarray) -> np.ndarray:
    """``array`` in C order with its own shape (0-d arrays stay 0-d)."""
    return array if array.flags.c_contiguous else array.copy(order="C")


def _proximal_mu(config: ConfigRecord) -> float:
    """FedProx's μ from the train config (FedProx's configure_train sends it; 0 without)."""
    return check_non_negative(f"train config {PROXIMAL_MU_KEY!r}", config.get(PROXIMAL_MU_KEY, 0.0))


def make_client_app(
    load_client_data: Callable[[int], ClientData],
    model_factory: Callable[[], torch.nn.Module],
    *,
    mods: Sequence[Mod] = (),
    device: str | torch.device = "cpu",
) -> ClientApp:
    """A ClientApp that trains ``model_factory()`` on ``load_client_data(partition_id)``.

    Parameters
    ----------
    load_client_data
        partition id -> :class:`ClientData`. Called in the Ray worker for every message:
        picklable, cheap, and deterministic.
    model_factory
        Builds the model whose ``state_dict`` keys the server's arrays carry.
    mods
        Flower client mods wrapped around the ``train`` handler, outermost first:
        ``flwr.clientapp.mod.fixedclipping_mod`` with
        ``DifferentialPrivacyClientSideFixedClipping``, ``adaptiveclipping_mod`` with
        ``DifferentialPrivacyClientSideAdaptiveClipping``. (Flower's DP mods act on
        training replies only and refuse messages without exactly one ArrayRecord, so
        they never wrap ``evaluate`` or ``query``; with TracIn flows a training reply
        carries a second ArrayRecord, which these mods refuse.)
    device
        Torch device the clients train, evaluate and take gradients on: ``"cpu"`` or a CUDA device
        (``"cuda"``: in a Ray worker, the GPU of its share). Checked here; a worker that sees no such
        device refuses the message with a ValueError (see the module docstring).

    Returns
    -------
    flwr.clientapp.ClientApp
        With ``train``, ``evaluate`` and ``query`` handlers (see the module docstring).
    """
    if not callable(load_client_data):
        raise TypeError(f"load_client_data: expected a callable partition id -> ClientData; got {load_client_data!r}.")
    if not callable(model_factory) or isinstance(model_factory, torch.nn.Module):
        raise TypeError(
            "model_factory: expected a callable that builds a fresh torch.nn.Module (e.g. "
            f"functools.partial(make_mlp, ...)); got {type(model_factory).__name__}."
        )
    device = _client_device(device)
    mods = list(mods)
    if not all(callable(mod) for mod in mods):
        raise TypeError(f"mods: expected Flower client mods (callables (message, context, call_next) -> "
                        f"Message); got {mods!r}.")
    app = ClientApp()

    @app.train(mods=mods)
    def train(msg: Message, context: Context) -> Message:
        partition_id = partition_id_of(context)
        data = _load(load_client_data, partition_id, msg.content)
        config = _record(msg.content, CONFIG_KEY, "ConfigRecord")
        global_arrays = {key: array.numpy() for key, array in _record(msg.content, ARRAYS_KEY, "ArrayRecord").items()}
        # A behaviour that remembers (clients.attacks.memory) is told the round and its past global models.
        prepare_round(data.behaviour, context.state, config.get(DATA_KEY),
                      _config_int(config, SERVER_ROUND_KEY, 0, 0), global_arrays)
        arrays, num_examples, train_loss = train_client(
            data, model_factory, global_arrays,
            learning_rate=_learning_rate(config),
            local_epochs=_config_int(config, LOCAL_EPOCHS_KEY, None, 1),
            batch_size=_config_int(config, BATCH_SIZE_KEY, 0, 0),
            seed=_config_int(config, SEED_KEY, 0, 0),
            server_round=_config_int(config, SERVER_ROUND_KEY, 0, 0),
            proximal_mu=_proximal_mu(config),
            device=device,
        )
        content = RecordDict({
            ARRAYS_KEY: ArrayRecord({key: Array(value) for key, value in arrays.items()}),
            METRICS_KEY: MetricRecord({NUM_EXAMPLES_KEY: num_examples, TRAIN_LOSS_KEY: train_loss}),
            CLIENT_RECORD_KEY: _client_record(partition_id),
        })
        if _wants_gradient(msg.content):
            _add_inference_gradient(content, data, model_factory, global_arrays, device)
        if _wants_gradient(msg.content, CURVATURE_KEY):
            _add_curvature(content, data, model_factory, global_arrays, device)
        return Message(content=content, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        partition_id = partition_id_of(context)
        data = _load(load_client_data, partition_id, msg.content)
        global_arrays = {key: array.numpy() for key, array in _record(msg.content, ARRAYS_KEY, "ArrayRecord").items()}
        model = _model(model_factory, global_arrays, [partition_id], device)
        x, y = (data.x_infer, data.y_infer) if len(data.x_infer) else (data.x_train, data.y_train)
        scores = evaluate_model(model, x, y, loss=data.loss)
        metrics = {NUM_EXAMPLES_KEY: len(x), "eval-loss": scores["loss"]}
        if "accuracy" in scores:
            metrics["eval-accuracy"] = scores["accuracy"]
        content = RecordDict({METRICS_KEY: MetricRecord(metrics), CLIENT_RECORD_KEY: _client_record(partition_id)})
        return Message(content=content, reply_to=msg)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        partition_id = partition_id_of(context)
        content = RecordDict({CLIENT_RECORD_KEY: _client_record(partition_id)})
        if _wants_gradient(msg.content):
            global_arrays = {key: array.numpy() for key, array in _record(msg.content, ARRAYS_KEY, "ArrayRecord").items()}
            _add_inference_gradient(content, _load(load_client_data, partition_id, msg.content), model_factory,
                                    global_arrays, device)
        if _wants_gradient(msg.content, LOCAL_LOSS_KEY):
            config = _record(msg.content, CONFIG_KEY, "ConfigRecord")
            global_arrays = {key: array.numpy() for key, array in _record(msg.content, ARRAYS_KEY, "ArrayRecord").items()}
            content[CLIENT_RECORD_KEY][LOCAL_LOSS_KEY] = local_loss(
                _load(load_client_data, partition_id, msg.content), model_factory, global_arrays,
                seed=_config_int(config, SEED_KEY, 0, 0), server_round=_config_int(config, SERVER_ROUND_KEY, 0, 0),
                device=device)
        return Message(content=content, reply_to=msg)

    return app
