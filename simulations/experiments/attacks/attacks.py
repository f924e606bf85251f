"""What manipulating clients get from the books: one attacker at a time, through Flower on Ray.

Digits (1,797 8×8 images, 10 classes), 25% held out (stratified) for the utility. The
rest is split IID among ``num_clients`` clients; each client keeps a random half for
training and the other half as its inference split (TracIn flows need one). Every
round every client trains ``local_epochs`` full-batch SGD epochs of a softmax
regression from A_{t−1}; FedAvg aggregates; ValuingStrategy books exact within-round
ADS and LOO (utility: held-out accuracy by default) and TracIn flows.

One run per attack, all from the same A_0 and seed, client ``attacker`` playing:

``none``                 honest (the baseline: what the attacker's seat earns honestly)
``free-rider``           replies A_{t−1} (:class:`clients.behaviours.FreeRider`)
``free-rider-noise``     replies A_{t−1} + N(0, ``noise_std``²) per entry
``inflated-count``       trains honestly, claims ``inflation`` × its example count
``inflated-count-reviewed``  the same, with :class:`strategies.policies.claims.ClaimReview` on
                         (registered sizes, ``median_multiple`` × the median, ``jump_factor``)
``replicator``           trains on a copy of client ``source``'s data: submits its update
``sign-flip``            replies A_{t−1} − (w − A_{t−1})
``boost``                replies A_{t−1} + ``boost`` (w − A_{t−1})

The table has, per attack, the attacker's totals over the rounds (ADS, LOO, TracIn
outflow and inflow) next to the mean total of the honest clients, the final held-out
accuracy and its change against ``none``, and the claim flags booked.

One engine serves every run (as in :mod:`simulations.experiments.noisy_clients.study`; :func:`simulations.runner.api.simulate`
starts one per call), the clients reading the attack from the ``data-key`` of the train config.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from flwr.app import ConfigRecord
from flwr.serverapp import Grid

from clients.app import ClientData, make_client_app
from clients.behaviours import (
    BoostedUpdate,
    ClientBehaviour,
    FreeRider,
    HonestClient,
    InflatedExampleCount,
    Replicator,
    SignFlip,
)
from fedvalue.run.ledger_tables import load_run, write_json
from fedvalue.schema import RUN_CONFIG_FILE, Status
from fedvalue.scoring.torch_utilities import TorchModelUtility
from simulations.datasets import load_dataset, make_linear_model, partition_iid, split_holdout
from simulations.runner import (
    EngineOptions,
    Simulation,
    check_integers,
    check_numbers,
    fedavg_without_evaluation,
    initial_model_arrays,
    package_versions,
    prepare_run_dir,
    saved_config,
    seeded_server_generators,
    serve,
)
from strategies import (
    CLAIM_METHODS,
    BookSettings,
    ClaimReview,
    IntakeSettings,
    PartitionSampler,
    RunSettings,
    ValuationSettings,
    ValuingStrategy,
    train_config,
)

ATTACKS = ("none", "free-rider", "free-rider-noise", "inflated-count", "inflated-count-reviewed", "replicator",
           "sign-flip", "boost")
UTILITIES = ("accuracy", "neg_loss")
#: Ledger methods summed per client, and their column names in the table.
BOOKS = {"ads": "ads", "loo": "loo", "tracin_outflow": "outflow", "tracin_inflow": "inflow"}


@dataclass
class AttacksConfig:
    """Every number of the attack measurement."""

    seed: int = 0
    num_clients: int = 8
    rounds: int = 5
    local_epochs: int = 5
    learning_rate: float = 0.5
    holdout_fraction: float = 0.25
    utility: str = "accuracy"
    attacks: tuple[str, ...] = ATTACKS
    attacker: int = 0
    source: int = 7
    noise_std: float = 1e-3
    inflation: float = 50.0
    boost: float = 5.0
    median_multiple: float = 3.0
    jump_factor: float = 2.0
    num_cpus_per_client: float = 1.0
    max_parallel_clients: int | None = None
    ray_address: str | None = None
    round_timeout: float = 600.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def check(config: AttacksConfig) -> None:
    """Every setting, before Ray starts; errors name the parameter, the expectation and the value."""
    check_integers(config, ("num_clients", "rounds", "local_epochs"))
    check_integers(config, ("seed",), minimum=0)
    EngineOptions.of(config)
    check_numbers(config, ("learning_rate", "num_cpus_per_client", "round_timeout"))
    if config.num_clients < 3:
        raise ValueError(f"num_clients: expected at least 3 (an attacker, a source and an honest client); "
                         f"got {config.num_clients}.")
    for name in ("attacker", "source"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < config.num_clients:
            raise ValueError(f"{name}: expected a client id in [0, {config.num_clients}); got {value!r}.")
    if config.source == config.attacker:
        raise ValueError(f"source: expected a client other than the attacker {config.attacker}; got {config.source}.")
    unknown = [a for a in config.attacks if a not in ATTACKS]
    if not config.attacks or unknown or len(set(config.attacks)) != len(config.attacks):
        raise ValueError(f"attacks: expected distinct names from {list(ATTACKS)}; got {list(config.attacks)}.")
    if config.utility not in UTILITIES:
        raise ValueError(f"utility: expected one of {list(UTILITIES)}; got {config.utility!r}.")
    if not 0 < config.holdout_fraction < 1:
        raise ValueError(f"holdout_fraction: expected a number in (0, 1); got {config.holdout_fraction!r}.")
    # The behaviours and the review check their own numbers (noise_std, inflation, boost, ...).
    FreeRider(config.noise_std), InflatedExampleCount(config.inflation), BoostedUpdate(config.boost)
    ClaimReview(median_multiple=config.median_multiple, jump_factor=config.jump_factor)


@functools.lru_cache(maxsize=2)
def _prepared(seed: int, num_clients: int, holdout_fraction: float):
    """(train pool, held-out set, per client (training indices, inference indices)), seeded.

    Cached per process: Ray workers rebuild it once instead of receiving it with every message.
    """
    split_seed, partition_seed, halves_seed = np.random.SeedSequence([seed, 7]).spawn(3)
    train, holdout = split_holdout(load_dataset("digits"), holdout_fraction, seed=np.random.default_rng(split_seed))
    shares = partition_iid(len(train), num_clients, seed=np.random.default_rng(partition_seed))
    halves_rng = np.random.default_rng(halves_seed)
    splits = []
    for share in shares:
        chosen = halves_rng.permutation(share)
        half = len(chosen) // 2
        splits.append((np.sort(chosen[:half]), np.sort(chosen[half:])))
    return train, holdout, tuple(splits)


def attacker_behaviour(attack: str, config: AttacksConfig) -> ClientBehaviour:
    """What client ``config.attacker`` does in the run of ``attack``."""
    if attack == "none":
        return HonestClient()
    if attack == "free-rider":
        return FreeRider()
    if attack == "free-rider-noise":
        return FreeRider(config.noise_std)
    if attack in ("inflated-count", "inflated-count-reviewed"):
        return InflatedExampleCount(config.inflation)
    if attack == "replicator":
        train, _, splits = _prepared(config.seed, config.num_clients, config.holdout_fraction)
        own = splits[config.source][0]
        return Replicator(train.x[own], train.y[own], source_id=config.source)
    if attack == "sign-flip":
        return SignFlip()
    if attack == "boost":
        return BoostedUpdate(config.boost)
    raise ValueError(f"attack: expected one of {list(ATTACKS)}; got {attack!r}.")


def attack_client_data(partition_id: int, data_key: str | None = None, *, config_json: str) -> ClientData:
    """Client ``partition_id``'s data and behaviour in the run named by ``data_key`` (an attack)."""
    config = _config_from_json(config_json)
    train, _, splits = _prepared(config.seed, config.num_clients, config.holdout_fraction)
    own, infer = splits[partition_id]
    behaviour = (attacker_behaviour(data_key or "none", config) if partition_id == config.attacker
                 else HonestClient())
    return ClientData(partition_id, train.x[own], train.y[own], train.x[infer], train.y[infer], behaviour=behaviour)


def claim_review(config: AttacksConfig) -> ClaimReview:
    """The server's rule in the reviewed run: sizes registered at enrollment, a median cap, a jump flag."""
    _, _, splits = _prepared(config.seed, config.num_clients, config.holdout_fraction)
    return ClaimReview(registered={c: len(own) for c, (own, _) in enumerate(splits)},
                       median_multiple=config.median_multiple, jump_factor=config.jump_factor)


def _config_from_json(config_json: str) -> AttacksConfig:
    return saved_config(AttacksConfig, json.loads(config_json))


def summarize(ledger: pd.DataFrame, rounds: pd.DataFrame, attack: str, attacker: int,
              source: int | None = None) -> dict:
    """One row of the table: the attacker's totals, the honest clients' mean totals, accuracy, flags
    (and, for the replicator, the totals of the client it copies in ``notes``)."""
    booked = ledger[ledger["status"] == Status.OK]
    totals = booked[booked["method"].isin(list(BOOKS))].pivot_table(
        index="client_id", columns="method", values="value", aggfunc="sum").reindex(columns=list(BOOKS))
    me = str(attacker)
    honest = totals.drop(index=me)
    row: dict = {"attack": attack}
    for method, name in BOOKS.items():
        row[name] = float(totals.at[me, method])
        row[f"{name}_honest"] = float(honest[method].mean())
    row["accuracy"] = float(rounds["utility_realized"].iloc[-1])
    flags = ledger[ledger["method"].isin(list(CLAIM_METHODS))]
    row["claim_flags"] = " ".join(f"{m}×{n}" for m, n in flags["method"].value_counts().sort_index().items())
    row["notes"] = ""
    if attack == "replicator" and source is not None:
        twin = totals.loc[str(source)]
        row["notes"] = "source {}: ".format(source) + ", ".join(f"{BOOKS[m]} {twin[m]:.4g}" for m in BOOKS)
    return row


def run_attacks(
    config: AttacksConfig,
    out: str | None = None,
    *,
    on_run: Callable[[str], None] | None = None,
    overwrite: bool = False,
) -> pd.DataFrame:
    """Run every attack of ``config`` on one Flower engine; returns the table (module docstring).

    Parameters
    ----------
    config
        The setting; checked before Ray starts.
    out
        Directory for ``attacks.csv``, ``run.json`` and one run directory (ledger) per
        attack. ``None``: a temporary directory, removed afterwards.
    on_run
        Called with a line after each attack's run.
    overwrite
        Replace a measurement already in ``out``.
    """
    check(config)
    if out is None:
        with tempfile.TemporaryDirectory(prefix="fedvalue-attacks-") as scratch:
            return run_attacks(config, scratch, on_run=on_run, overwrite=True)
    run_config = {"simulation": "attacks", **config.as_dict(), "versions": package_versions()}
    out_dir = prepare_run_dir(out, overwrite=overwrite)
    write_json(out_dir / RUN_CONFIG_FILE, run_config)
    config_json = json.dumps(config.as_dict(), sort_keys=True)
    train, holdout, _ = _prepared(config.seed, config.num_clients, config.holdout_fraction)
    model_factory = functools.partial(make_linear_model, train.x.shape[1], train.num_classes, seed=config.seed)
    utility = TorchModelUtility(model_factory(), holdout.x, holdout.y, metric=config.utility)
    initial = initial_model_arrays(model_factory, config.seed)
    rows: list[dict] = []
    def main(grid: Grid) -> None:
        for attack in config.attacks:
            started = time.perf_counter()
            strategy = ValuingStrategy(
                fedavg_without_evaluation(), utility, run_dir=str(out_dir / attack),
                sampler=PartitionSampler(config.num_clients, seed=config.seed), seed=config.seed,
                valuation=ValuationSettings(methods=("ads", "loo")),
                # The ledger's "noisy" column marks the client known to misbehave.
                books=BookSettings(flows=True, noisy_clients=set() if attack == "none" else {config.attacker}),
                intake=IntakeSettings(claims=claim_review(config) if attack == "inflated-count-reviewed" else None),
                run=RunSettings(run_config={"attack": attack, "behaviour": repr(attacker_behaviour(attack, config)),
                                            **config.as_dict()}),
            )
            with seeded_server_generators(config.seed):  # the checkpoint's saved global state is the seed's too
                strategy.start(grid, initial, num_rounds=config.rounds, timeout=config.round_timeout,
                               train_config=ConfigRecord(train_config(
                                   learning_rate=config.learning_rate, local_epochs=config.local_epochs,
                                   seed=config.seed, data_key=attack)))
            run = load_run(out_dir / attack)
            rows.append(summarize(run.ledger, run.rounds, attack, config.attacker, config.source))
            if on_run is not None:
                on_run(f"{attack}: {config.rounds} rounds in {time.perf_counter() - started:.1f}s")

    loader = functools.partial(attack_client_data, config_json=config_json)
    serve(make_client_app(loader, model_factory), main, num_supernodes=config.num_clients,
          engine=EngineOptions.of(config))
    table = pd.DataFrame(rows)
    baseline = table.loc[table["attack"] == "none", "accuracy"]
    table.insert(table.columns.get_loc("accuracy") + 1, "accuracy_change",
                 table["accuracy"] - float(baseline.iloc[0]) if len(baseline) else np.nan)
    table.to_csv(out_dir / "attacks.csv", index=False)
    return table


def format_table(table: pd.DataFrame) -> str:
    """The table as printed: attacker vs honest mean per book, accuracy and its change."""
    return table.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def cli_main(config: AttacksConfig, options) -> int:
    """``fedvalue run attacks``: one run per attack and the table of what each got."""
    table = run_attacks(config, options.out, overwrite=options.overwrite, on_run=options.say())
    print(format_table(table))
    print(f"done in {options.elapsed():.1f}s" + (f"; ledgers in {options.out}" if options.out else ""))
    return 0


#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("attacks", AttacksConfig, cli_main, out_optional=True)
