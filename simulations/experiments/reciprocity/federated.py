"""TracIn reciprocity between federated clients, through Flower on Ray ([RECIP] in FL).

Each of ``num_clients`` clients holds an equal random share of the dataset and splits
it at random into a training half and an inference half ([RECIP] Theorem 3.2 needs
every example equally likely in either split). Every round all clients train
``local_epochs`` full-batch GD epochs from A_{t−1} (logistic regression on
breast-cancer, linear regression on diabetes; the paper's step sizes by default) and
FedAvg aggregates. With flows on, each client returns g_v = ∇ Σ_{inference} ℓ at
A_{t−1}; clients not sampled answer a query with it. The ledger books
F_t(u→v) = −(p_u Δ_u)·g_v as inflow / outflow / self per round and client, and
``first_order.csv`` the actual change of each client's inference loss against
−(inflow + self) ([RECIP], Remark 2.5).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from clients import ClientData
from fedvalue.ledger import RoundRow, Run
from fedvalue.utilities import TorchModelUtility
from simulations.datasets import load_dataset, make_linear_model, partition_iid
from simulations.runner import (
    EngineSettings,
    Simulation,
    check_engine_keys,
    check_integers,
    check_numbers,
    fedavg_without_evaluation,
    flat_settings,
    saved_config,
    simulate,
)
from strategies import BookSettings, PartitionSampler, RunCallbacks, RunSettings, ValuationSettings, train_config

#: [RECIP] §5.2: logistic regression at η = 0.1, linear regression at η = 0.01.
PAPER_LEARNING_RATES = {"breast-cancer": 0.1, "diabetes": 0.01}


@dataclass
class FederatedReciprocityConfig:
    """Every number of the federated reciprocity run."""

    seed: int = 0
    dataset: str = "breast-cancer"
    num_clients: int = 20
    rounds: int = 20
    clients_per_round: int = 20
    local_epochs: int = 5
    learning_rate: float | None = None
    engine: EngineSettings = EngineSettings()
    round_timeout: float = 600.0

    #: The engine settings this job takes (CPUs only), flat in run.json and on the command line.
    ENGINE_KEYS: ClassVar[tuple[str, ...]] = ("num_cpus_per_client", "max_parallel_clients", "ray_address")

    def as_dict(self) -> dict:
        return flat_settings(self)

    @property
    def step_size(self) -> float:
        return PAPER_LEARNING_RATES[self.dataset] if self.learning_rate is None else self.learning_rate


def check(config: FederatedReciprocityConfig) -> None:
    """ValueError naming the first bad field, before anything is written or started."""
    check_integers(config, ("num_clients", "rounds", "clients_per_round", "local_epochs"))
    check_integers(config, ("seed",), minimum=0)
    check_engine_keys(config)
    if config.clients_per_round > config.num_clients:
        raise ValueError(
            f"clients_per_round: expected at most num_clients={config.num_clients}; got {config.clients_per_round}."
        )
    if config.dataset not in PAPER_LEARNING_RATES:
        raise ValueError(f"dataset: expected one of {list(PAPER_LEARNING_RATES)}; got {config.dataset!r}.")
    if config.learning_rate is not None:
        check_numbers(config, ("learning_rate",))  # None: the paper's
    check_numbers(config, ("round_timeout",))
    data_size = {"breast-cancer": 569, "diabetes": 442}[config.dataset]
    if 2 * config.num_clients > data_size:
        raise ValueError(f"num_clients: expected at most {data_size // 2} (each client needs a training and an "
                         f"inference example of the {data_size}); got {config.num_clients}.")


@functools.lru_cache(maxsize=2)
def _splits(dataset: str, num_clients: int, seed: int):
    """Per client (training indices, inference indices): a random half each."""
    data = load_dataset(dataset)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0]))
    shares = partition_iid(len(data.y), num_clients, seed=rng)
    splits = []
    for share in shares:
        chosen = rng.permutation(share)
        half = len(chosen) // 2
        splits.append((np.sort(chosen[:half]), np.sort(chosen[half:])))
    return data, splits


def client_data(partition_id: int, *, dataset: str, num_clients: int, seed: int) -> ClientData:
    data, splits = _splits(dataset, num_clients, seed)
    train, infer = splits[partition_id]
    return ClientData(
        partition_id=partition_id, x_train=data.x[train], y_train=data.y[train],
        x_infer=data.x[infer], y_infer=data.y[infer],
        loss="cross_entropy" if data.is_classification else "mse",
    )


def build(config: FederatedReciprocityConfig) -> tuple[Callable, TorchModelUtility]:
    """The model factory and the server's utility of a configuration (for runs and audits)."""
    check(config)
    data, splits = _splits(config.dataset, config.num_clients, config.seed)
    outputs = data.num_classes if data.is_classification else 1
    model_factory = functools.partial(make_linear_model, data.x.shape[1], outputs, seed=config.seed)
    # The server's utility is only displayed here: the union of the inference halves.
    infer = np.concatenate([i for _, i in splits])
    utility = TorchModelUtility(model_factory(), data.x[infer], data.y[infer],
                                metric="accuracy" if data.is_classification else "neg_mse")
    return model_factory, utility


def run_federated_reciprocity(
    config: FederatedReciprocityConfig,
    out: str,
    *,
    on_round: Callable[[RoundRow], None] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    sign_key=None,
) -> Run:
    """Run the federated reciprocity simulation; returns its ledger (flows booked); ``sign_key``
    signs its seals and manifest (:mod:`fedvalue.run.seals`)."""
    model_factory, utility = build(config)
    return simulate(
        strategy=fedavg_without_evaluation(),
        model_factory=model_factory,
        load_client_data=functools.partial(client_data, dataset=config.dataset, num_clients=config.num_clients,
                                           seed=config.seed),
        num_clients=config.num_clients,
        num_rounds=config.rounds,
        utility=utility,
        out=out,
        train_config=train_config(learning_rate=config.step_size, local_epochs=config.local_epochs,
                                  seed=config.seed),
        sampler=PartitionSampler(config.clients_per_round, schedule="random", seed=config.seed),
        books=BookSettings(flows=True),
        seed=config.seed,
        valuation=ValuationSettings(methods=()),
        run=RunSettings(run_config={"simulation": "reciprocity-federated", **config.as_dict(),
                                    "learning_rate_used": config.step_size,
                                    "splits": "per client: random half train, half inference"},
                        resume=resume, sign_key=sign_key),
        callbacks=RunCallbacks(on_round=on_round),
        engine=config.engine,
        overwrite=overwrite,
        round_timeout=config.round_timeout,
    )


def cli_main(config: FederatedReciprocityConfig, options) -> int:
    """``fedvalue run reciprocity-federated``: run (or resume) and print the run's figures."""
    from simulations.runner import print_federated_run, round_progress

    run = run_federated_reciprocity(config, options.out, on_round=None if options.quiet else
                                    round_progress(config.rounds), overwrite=options.overwrite, resume=options.resume,
                                    sign_key=options.sign_key)
    return print_federated_run(run, options)


def utility_from_run(saved: dict):
    """The utility a saved reciprocity-federated run was valued with (for the audit)."""
    return build(saved_config(FederatedReciprocityConfig, saved, strict=False))[1]


#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("reciprocity-federated", FederatedReciprocityConfig, cli_main, resumable=True,
                        utility_from_run=utility_from_run)
