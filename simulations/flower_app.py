"""The noisy-clients simulation as a Flower App, for ``flwr run .``.

``[tool.flwr.app.config]`` in pyproject.toml maps onto :class:`NoisyClientsConfig`
(keys with dashes, e.g. ``num-clients``); the ledger goes to ``out``.
"""

from __future__ import annotations

import dataclasses
import os

from flwr.app import ConfigRecord, Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from clients.app import make_client_app
from fedvalue.ledger import load_run
from simulations.api import check_some_client_valued, prepare_run_dir, seeded_server_generators
from simulations.noisy_clients import NoisyClientsConfig, build, valuation_options
from simulations.strategy_choices import build_strategy, client_mods
from strategies import PartitionSampler, ValuingStrategy
from strategies.protocol import train_config
from strategies.records import initial_arrays


def config_from_run_config(run_config: dict) -> tuple[NoisyClientsConfig, str]:
    values = {}
    for f in dataclasses.fields(NoisyClientsConfig):
        key = f.name.replace("_", "-")
        if key in run_config:
            value = run_config[key]
            if isinstance(f.default, tuple):
                kind = type(f.default[0])
                value = tuple(kind(v) for v in str(value).split(","))
            values[f.name] = value
    # Runs land outside the project directory (which holds the code only); "~" is the user's home.
    return NoisyClientsConfig(**values), os.path.expanduser(str(run_config.get("out", "~/fedvalue-runs/flwr-run")))


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    config, out = config_from_run_config(dict(context.run_config))
    _, model_factory, utility, noisy = build(config)
    run_dir = prepare_run_dir(out, overwrite=True)
    strategy = ValuingStrategy(
        build_strategy(config, config.clients_per_round), utility, run_dir=str(run_dir), methods=config.methods,
        sampler=PartitionSampler(config.clients_per_round, schedule=config.schedule, seed=config.seed),
        seed=config.seed, noisy_clients=noisy, run_config={"simulation": "noisy-clients", **config.as_dict()},
        **valuation_options(config),  # every estimator option, as `fedvalue run` passes them
    )
    initial = initial_arrays(model_factory())
    with seeded_server_generators(config.seed):
        strategy.start(grid, initial, num_rounds=config.rounds, timeout=config.round_timeout,
                       train_config=ConfigRecord(train_config(
                           learning_rate=config.learning_rate, local_epochs=config.local_epochs,
                           batch_size=config.batch_size, seed=config.seed)))
    check_some_client_valued(load_run(run_dir), run_dir)  # fail loudly, as `fedvalue run` does


def _client_app() -> ClientApp:
    # Clients hold the default partitions: under `flwr run` only server-side keys
    # (out, rounds, clients-per-round, schedule, strategy, methods, ...) may differ from the defaults.
    config = NoisyClientsConfig()
    loader, model_factory, _, _ = build(config)
    return make_client_app(loader, model_factory, mods=client_mods(config.strategy))


client_app = _client_app()
