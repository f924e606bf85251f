"""The noisy-clients simulation as a Flower App, for ``flwr run .`` (simulation or deployment).

Every ``fedvalue run noisy-clients`` option is a key of ``[tool.flwr.app.config]`` in
pyproject.toml (dashes for underscores, tuples comma-separated: ``hidden = "200,200"``),
plus ``out``, the run directory. ``flwr run . --run-config "rounds=3 partition='dirichlet'"``
changes them for the ServerApp and the ClientApps alike: both read ``context.run_config``.
Each SuperNode's partition is ``context.node_config["partition-id"]`` (the simulation
runtime sets it; a deployed SuperNode gets ``--node-config "partition-id=0
num-partitions=3"``). The same seed gives ``fedvalue run``'s ledger bytes.

The ServerApp refuses, before writing anything: a run already in ``out`` (never deleted),
a federation whose number of SuperNodes is not ``num-clients``, and the Ray engine options
of ``fedvalue run`` (``num-cpus-per-client``, ``max-parallel-clients``, ``ray-address``,
``valuation-workers``), which under ``flwr run`` belong to the federation's own settings.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import typing

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from clients.app import make_client_app, partition_id_of
from fedvalue.ledger import load_run
from simulations.api import (
    check_some_client_valued,
    initial_model_arrays,
    package_versions,
    prepare_run_dir,
    seeded_server_generators,
)
from simulations.engine import replies_in_send_order
from simulations.noisy_clients import NoisyClientsConfig, build, valuation_options
from simulations.strategy_choices import build_strategy, client_mods
from strategies import PartitionSampler, ValuingStrategy
from strategies.protocol import train_config

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
    hints = typing.get_type_hints(NoisyClientsConfig)
    values = {}
    for f in dataclasses.fields(NoisyClientsConfig):
        key = run_config_key(f.name)
        if key not in run_config:
            continue
        value = run_config[key]
        if isinstance(f.default, tuple):
            kind = type(f.default[0])
            try:
                value = tuple(kind(v) for v in str(value).split(",") if v.strip())
            except ValueError:
                raise ValueError(f"{key}: expected comma-separated {kind.__name__} values; got {value!r}.") from None
        elif hints[f.name] is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # TOML writes 1 for 1.0
        elif not isinstance(value, hints[f.name]) or isinstance(value, bool):
            raise ValueError(f"{key}: expected a {hints[f.name].__name__}; got {value!r}.")
        values[f.name] = value
    config = NoisyClientsConfig(**values)
    for name, where in ENGINE_OPTIONS.items():
        if getattr(config, name) != getattr(NoisyClientsConfig, name):
            raise ValueError(f"{run_config_key(name)}: a fedvalue run engine option, set by {where} under flwr "
                             f"run; expected the default {getattr(NoisyClientsConfig, name)!r}, got "
                             f"{getattr(config, name)!r}.")
    out = str(run_config.get(OUT_KEY, "~/fedvalue-runs/flwr-run"))
    # Runs land outside the project directory (which holds the code only); "~" is the user's home.
    return config, os.path.expanduser(out)


def check_federation_size(grid: Grid, num_clients: int, *, wait_s: float = NODE_WAIT_S) -> None:
    """Wait for the federation's SuperNodes; ValueError unless there are ``num_clients`` of them."""
    deadline = time.monotonic() + wait_s
    while True:
        found = len(list(grid.get_node_ids()))
        if found == num_clients or found > num_clients or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if found != num_clients:
        raise ValueError(
            f"num-clients: the run config asks for {num_clients} clients (one SuperNode per partition); the "
            f"federation has {found} SuperNodes{f' after {wait_s:.0f}s' if found < num_clients else ''}. Give the "
            f"federation {num_clients} SuperNodes (simulation: options.num-supernodes = {num_clients} in "
            f"~/.flwr/config.toml) or pass --run-config \"num-clients={found}\"."
        )


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    grid = replies_in_send_order(grid)  # arrival order would change the ledger's rows and FedAvg's last bits
    try:
        config, out = config_from_run_config(context.run_config)
        _, model_factory, utility, noisy = build(config)
        if os.path.isdir(out) and os.listdir(out):
            prepare_run_dir(out)  # refuses (never deletes) a run or other files already at `out`
        check_federation_size(grid, config.num_clients)
    except ValueError as error:
        _log.error("fedvalue: %s", error)  # the run's log shows why it stopped, not just a traceback
        raise
    run_dir = prepare_run_dir(out)
    run_config = {"simulation": "noisy-clients", **config.as_dict(), "noisy_clients": sorted(noisy),
                  "num_rounds": config.rounds, "versions": package_versions()}  # as `fedvalue run` writes it
    strategy = ValuingStrategy(
        build_strategy(config, config.clients_per_round), utility, run_dir=str(run_dir), methods=config.methods,
        sampler=PartitionSampler(config.clients_per_round, schedule=config.schedule, seed=config.seed),
        seed=config.seed, noisy_clients=noisy, run_config=run_config, query_timeout=config.query_timeout,
        **valuation_options(config),  # every estimator option, as `fedvalue run` passes them
    )
    initial = initial_model_arrays(model_factory, config.seed)
    with seeded_server_generators(config.seed):
        strategy.start(grid, initial, num_rounds=config.rounds, timeout=config.round_timeout,
                       train_config=ConfigRecord(train_config(
                           learning_rate=config.learning_rate, local_epochs=config.local_epochs,
                           batch_size=config.batch_size, seed=config.seed)))
    check_some_client_valued(load_run(run_dir), run_dir)  # fail loudly, as `fedvalue run` does


_CLIENT_APPS: dict[str, ClientApp] = {}


def client_app_for(context: Context) -> ClientApp:
    """The torch ClientApp for this run's config (``context.run_config``), built once per config,
    after checking this SuperNode's partition against ``num-clients``."""
    config, _ = config_from_run_config(context.run_config)
    partition_id = partition_id_of(context)
    num_partitions = context.node_config.get("num-partitions", config.num_clients)
    if partition_id >= config.num_clients or num_partitions != config.num_clients:
        raise ValueError(
            f"num-clients: the run config asks for {config.num_clients} partitions; this SuperNode holds "
            f"partition-id={partition_id} of num-partitions={num_partitions} (its --node-config)."
        )
    key = json.dumps(config.as_dict(), sort_keys=True)
    if key not in _CLIENT_APPS:
        loader, model_factory, _, _ = build(config)
        _CLIENT_APPS[key] = make_client_app(loader, model_factory, mods=client_mods(config.strategy))
    return _CLIENT_APPS[key]


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    return client_app_for(context)(msg, context)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return client_app_for(context)(msg, context)


@client_app.query()
def query(msg: Message, context: Context) -> Message:
    return client_app_for(context)(msg, context)
