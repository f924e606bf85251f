"""The one place that starts Ray and Flower's simulation engine.

Facts about Flower 1.41 / Ray 2.55 this module relies on (read in flwr's source and
measured on the 2-core CPU machine):

- ``flwr.simulation.run_simulation(server_app, client_app, num_supernodes,
  backend_config)`` runs the ServerApp in a thread of the caller and the simulation
  engine (Ray backend) in the calling thread; it returns when the ServerApp's main
  returns. Results leave the ServerApp through closures. An exception raised in the
  ServerApp is re-raised by ``run_simulation`` (after Ray is shut down).
- ``backend_config["init_args"]`` is passed to ``ray.init`` (Flower adds
  ``include_dashboard=False``; it sets ``logging_level="WARNING"`` and
  ``log_to_driver=True`` unless given) -- but only if Ray is not initialized yet in
  this process; either way Flower calls ``ray.shutdown()`` when the run ends.
  ``init_args["address"]`` attaches to an existing cluster (then ``num_cpus`` must not
  be given). ``backend_config["client_resources"]`` (``num_cpus``, ``num_gpus``) are
  each actor's resources: the actor pool has ``floor(CPUs of each Ray node /
  num_cpus)`` actors summed over nodes, so locally ``ray.init(num_cpus=k *
  num_cpus_per_client)`` caps the clients training at once at k. Flower's default is
  2 CPUs per client (one actor on 2 cores).
- Each actor runs torch with one thread per CPU it holds (Ray sets
  ``OMP_NUM_THREADS``), the driver with all cores: bitwise results of the same seed
  match within one setting, not across in-process and Ray runs.
- The ClientApp is cloudpickled and sent to an actor with EVERY message (Flower
  submits ``actor.run(app_fn, message, ...)``), so closures, lambdas and
  ``functools.partial`` of module-level functions all work (modules are found through
  ``PYTHONPATH``, which Flower sets to the driver's ``sys.path``), but whatever the
  handlers close over is serialized per message: keep large data out of closures.
- ``context.node_config["partition-id"]`` is 0..num_supernodes-1 (with
  ``"num-partitions"``); node ids are random per run. The ServerApp never sees
  partition ids unless clients reply them (clients/app.py puts them in a ConfigRecord).
- Race: the engine registers its nodes after the ServerApp thread has started, so a
  strategy's first ``grid.get_node_ids()`` can see only some of them (FedAvg then
  computes ``fraction_train`` of too few nodes and round 1 trains fewer clients;
  seen in several test runs here). The grid handed to the ServerApp here returns node
  ids only once all ``num_supernodes`` are registered.
- Replies arrive in the order actors finish: with two or more actors that order, and
  so the last bits of FedAvg's weighted mean, changed between runs of the same seed
  (observed). The grid handed to the ServerApp here returns replies in the order the
  messages were sent.
- Messages wait in one queue for the actors (FIFO, in node registration order), and a
  running actor task cannot be preempted: with one actor (the default on 2 cores) a client
  slower than the round's timeout used to make every client queued behind it miss the
  round, and the next round too. Here each client gets the timeout of its own, counted
  from when its actor starts it (:class:`TimedClientApp`, a real-time signal in the actor's
  main thread: a client stuck inside one long C call is stopped only when it returns), and
  a batch waits as long as replies keep coming.
- A ClientApp that raises gives the ServerApp an error reply at once
  (``RayTaskError(ClientAppException)`` with the message in ``error.reason``); other
  clients are unaffected. A worker process that dies (OOM, segfault, ``os._exit``, a Ray
  node lost) turns into ``ActorDiedError`` replies, also at once, but Flower keeps the dead
  actor in its pool: later messages routed to it fail too, round after round. The grid here
  tells ``on_worker_lost`` (the valuing strategy stops after the round commits, resumable on
  a fresh Ray) as soon as a reply names a dead worker.
- If the engine itself crashes (e.g. no actor fits the resources) ``run_simulation``
  raises, but Flower neither stops nor joins the ServerApp thread: it keeps waiting in
  ``grid.send_and_receive`` for the strategy's ``timeout`` (``Strategy.start`` default
  3600 s) and the interpreter cannot exit before it. This module hands the ServerApp
  a grid that gives up as soon as the engine has stopped. FedAvg's node sampler still
  waits forever (sleeping 1 s per check) when ``min_available_nodes`` exceeds
  ``num_supernodes``.
- Quiet: Flower's console handler level (``FLWR_LOG_LEVEL`` is read once, when flwr is
  imported; this module sets the handler level for the run unless that variable is
  set); ``run_simulation`` logs a deprecation notice at WARNING on every call (filtered
  here); Ray warns once per ``ray.init`` that it overrides accelerator env vars
  (filtered here; the override itself, which hides GPUs from CPU-only clients, is
  kept). ``FLWR_TELEMETRY_ENABLED`` is read once at flwr import; it only spawns a
  daemon thread per event.
- Timings on 2 cores, digits, 4 supernodes, 2 rounds of FedAvg: ``ray.init`` 2.7 s;
  the first round about 6 s more (actor processes start and import torch and flwr),
  later rounds 0.2 s; shutdown 1-2 s; about 13 s in all. One or two actors make no
  difference at this size; each actor holds about 0.55 GB (RSS, torch loaded).
- ``RAY_ADDRESS`` exported (usual on clusters) makes ``ray.init()`` join that cluster, and then
  refuse ``num_cpus`` ("num_cpus and num_gpus must not be provided"): a local run passes
  ``address="local"`` (Ray's own word for "start a new local instance, whatever RAY_ADDRESS
  says") and says once that it does; ``ray_address`` joins a cluster.
- ``ray_address`` pointing at no cluster is not an error soon: ``ray.init`` retries
  its connection for minutes (over 5 min observed). :func:`check_ray_address` tries a
  plain TCP connection first, bounded by ``RAY_CONNECT_TIMEOUT_S``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedvalue._checks import check_integer, check_non_negative, check_positive
from fedvalue.scoring.kernels import usable_cores
from simulations.runner.engine_failures import FLOWER_CRASH_LOGS
from strategies.random_state import RandomState
from strategies.valuing_settings import settings_or_default

T = TypeVar("T")
#: Seconds between polls for replies. Flower's in-memory grid polls every 0.1 s: a round's
#: replies then wait 50 ms on average after the last client finished (~5% of a
#: noisy-clients round on 2 cores). Polling is not free: per study seed 0.01 s cost the
#: server process 2.6 s more CPU than 0.1 s (which the clients lack on a loaded 2-core
#: machine) for 0.8 s less wall time; 0.02 s is in between.
PULL_INTERVAL_S = 0.02
#: After the engine stops, seconds to wait for the ServerApp thread to notice.
SERVER_EXIT_WAIT_S = 10.0
#: Longest wait for the engine to register all nodes (it takes milliseconds).
NODE_REGISTRATION_WAIT_S = 30.0


#: Longest wait for a TCP connection to ``ray_address`` before a run refuses it.
RAY_CONNECT_TIMEOUT_S = 5.0


def check_ray_address(address: str, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """ValueError unless something accepts a TCP connection at ``address`` (``host:port`` or
    ``ray://host:port``) within ``timeout`` seconds; ``"auto"`` (a local cluster, found by
    Ray itself) is left to Ray. Ray would otherwise retry for minutes."""
    if not isinstance(address, str) or not address:
        raise ValueError(f"ray_address: expected a non-empty address string; got {address!r}.")
    if address == "auto":
        return
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"ray_address: expected 'auto', 'host:port' or 'ray://host:port'; got {address!r}.")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as error:
        raise ValueError(f"ray_address: expected a Ray cluster accepting connections at {host}:{port}; nothing "
                         f"answered within {timeout:g} s ({error.strerror or error}). Start the cluster first or "
                         "leave --ray-address out.") from None


#: Exit status of a run stopped by SIGINT or SIGTERM (128 + SIGINT, as shells report it).
INTERRUPTED_EXIT_CODE = 130


@contextmanager
def stop_on_signals(stop: threading.Event, *, announce: bool = True) -> Iterator[None]:
    """For the block, SIGINT (Ctrl-C) and SIGTERM set ``stop`` instead of killing the run: the
    valuing strategy then stops after the round in flight commits. A second SIGINT stops at
    once (KeyboardInterrupt). Only in the main thread (elsewhere signals cannot be handled);
    the previous handlers come back after the block.

    Once Ray's core worker runs in this process its C++ failure handler also catches
    SIGTERM and aborts the process after this handler (observed with Ray 2.55): SIGTERM then
    stops the run at once, and the run resumes from its last committed round."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, frame) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()
        if announce:
            print(f"fedvalue: {signal.Signals(signum).name}: stopping after the round in flight commits "
                  "(Ctrl-C again to stop at once); the run stays resumable", file=sys.stderr, flush=True)

    previous = {number: signal.signal(number, handle) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch on ``count`` intra-op threads for the block; the caller's count restored after.

    Matrix products split over different thread counts round differently: the same seed
    gives the same bits only on the same count (Ray gives a one-CPU client one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class EngineStoppedError(RuntimeError):
    """The simulation engine stopped while the ServerApp was waiting for replies."""


#: Seconds a batch of messages waits past its timeout for a client stopped at its own limit:
#: its clock starts only once a worker picks its message up (queue hand-off, dispatch).
CLIENT_LIMIT_GRACE_S = 2.0


class ClientTimeLimit(TimeoutError):
    """A client ran past the time limit of the message it was handling."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`ClientTimeLimit` in the block once it has run ``seconds`` (a real-time
    timer; in a process's main thread only, where a Ray actor runs its tasks; elsewhere,
    and for ``None``, no limit)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame) -> None:
        raise ClientTimeLimit(f"the client ran past its time limit of {seconds:g} s (the round's timeout, counted "
                              "from when it started) and was stopped")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class TimedClientApp(ClientApp):
    """``client_app`` with a time limit per message, counted from when its worker starts it.

    With fewer workers than clients, messages queue; a client slower than the round's
    timeout would otherwise hold its worker while the clients queued behind it run out of
    time. Stopped at its own limit, it fails alone (an error reply naming the limit) and
    frees the worker. The grid sets :attr:`seconds` to each batch's timeout before it sends
    the batch; the app travels to the workers pickled with every message, this value with it.
    """

    def __init__(self, client_app: ClientApp) -> None:
        super().__init__()
        self.client_app = client_app
        #: The time limit of the messages sent next (None: none).
        self.seconds: float | None = None

    def __call__(self, message: Message, context: Context) -> Message:
        with time_limit(self.seconds):
            return self.client_app(message, context)


def default_max_parallel_clients(num_supernodes: int, num_cpus_per_client: float = 1, *,
                                 server_core: bool = True) -> int:
    """Clients training at once by default: the usable cores minus one for the ServerApp
    (which values each round; ``server_core=False``: no core kept for it), at least 1, at
    most ``num_supernodes``."""
    cores = usable_cores()
    usable = cores - 1 if server_core and cores > 1 else cores
    fitting = int(usable // num_cpus_per_client)
    return max(1, min(num_supernodes, fitting))


class _StoppableGrid(Grid):
    """Delegates to the engine's grid, but stops waiting once ``stopped`` is set, and
    shows no node before all ``expected_nodes`` are registered.

    Attributes
    ----------
    messages_sent, wait_seconds
        Per message type (``"train"``, ``"query"``, ...): messages sent through
        :meth:`send_and_receive` and seconds spent there waiting for their replies (the
        clients' work plus the engine's messaging), for timing reports.
    """

    def __init__(self, grid: Grid, stopped: threading.Event, expected_nodes: int = 0,
                 client_app: TimedClientApp | None = None,
                 on_worker_lost: Callable[[str], None] | None = None) -> None:
        self._grid = grid
        self._on_worker_lost = on_worker_lost
        self._stopped = stopped
        self._expected_nodes = expected_nodes
        self._client_app = client_app
        self._all_registered = expected_nodes == 0
        self.messages_sent: dict[str, int] = {}
        self.wait_seconds: dict[str, float] = {}

    def _check(self) -> None:
        if self._stopped.is_set():
            raise EngineStoppedError(
                "the simulation engine stopped before the ServerApp finished; no replies will come "
                "(see the engine's error)."
            )

    def set_run(self, run) -> None:
        self._grid.set_run(run)

    @property
    def run(self):
        return self._grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        self._check()
        if self._all_registered:
            return self._grid.get_node_ids()
        # The engine registers its nodes while the ServerApp thread already runs: a
        # strategy sampling at once would see only some (FedAvg then samples too few).
        deadline = time.monotonic() + NODE_REGISTRATION_WAIT_S
        while True:
            node_ids = list(self._grid.get_node_ids())
            if len(node_ids) >= self._expected_nodes or time.monotonic() >= deadline:
                self._all_registered = True
                return node_ids
            if self._stopped.wait(0.01):
                self._check()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        self._check()
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Flower's loop plus the stop check (it would otherwise sleep to ``timeout``);
        replies come back in the order of ``messages``, not of arrival, so that a
        strategy's float sums (FedAvg's weighted mean) do not depend on which actor
        finished first.

        With a :class:`TimedClientApp` each client has ``timeout`` seconds of its own, counted
        from when a worker starts it: the batch waits as long as replies keep coming and gives
        up on the rest once ``timeout`` (plus :data:`CLIENT_LIMIT_GRACE_S`) passes without one,
        so a slow client costs only its own reply, not those queued behind it."""
        messages = list(messages)
        if not messages:
            return []
        started = time.perf_counter()
        kind = str(getattr(getattr(messages[0], "metadata", None), "message_type", "")).split(".", 1)[0]
        timed = self._client_app is not None and timeout is not None
        if self._client_app is not None:
            self._client_app.seconds = timeout
        message_ids = list(self.push_messages(messages))
        position = {message_id: index for index, message_id in enumerate(message_ids)}
        pending = set(message_ids)
        patience = None if timeout is None else timeout + (CLIENT_LIMIT_GRACE_S if timed else 0.0)
        deadline = None if timeout is None else time.monotonic() + patience
        replies: list[Message] = []
        while pending:
            received = list(self.pull_messages(pending))
            replies.extend(received)
            pending.difference_update(m.metadata.reply_to_message_id for m in received)
            if received and timed:  # the queue moves: the clients behind have their own time
                deadline = time.monotonic() + patience
            if not pending or (deadline is not None and time.monotonic() >= deadline):
                break
            if self._stopped.wait(PULL_INTERVAL_S):
                self._check()
        lost = next((worker_lost(m.error.reason) for m in replies if m.has_error() and worker_lost(m.error.reason)),
                    None)
        if lost is not None and self._on_worker_lost is not None:
            self._on_worker_lost(f"because a Ray worker died ({lost}: Flower keeps routing clients to it)")
        self.messages_sent[kind] = self.messages_sent.get(kind, 0) + len(messages)
        self.wait_seconds[kind] = self.wait_seconds.get(kind, 0.0) + time.perf_counter() - started
        return sorted(replies, key=lambda m: position.get(m.metadata.reply_to_message_id, len(position)))


#: Ray's exceptions for a worker process or node that is gone (the error reply's reason starts
#: with the exception's type, as Flower writes it: ``<class 'ray.exceptions.X'>:<'...'>``).
_WORKER_LOST = re.compile(r"<class 'ray\.exceptions\.(ActorDiedError|RayActorError|ActorUnavailableError|"
                          r"WorkerCrashedError|NodeDiedError|OwnerDiedError)'>")


def worker_lost(reason: object) -> str | None:
    """The Ray exception's name when an error reply's ``reason`` says its worker died, else None."""
    match = _WORKER_LOST.match(str(reason))
    return None if match is None else match.group(1)


def replies_in_send_order(grid: Grid) -> Grid:
    """``grid`` answering ``send_and_receive`` with the replies in the order the messages were
    sent, not of arrival, so that the same seed gives the same ledger rows and the same float
    sums (FedAvg's weighted mean) whichever client finishes first. For ServerApps that Flower
    starts itself (``flwr run``); :func:`run_flower_simulation` does it for its own."""
    return _StoppableGrid(grid, threading.Event())


def _stoppable(
    server_app: ServerApp,
    num_supernodes: int,
    stopped: threading.Event,
    started: threading.Event,
    finished: threading.Event,
    client_app: TimedClientApp | None = None,
    on_worker_lost: Callable[[str], None] | None = None,
) -> ServerApp:
    wrapper = ServerApp()

    @wrapper.main()
    def main(grid: Grid, context: Context) -> None:
        started.set()
        try:
            server_app(grid=_StoppableGrid(grid, stopped, num_supernodes, client_app, on_worker_lost), context=context)
        finally:
            finished.set()

    return wrapper


class _DropRunSimulationDeprecation(logging.Filter):
    """Drops run_simulation's deprecation notice, and Flower's tracebacks of an engine crash:
    the caller says it in one line (:mod:`simulations.runner.engine_failures`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg) + " ".join(str(arg) for arg in (record.args or ()))
        if str(record.msg).startswith(FLOWER_CRASH_LOGS):
            return False
        return not ("DEPRECATED FEATURE" in text and "run_simulation" in text)


@contextmanager
def _quiet_flower(quiet: bool) -> Iterator[None]:
    if not quiet:
        yield
        return
    logger = logging.getLogger("flwr")
    drop = _DropRunSimulationDeprecation()
    logger.addFilter(drop)
    # An explicit FLWR_LOG_LEVEL is the user's choice; otherwise INFO per round is noise.
    handlers = [] if os.getenv("FLWR_LOG_LEVEL") else list(logger.handlers)
    levels = [handler.level for handler in handlers]
    for handler in handlers:
        handler.setLevel(max(handler.level, logging.WARNING))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*override accelerator visible devices", category=FutureWarning)
            yield
    finally:
        logger.removeFilter(drop)
        for handler, level in zip(handlers, levels):
            handler.setLevel(level)


@dataclass(frozen=True)
class EngineSettings:
    """How the simulation engine runs the clients, checked once when made.

    Parameters
    ----------
    num_cpus_per_client
        Ray CPUs each client actor holds (> 0).
    num_gpus_per_client
        Ray GPUs each client actor holds (≥ 0; fractions share a GPU). Ray hides the GPUs
        from actors holding none.
    max_parallel_clients
        Clients training at once (local Ray only). None: the usable cores minus one, at
        least 1 (:func:`default_max_parallel_clients`).
    ray_address
        Attach to an existing Ray cluster (e.g. ``"auto"`` or ``"ray://host:10001"``); its
        CPUs / ``num_cpus_per_client`` then set the parallelism. None: a local Ray.
    """

    num_cpus_per_client: float = 1.0
    num_gpus_per_client: float = 0.0
    max_parallel_clients: int | None = None
    ray_address: str | None = None

    def __post_init__(self) -> None:
        check_positive("num_cpus_per_client", self.num_cpus_per_client)
        check_non_negative("num_gpus_per_client", self.num_gpus_per_client)
        check_integer("max_parallel_clients", self.max_parallel_clients, none_ok=True)
        if self.ray_address is not None and (not isinstance(self.ray_address, str) or not self.ray_address):
            raise ValueError(f"ray_address: expected a non-empty address string or None; got {self.ray_address!r}.")
        if self.ray_address is not None and self.max_parallel_clients is not None:
            raise ValueError(
                "max_parallel_clients: cannot be set with ray_address (an existing cluster's CPUs fix the "
                "number of actors); set num_cpus_per_client instead."
            )


class FlatField(NamedTuple):
    """One setting as the command line and run.json name it: a config's own field, or one field of
    its :class:`EngineSettings` (``default``: the config's default for it; ``hint``: its type)."""

    name: str
    default: object
    hint: object


def engine_field(config_cls: type) -> dataclasses.Field | None:
    """The field of a config dataclass holding its :class:`EngineSettings` (None: it has none)."""
    return next((f for f in dataclasses.fields(config_cls) if isinstance(f.default, EngineSettings)), None)


def flat_fields(config_cls: type) -> tuple[FlatField, ...]:
    """A config's settings flat, as its command-line options and its run.json have them: its
    :class:`EngineSettings` field replaced, where it stands, by the engine settings the config names
    in ``ENGINE_KEYS`` (all of them when it names none). A config's own field listed in
    ``ENGINE_KEYS`` is placed there (noisy-clients' ``device`` sits among the engine settings in
    its run.json, whose bytes start a run's hash chain and so cannot move)."""
    hints = {**typing.get_type_hints(EngineSettings), **typing.get_type_hints(config_cls)}
    nested = engine_field(config_cls)
    own = {f.name: FlatField(f.name, f.default, hints[f.name]) for f in dataclasses.fields(config_cls)}
    if nested is None:
        return tuple(own.values())
    keys = engine_keys(config_cls)
    engine = {f.name: FlatField(f.name, getattr(nested.default, f.name), hints[f.name])
              for f in dataclasses.fields(EngineSettings)}
    flat: list[FlatField] = []
    for name, field in own.items():
        if name == nested.name:
            flat.extend(engine.get(key) or own[key] for key in keys)
        elif name not in keys:
            flat.append(field)
    return tuple(flat)


def engine_keys(config_cls: type) -> tuple[str, ...]:
    """The flat names a config writes its engine settings under (its ``ENGINE_KEYS``)."""
    return getattr(config_cls, "ENGINE_KEYS", tuple(f.name for f in dataclasses.fields(EngineSettings)))


def flat_settings(config) -> dict:
    """A config as run.json writes it (:func:`flat_fields`' names and order): ``dataclasses.asdict``
    with the engine settings flat where the engine field stands."""
    settings = dataclasses.asdict(config)
    nested = engine_field(type(config))
    if nested is None:
        return settings
    engine = settings.pop(nested.name)
    return {f.name: engine[f.name] if f.name in engine else settings[f.name] for f in flat_fields(type(config))}


def nest_settings(config_cls: type, flat: Mapping[str, object]) -> dict[str, object]:
    """The keywords of ``config_cls`` from flat settings (names of :func:`flat_fields`): the engine
    settings gathered into its :class:`EngineSettings` (the config's default for one absent), checked
    as that makes them."""
    nested = engine_field(config_cls)
    if nested is None:
        return dict(flat)
    names = {f.name for f in dataclasses.fields(EngineSettings)}
    keywords = {name: value for name, value in flat.items() if name not in names}
    keywords[nested.name] = dataclasses.replace(nested.default, **{n: v for n, v in flat.items() if n in names})
    return keywords


def check_engine_keys(config) -> None:
    """A config's engine settings that its run.json does not record (not in its ``ENGINE_KEYS``)
    must keep the config's default: a resumed or audited run could not know them."""
    nested = engine_field(type(config))
    if nested is None:
        return
    keys = engine_keys(type(config))
    for f in dataclasses.fields(EngineSettings):
        value, default = getattr(getattr(config, nested.name), f.name), getattr(nested.default, f.name)
        if f.name not in keys and value != default:
            raise ValueError(f"{f.name}: this simulation does not take it (its run.json does not record it); "
                             f"expected {default!r}, got {value!r}.")


def ray_init_args(engine: EngineSettings, num_supernodes: int, *, quiet: bool = True) -> dict[str, object]:
    """What ``ray.init`` is given for a run: ``engine.ray_address`` joins that cluster (checked to
    answer first); otherwise a local Ray of ``max_parallel_clients`` clients' CPUs, started as
    ``address="local"`` so that an exported ``RAY_ADDRESS`` (usual on clusters) is not joined
    instead (it is said once, with the option that would join it)."""
    init_args: dict[str, object] = {"include_dashboard": False, "log_to_driver": not quiet}
    if engine.ray_address is not None:
        check_ray_address(engine.ray_address)  # fail in seconds, not after Ray's minutes of retries
        init_args["address"] = engine.ray_address
        return init_args
    init_args["address"] = "local"
    if os.environ.get("RAY_ADDRESS"):
        logging.getLogger("flwr").warning(
            "fedvalue: RAY_ADDRESS=%s is set; this run starts a local Ray of its own (to run on that cluster, "
            "pass --ray-address %s)", os.environ["RAY_ADDRESS"], os.environ["RAY_ADDRESS"])
    parallel = engine.max_parallel_clients or default_max_parallel_clients(num_supernodes, engine.num_cpus_per_client)
    # Ray's CPUs are logical: this caps the actor pool, whatever the machine has.
    init_args["num_cpus"] = max(1, math.ceil(parallel * engine.num_cpus_per_client - 1e-9))
    return init_args


def run_flower_simulation(
    server_app: ServerApp,
    client_app: ClientApp,
    *,
    num_supernodes: int,
    engine: EngineSettings | None = None,
    quiet: bool = True,
    on_worker_lost: Callable[[str], None] | None = None,
) -> None:
    """Run ``server_app`` against ``num_supernodes`` simulated nodes running ``client_app``.

    Parameters
    ----------
    server_app
        The ServerApp; it runs in a thread of this process, so what its main stores in
        closures is available when this returns.
    client_app
        The ClientApp; pickled to the Ray workers with every message.
    num_supernodes
        Simulated nodes; node k gets ``node_config["partition-id"] = k``.
    engine
        CPUs and GPUs per client, parallelism, an existing Ray cluster
        (:class:`EngineSettings`; None: its defaults).
    quiet
        Only warnings and errors from Flower, no deprecation notice, no worker output.
    on_worker_lost
        Told (with a reason) when a reply says its Ray worker died: Flower keeps the dead
        worker and routes later clients to it, so a run should stop after the round in flight.

    Raises
    ------
    ValueError, TypeError
        Bad arguments (checked before anything starts).
    RuntimeError
        The engine crashed (Flower's error, chained).
    Exception
        Whatever the ServerApp raised.
    """
    if not isinstance(server_app, ServerApp):
        raise TypeError(f"server_app: expected a flwr.serverapp.ServerApp; got {type(server_app).__name__}.")
    if not isinstance(client_app, ClientApp):
        raise TypeError(f"client_app: expected a flwr.clientapp.ClientApp; got {type(client_app).__name__}.")
    check_integer("num_supernodes", num_supernodes)
    engine = settings_or_default("engine", engine, EngineSettings)
    num_cpus_per_client = engine.num_cpus_per_client
    init_args = ray_init_args(engine, num_supernodes, quiet=quiet)
    backend_config = {
        "client_resources": {"num_cpus": float(num_cpus_per_client), "num_gpus": float(engine.num_gpus_per_client)},
        "init_args": init_args,
    }

    from flwr.simulation import run_simulation  # imports ray: only when a run starts

    stopped, started, finished = threading.Event(), threading.Event(), threading.Event()
    timed = TimedClientApp(client_app)  # each client's time limit counts from its own start
    with _quiet_flower(quiet):
        try:
            run_simulation(
                server_app=_stoppable(server_app, num_supernodes, stopped, started, finished, timed, on_worker_lost),
                client_app=timed,
                num_supernodes=num_supernodes,
                backend_config=backend_config,
            )
        finally:
            # Flower leaves the ServerApp thread waiting after an engine crash: release it.
            stopped.set()
            if started.is_set():
                finished.wait(SERVER_EXIT_WAIT_S)


def serve(client_app: ClientApp, main: Callable[[Grid], T], *, num_supernodes: int,
          engine: EngineSettings | None = None, on_worker_lost: Callable[[str], None] | None = None) -> T | None:
    """Run ``main(grid)`` as the ServerApp of one engine against ``client_app`` and return what
    it returned (None when the engine stopped it first: the caller checks what it got done);
    whatever ``main`` raised is raised here once the engine has stopped.

    Every simulation goes through this one entry (one run, or many runs on one engine like a
    study's seeds); ``engine`` and ``on_worker_lost`` as :func:`run_flower_simulation` takes them.
    """
    server_app = ServerApp()
    outcome: dict[str, object] = {}

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        try:
            outcome["result"] = main(grid)
        except BaseException as error:  # surfaced to the caller after the engine stops
            outcome["error"] = error
            raise

    # Ray's init and shutdown draw from Python's global ``random`` in this thread (its spill
    # directory choice): put the caller's generators back, as they were before the run.
    with RandomState.capture().replayed():
        run_flower_simulation(server_app, client_app, num_supernodes=num_supernodes, engine=engine,
                              on_worker_lost=on_worker_lost)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")
