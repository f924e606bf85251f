"""The one place that starts Ray and Flower's simulation engine: :func:`run_flower_simulation` runs a
ServerApp against simulated nodes (the ServerApp in a thread of this process, handed the grid of
:mod:`simulations.runner.grid`), :func:`serve` runs every simulation's main through it, with what
``ray.init`` is given (:func:`ray_init_args`: a local Ray of the settings' clients, or an existing
cluster), Flower kept quiet, and SIGINT/SIGTERM turned into a stop after the round in flight.
How it runs is :mod:`simulations.runner.engine_settings`. The facts about Flower 1.42 and Ray 2.55
this relies on, and what the engine costs: docs/benchmarks.md, "The simulation engine: what the
runner relies on".
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch
from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedvalue._checks import check_integer
from simulations.runner.engine_failures import FLOWER_CRASH_LOGS
from simulations.runner.engine_settings import EngineSettings, check_ray_address, default_max_parallel_clients
from simulations.runner.grid import StoppableGrid, TimedClientApp
from strategies.aggregation.random_state import RandomState
from strategies.valuing_settings import settings_or_default

T = TypeVar("T")
#: After the engine stops, seconds to wait for the ServerApp thread to notice.
SERVER_EXIT_WAIT_S = 10.0

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
            server_app(grid=StoppableGrid(grid, stopped, num_supernodes, client_app, on_worker_lost), context=context)
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
