"""The noisy-clients simulation as a Flower App, for ``flwr run .`` (simulation or deployment).

Every ``fedvalue run noisy-clients`` option is a key of ``[tool.flwr.app.config]`` in
pyproject.toml (dashes for underscores, tuples comma-separated: ``hidden = "200,200"``),
plus ``out``, the run directory (``{run_id}`` in it becomes Flower's run id). ``flwr run .
--run-config "rounds=3 partition='dirichlet'"`` changes them for the ServerApp and the
ClientApps alike: both read ``context.run_config``. Each SuperNode's partition is
``context.node_config["partition-id"]`` (the simulation runtime sets it; a deployed
SuperNode gets ``--node-config "partition-id=0 num-partitions=3"``).

``num-clients = 0`` and ``clients-per-round = 0`` (the App's defaults) take the sizes from
the federation: one client per SuperNode, and ⌈num-clients / rounds⌉ clients a round (each
client valued once, as the main job does with 30 clients in 5 rounds), so ``flwr run .`` runs
on whatever federation it is given, Flower's 2-SuperNode default included. The server sends
the number it found to the clients, which refuse a different ``num-partitions``. The ServerApp
logs the ``fedvalue run noisy-clients`` command that books the same ledger, byte for byte:
the clients train with one torch thread, as ``fedvalue run``'s one-CPU clients do, whatever
CPUs the federation gives them.

The ServerApp refuses, before writing anything: a run already in ``out`` (never deleted),
a federation whose number of SuperNodes is not ``num-clients``, and the Ray engine options
of ``fedvalue run`` (``num-cpus-per-client``, ``max-parallel-clients``, ``ray-address``,
``valuation-workers``), which under ``flwr run`` belong to the federation's own settings.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
import types
import typing

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from clients import make_client_app, partition_id_of
from fedvalue.ledger import load_run
from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig, build, valuation_settings
from simulations.runner import (
    build_strategy,
    check_some_client_valued,
    client_mods,
    clients_device,
    flat_fields,
    flat_settings,
    initial_model_arrays,
    nest_settings,
    package_versions,
    prepare_run_dir,
    replies_in_send_order,
    seeded_server_generators,
    torch_threads,
)
from strategies import BookSettings, IntakeSettings, PartitionSampler, RunSettings, ValuingStrategy, train_config

#: The run directory's key (the only key that is not a NoisyClientsConfig field).
OUT_KEY = "out"
#: ``fedvalue run`` engine options that the federation sets under ``flwr run`` (and where).
ENGINE_OPTIONS = {
    "num_cpus_per_client": "options.backend.client-resources.num-cpus of the federation (~/.flwr/config.toml)",
    "num_gpus_per_client": "options.backend.client-resources.num-gpus of the federation (~/.flwr/config.toml)",
    "max_parallel_clients": "options.backend.init-args.num-cpus of the federation (~/.flwr/config.toml)",
    "ray_address": "the SuperLink the federation points at",
    "valuation_workers": "fedvalue run (coalitions are scored in the ServerApp process under flwr run)",
}
#: Longest wait for the federation's SuperNodes to register before the size check fails.
NODE_WAIT_S = 60.0
#: Seconds the number of SuperNodes must stay the same to count as the federation's size (the
#: simulation runtime registers all of its nodes within milliseconds, after the ServerApp starts).
NODE_STABLE_S = 2.0
#: ``num-clients`` / ``clients-per-round`` value meaning "from the federation".
FROM_FEDERATION = 0
#: Train-config key carrying the number of clients the server found, for the clients to check.
NUM_CLIENTS_KEY = "num-clients"
#: The run directory when the run config names none.
DEFAULT_OUT = "~/fedvalue-runs/flwr-{run_id}"
_log = logging.getLogger("flwr")


def run_config_key(name: str) -> str:
    return name.replace("_", "-")


def config_from_run_config(run_config: typing.Mapping) -> tuple[NoisyClientsConfig, str]:
    """The simulation's config and run directory from a Flower run config.

    Raises
    ------
    ValueError
        A key of the wrong type (naming the key, what was expected and what was got), or an
        engine option changed from its default (:data:`ENGINE_OPTIONS`).
    """
    values = {}
    for f in flat_fields(NoisyClientsConfig):
        key = run_config_key(f.name)
        if key not in run_config:
            continue
        value = run_config[key]
        kind = f.hint
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None: TOML has no null
            (kind,) = [arg for arg in typing.get_args(kind) if arg is not type(None)]
            if value == "":
                continue  # left at its default, None
        if isinstance(f.default, tuple):
            kind = type(f.default[0])
            try:
                value = tuple(kind(v) for v in str(value).split(",") if v.strip())
            except ValueError:
                raise ValueError(f"{key}: expected comma-separated {kind.__name__} values; got {value!r}.") from None
        elif kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # TOML writes 1 for 1.0
        elif not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise ValueError(f"{key}: expected a {kind.__name__}; got {value!r}.")
        values[f.name] = value
    config = NoisyClientsConfig(**nest_settings(NoisyClientsConfig, values))
    settings, defaults = config.as_dict(), NoisyClientsConfig().as_dict()
    for name, where in ENGINE_OPTIONS.items():
        if settings[name] != defaults[name]:
            raise ValueError(f"{run_config_key(name)}: a fedvalue run engine option, set by {where} under flwr "
                             f"run; expected the default {defaults[name]!r}, got {settings[name]!r}.")
    out = str(run_config.get(OUT_KEY, DEFAULT_OUT))
    # Runs land outside the project directory (which holds the code only); "~" is the user's home.
    return config, os.path.expanduser(out)


def with_sizes(config: NoisyClientsConfig, num_supernodes: int) -> NoisyClientsConfig:
    """``config`` with ``num-clients = 0`` read as the federation's ``num_supernodes`` and
    ``clients-per-round = 0`` as ⌈num_clients / rounds⌉ (every client valued once)."""
    num_clients = config.num_clients or num_supernodes
    per_round = config.clients_per_round or max(1, math.ceil(num_clients / max(1, config.rounds)))
    return dataclasses.replace(config, num_clients=num_clients, clients_per_round=per_round)


def federation_size(grid: Grid, num_clients: int, *, wait_s: float = NODE_WAIT_S,
                    stable_s: float = NODE_STABLE_S, simulation: bool = False) -> int:
    """The number of the federation's SuperNodes: once it has stayed the same for ``stable_s``
    seconds (``num_clients = 0``), or once it reaches ``num_clients``; ValueError when it does
    not within ``wait_s`` seconds, or, on the simulation runtime (whose nodes all come at
    once), as soon as it is stable at another number."""
    deadline = time.monotonic() + wait_s
    last, since = -1, time.monotonic()
    while True:
        found = len(list(grid.get_node_ids()))
        now = time.monotonic()
        if found != last:
            last, since = found, now
        stable = found > 0 and now - since >= stable_s
        if (num_clients and found >= num_clients) or (stable and (not num_clients or simulation)) \
                or now >= deadline:
            break
        time.sleep(0.2)
    if num_clients and found != num_clients:
        waited = f" after {now - (deadline - wait_s):.0f}s" if found < num_clients else ""
        raise ValueError(
            f"num-clients: the run config asks for {num_clients} clients (one SuperNode per partition); the "
            f"federation has {found} SuperNodes{waited}. Leave num-clients at 0 to take the federation's size, "
            f"pass --run-config \"num-clients={found}\", or give the federation {num_clients} SuperNodes "
            f"(simulation: flwr federation simulation-config --num-supernodes {num_clients})."
        )
    if not found:
        raise ValueError(f"num-clients: 0 takes the federation's size, but no SuperNode registered within "
                         f"{wait_s:.0f}s.")
    return found


def same_ledger_command(config: NoisyClientsConfig, out: str) -> str:
    """The ``fedvalue run noisy-clients`` command that books the same ledger as ``config``."""
    # Every setting, the adaptive ones too: a default config's run.json leaves those out.
    settings, defaults = config.as_dict(), flat_settings(NoisyClientsConfig())
    options = []
    for name, value in settings.items():
        if value is True and defaults[name] is False:  # a flag: given, it takes no value
            options.append(f"--{run_config_key(name)}")
        elif value != defaults[name]:
            shown = ",".join(str(v) for v in value) if isinstance(value, tuple) else str(value)
            options.append(f"--{run_config_key(name)} {shown}")
    return " ".join(["fedvalue run noisy-clients --out DIR", *options])


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    simulation = type(grid).__name__ == "InMemoryGrid"  # the simulation runtime's grid: every node at once
    grid = replies_in_send_order(grid)  # arrival order would change the ledger's rows and FedAvg's last bits
    try:
        config, out = config_from_run_config(context.run_config)
        out = out.replace("{run_id}", str(context.run_id))
        # Bad settings fail before any wait; a federation that must have num_clients nodes uses this build.
        built = build(with_sizes(config, config.num_clients)) if config.num_clients else None
        if os.path.isdir(out) and os.listdir(out):  # never replaced under flwr run
            raise ValueError(f"out: {out} already holds a run or other files; choose another run directory: "
                             f"--run-config \"out='DIR'\" (the default, {DEFAULT_OUT}, is new for every run).")
        config = with_sizes(config, federation_size(grid, config.num_clients, simulation=simulation))
        _, model_factory, utility, noisy = built or build(config)
        valuation = valuation_settings(config, utility)  # a budget in seconds is timed on this utility
    except ValueError as error:
        _log.error("fedvalue: %s", error)  # the run's log shows why it stopped, not just a traceback
        raise
    _log.info("fedvalue: noisy-clients on %d clients, %d a round, into %s; the same ledger as: %s",
              config.num_clients, config.clients_per_round, out, same_ledger_command(config, out))
    run_dir = prepare_run_dir(out)
    run_config = {"simulation": "noisy-clients", **config.as_dict(), "noisy_clients": sorted(noisy),
                  "num_rounds": config.rounds, "valuation": valuation.ads.as_dict(),
                  "versions": package_versions()}  # as `fedvalue run` writes it
    strategy = ValuingStrategy(
        build_strategy(config, config.clients_per_round), utility, run_dir=str(run_dir),
        sampler=PartitionSampler(config.clients_per_round, schedule=config.schedule, seed=config.seed),
        seed=config.seed, valuation=valuation,  # every estimator option, as `fedvalue run` passes them
        books=BookSettings(noisy_clients=noisy, fixed_second_order=config.fixed_second_order),
        intake=IntakeSettings(query_timeout=config.query_timeout),
        run=RunSettings(run_config=run_config),
    )
    initial = initial_model_arrays(model_factory, config.seed)
    train = train_config(learning_rate=config.learning_rate, local_epochs=config.local_epochs,
                         batch_size=config.batch_size, seed=config.seed)
    with seeded_server_generators(config.seed):
        strategy.start(grid, initial, num_rounds=config.rounds, timeout=config.round_timeout,
                       train_config=ConfigRecord({**train, NUM_CLIENTS_KEY: config.num_clients}))
    check_some_client_valued(load_run(run_dir), run_dir)  # fail loudly, as `fedvalue run` does


_CLIENT_APPS: dict[str, ClientApp] = {}


def client_app_for(context: Context, message: Message | None = None) -> ClientApp:
    """The torch ClientApp for this run's config (``context.run_config``), built once per config,
    after checking this SuperNode's partition against ``num-clients`` (0: its ``num-partitions``)
    and, when the message carries it, against the number of clients the server found."""
    config, _ = config_from_run_config(context.run_config)
    partition_id = partition_id_of(context)
    configs = {} if message is None else message.content.config_records
    server_count = configs["config"].get(NUM_CLIENTS_KEY) if "config" in configs else None
    num_partitions = context.node_config.get("num-partitions", config.num_clients or server_count)
    if not config.num_clients and not num_partitions:
        raise ValueError("num-clients: 0 takes the federation's size, but this SuperNode's --node-config has no "
                         "num-partitions; give it one, or set num-clients in the run config.")
    config = with_sizes(config, num_partitions)
    if partition_id >= config.num_clients or num_partitions != config.num_clients or \
            server_count not in (None, config.num_clients):
        asked = config.num_clients if server_count is None else server_count
        raise ValueError(
            f"num-clients: the run asks for {asked} partitions; this SuperNode holds "
            f"partition-id={partition_id} of num-partitions={num_partitions} (its --node-config)."
        )
    key = json.dumps(config.as_dict(), sort_keys=True)
    if key not in _CLIENT_APPS:
        loader, model_factory, _, _ = build(config)
        _CLIENT_APPS[key] = make_client_app(loader, model_factory, mods=client_mods(config.strategy),
                                             device=clients_device(config.device))
    return _CLIENT_APPS[key]


def one_torch_thread():
    """Torch on one thread: ``fedvalue run`` gives each client one CPU (Ray then runs torch on one
    thread), and other thread counts would book other last bits (:func:`torch_threads`)."""
    return torch_threads(1)


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    with one_torch_thread():
        return client_app_for(context, msg)(msg, context)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    with one_torch_thread():
        return client_app_for(context, msg)(msg, context)


@client_app.query()
def query(msg: Message, context: Context) -> Message:
    with one_torch_thread():
        return client_app_for(context, msg)(msg, context)
