"""The ``noisy-clients`` simulation: [ADS] §6.2 / App. C.2 on embedded data.

30 clients, 5 rounds, 6 clients per round, each client once (the 30 clients are
partitioned evenly across the rounds; ``schedule="random"`` samples afresh every
round instead), half of them noisy: each of their labels flipped with probability
p = 0.7 to a uniformly chosen other class. A two-hidden-layer MLP (200, 200), local
full-batch SGD, FedAvg, accuracy on held-out data as the utility; every sampled
client is valued by within-round ADS and LOO.

Defaults differ from the paper in two places, both for the embedded digits data
(1,797 images of 8×8 pixels instead of MNIST): each client holds an equal share of
the 75% training pool (~42 images instead of 120), and the local learning rate is
0.1 instead of 0.01, at which this MLP actually learns in 50 full-batch epochs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from clients import ClientData, HonestClient, LabelNoise
from fedvalue import EXPANSION_METHODS, VALUATION_METHODS
from fedvalue.ledger import RoundRow, Run
from fedvalue.utilities import TorchModelUtility
from simulations.datasets import (
    DATASETS,
    IDX_DATASETS,
    MODELS,
    PARTITION_SCHEMES,
    Dataset,
    check_hidden,
    load_dataset,
    make_model,
    num_parameters,
    partition,
    sample_per_class,
    split_holdout,
)
from simulations.runner import (
    DIFFERENTIABLE_UTILITY,
    STRATEGY_PARAMETERS,
    EngineSettings,
    RayParallelUtility,
    Simulation,
    build_strategy,
    check_budget,
    check_devices,
    check_integers,
    check_number,
    check_numbers,
    check_ray_address,
    check_strategy,
    client_mods,
    clients_device,
    fixed_second_order_asked,
    flat_settings,
    parse_budget,
    saved_config,
    simulate,
    torch_threads,
    valuation_workers_advice,
)
from strategies import (
    SCHEDULES,
    AdsSettings,
    BookSettings,
    IntakeSettings,
    PartitionSampler,
    RunCallbacks,
    RunSettings,
    ValuationSettings,
    aggregates_by_weighted_mean,
    train_config,
)

#: Largest model (parameters, counted with MNIST's 784 inputs) and most valuation actors
#: accepted: a typo must not exhaust memory.
MAX_PARAMETERS = 50_000_000
MAX_VALUATION_WORKERS = 256
#: ``ads_method`` choices (:class:`fedvalue.AdsSettings`' methods: the estimators of coalitions, the
#: expansions of a FedAvg round, adaptive MC-ADS) and ``utility`` metrics (fedvalue.scoring.torch_utilities).
ADAPTIVE = "adaptive"
ADS_METHODS = ("auto", "exact", "mc", "tmc", "antithetic", "stratified", "kernelshap", *EXPANSION_METHODS, ADAPTIVE)
UTILITIES = ("accuracy", "neg_loss")
#: The decisions adaptive MC-ADS spends its evaluations on (:class:`fedvalue.AdsSettings`' ``decision``).
ADAPTIVE_DECISIONS = ("threshold", "top-k")
#: The ``ads_method="adaptive"`` settings, written to run.json only by an adaptive run (as
#: :meth:`fedvalue.AdsSettings.as_dict` leaves out its decision fields for other methods), so that the run.json of
#: a run by any other method reads as before, byte for byte, and such a run written before them resumes.
ADAPTIVE_KEYS = ("adaptive_decision", "adaptive_cut", "adaptive_top_k", "adaptive_z")
#: The switch of the fixed-weight game's second-order book, written to run.json only when on (the same reason).
FIXED_SECOND_ORDER = "fixed_second_order"



@dataclass
class NoisyClientsConfig:
    """Every number of the simulation (each is a ``fedvalue run noisy-clients`` option)."""

    seed: int = 0
    dataset: str = "digits"
    data_path: str | None = None
    holdout_fraction: float = 0.25
    num_clients: int = 30
    rounds: int = 5
    clients_per_round: int = 6
    schedule: str = "even"
    partition: str = "iid"
    dirichlet_alpha: float = 0.5
    classes_per_partition: int = 2
    shards_per_partition: int = 2
    noisy_fraction: float = 0.5
    flip_probability: float = 0.7
    hidden: tuple[int, ...] = (200, 200)
    local_epochs: int = 50
    learning_rate: float = 0.1
    batch_size: int = 0
    strategy: str = "fedavg"
    proximal_mu: float = STRATEGY_PARAMETERS["proximal_mu"][0]
    trimmed_beta: float = STRATEGY_PARAMETERS["trimmed_beta"][0]
    num_malicious: int = STRATEGY_PARAMETERS["num_malicious"][0]
    num_selected: int = STRATEGY_PARAMETERS["num_selected"][0]
    q: float = STRATEGY_PARAMETERS["q"][0]
    noise: float = STRATEGY_PARAMETERS["noise"][0]
    clipping_norm: float = STRATEGY_PARAMETERS["clipping_norm"][0]
    target_clipped_quantile: float = STRATEGY_PARAMETERS["target_clipped_quantile"][0]
    clip_norm_lr: float = STRATEGY_PARAMETERS["clip_norm_lr"][0]
    clipped_count_stddev: float = STRATEGY_PARAMETERS["clipped_count_stddev"][0]
    methods: tuple[str, ...] = ("ads", "loo")
    ads_method: str = "auto"
    epsilon: float = 0.1
    delta: float = 0.05
    truncation_tolerance: float = 1e-3
    stderr_target: float | None = None
    adaptive_decision: str = "threshold"
    adaptive_cut: float = 0.0
    adaptive_top_k: int | None = None
    adaptive_z: float = 2.0
    utility: str = "accuracy"
    engine: EngineSettings = EngineSettings()
    device: str = "cpu"
    round_timeout: float = 600.0
    query_timeout: float = 120.0
    valuation_workers: int = 0
    model: str = "mlp"
    examples_per_client: int = 0
    holdout_examples: int = 0
    valuation_budget: str | None = None
    fixed_second_order: bool = False

    #: run.json and the command line have the engine's settings flat, ``device`` among them where
    #: it always stood (:func:`simulations.runner.engine_settings.flat_fields`).
    ENGINE_KEYS: ClassVar[tuple[str, ...]] = ("num_cpus_per_client", "num_gpus_per_client", "device",
                                              "max_parallel_clients", "ray_address")
    #: Settings a saved run.json may lack: the adaptive ones (:data:`ADAPTIVE_KEYS`), absent from the run.json
    #: of a run by another method, and :data:`FIXED_SECOND_ORDER`, absent when off; read back as their defaults
    #: (:func:`simulations.runner.config_checks.saved_config`).
    OPTIONAL_KEYS: ClassVar[tuple[str, ...]] = (*ADAPTIVE_KEYS, FIXED_SECOND_ORDER)

    def as_dict(self) -> dict:
        """The settings as run.json writes them (:func:`simulations.runner.flat_settings`), the adaptive ones
        only for ``ads_method="adaptive"`` (:data:`ADAPTIVE_KEYS`; :func:`_check` holds them at their defaults
        for any other method) and ``fixed_second_order`` only when on."""
        settings = flat_settings(self)
        if self.ads_method != ADAPTIVE:
            for name in ADAPTIVE_KEYS:
                del settings[name]
        if not self.fixed_second_order:
            del settings[FIXED_SECOND_ORDER]
        return settings


def valuation_settings(config: NoisyClientsConfig, utility=None) -> ValuationSettings:
    """The config's methods and ADS estimator settings, checked once; a ``valuation_budget`` in
    seconds is turned into coalition evaluations per round by timing ``utility``
    (:func:`simulations.runner.budget.evaluations_for`)."""
    budget = parse_budget(config.valuation_budget)
    evaluations = None if budget is None else budget.evaluations_for(utility, config.clients_per_round)
    if evaluations is not None:
        check_budget(evaluations, config.ads_method, config.clients_per_round, config.methods)
    ads = AdsSettings(method=config.ads_method, epsilon=config.epsilon, delta=config.delta,
                      truncation_tolerance=config.truncation_tolerance, stderr_target=config.stderr_target,
                      budget=evaluations, **_decision(config))
    return ValuationSettings(methods=config.methods, ads=ads)


def _decision(config: NoisyClientsConfig) -> dict:
    """The decision of adaptive MC-ADS as :class:`fedvalue.AdsSettings` takes it (``decision``, then ``cut`` for
    a threshold or ``top_k`` for the top k, and ``z``); nothing for any other method."""
    if config.ads_method != ADAPTIVE:
        return {}
    chosen = {"cut": config.adaptive_cut} if config.adaptive_decision == "threshold" else {
        "top_k": config.adaptive_top_k}
    return {"decision": config.adaptive_decision, **chosen, "z": config.adaptive_z}


def _check(config: NoisyClientsConfig) -> None:
    """ValueError naming the first bad field, before anything is written or started."""
    check_integers(config, ("num_clients", "rounds", "clients_per_round", "local_epochs"))
    check_integers(config, ("valuation_workers", "batch_size", "seed"), minimum=0)
    check_numbers(config, ("learning_rate", "epsilon", "round_timeout", "query_timeout", "dirichlet_alpha"))
    if config.clients_per_round > config.num_clients:
        raise ValueError(
            f"clients_per_round: expected at most num_clients={config.num_clients}; got {config.clients_per_round}."
        )
    for name in ("holdout_fraction", "noisy_fraction", "flip_probability"):
        value = getattr(config, name)
        low_ok = value > 0 if name == "holdout_fraction" else value >= 0
        if not (low_ok and value <= 1) or (name == "holdout_fraction" and value >= 1):
            bounds = "(0, 1)" if name == "holdout_fraction" else "[0, 1]"
            raise ValueError(f"{name}: expected a number in {bounds}; got {value!r}.")
    if not 0 < config.delta < 1:
        raise ValueError(f"delta: expected a number in (0, 1); got {config.delta!r}.")
    check_numbers(config, ("truncation_tolerance",), zero_ok=True)
    check_number("stderr_target", config.stderr_target, low=0.0, low_open=True, none_ok=True)
    # CPUs, GPUs, parallelism and cluster address were checked as config.engine was made.
    check_devices(config.device, config.engine.num_gpus_per_client, ray_address=config.engine.ray_address)
    check_strategy(config, config.clients_per_round)
    if config.dataset not in DATASETS:
        raise ValueError(f"dataset: expected one of {list(DATASETS)}; got {config.dataset!r}.")
    if config.dataset == "mnist" and not config.data_path:
        raise ValueError("data_path: expected a directory of MNIST IDX files or an .npz for the mnist dataset "
                         "(it is read from local files); got none. Pass --data-path DIR_OR_NPZ.")
    if config.data_path and config.dataset not in IDX_DATASETS:
        raise ValueError(f"data_path: only read for the datasets {list(IDX_DATASETS)}; got {config.data_path!r} "
                         f"with dataset {config.dataset!r}.")
    if config.model not in MODELS:
        raise ValueError(f"model: expected one of {list(MODELS)}; got {config.model!r}.")
    check_integers(config, ("examples_per_client", "holdout_examples"), minimum=0)
    budget = parse_budget(config.valuation_budget)
    if budget is not None and budget.evaluations is not None:  # seconds: checked once timed
        check_budget(budget.evaluations, config.ads_method, config.clients_per_round, config.methods)
    check_integers(config, ("classes_per_partition", "shards_per_partition"))
    if config.partition not in PARTITION_SCHEMES:
        raise ValueError(f"partition: expected one of {list(PARTITION_SCHEMES)}; got {config.partition!r}.")
    if config.schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {list(SCHEDULES)}; got {config.schedule!r}.")
    unknown = [m for m in config.methods if m not in VALUATION_METHODS]
    if unknown or len(set(config.methods)) != len(config.methods):
        raise ValueError(f"methods: expected distinct names from {list(VALUATION_METHODS)}; got {list(config.methods)}.")
    if config.ads_method not in ADS_METHODS:
        raise ValueError(f"ads_method: expected one of {list(ADS_METHODS)}; got {config.ads_method!r}.")
    if config.utility not in UTILITIES:
        raise ValueError(f"utility: expected one of {list(UTILITIES)}; got {config.utility!r}.")
    _check_expansion(config)
    _check_fixed_second_order(config)
    _check_adaptive(config)
    check_hidden(config.hidden)
    parameters = num_parameters(config.model, 784, 10, hidden=config.hidden)
    if parameters > MAX_PARAMETERS:
        raise ValueError(f"hidden: expected layers making at most {MAX_PARAMETERS:,} parameters; "
                         f"{list(config.hidden)} make {parameters:,}.")
    if not config.methods:
        raise ValueError(f"methods: expected at least one of {list(VALUATION_METHODS)}; got none.")
    if config.valuation_workers > MAX_VALUATION_WORKERS:
        raise ValueError(f"valuation_workers: expected at most {MAX_VALUATION_WORKERS} Ray actors; got "
                         f"{config.valuation_workers}.")
    if config.engine.ray_address:
        check_ray_address(config.engine.ray_address)


def _check_expansion(config: NoisyClientsConfig) -> None:
    """An expansion method (:data:`fedvalue.EXPANSION_METHODS`) only where the valuing strategy would take it
    (:func:`strategies.hooks.registry.check_expansion`), refused here before Ray starts: it differentiates U
    (``neg_loss``) and reads a round of FedAvg's weighted mean (not a strategy that aggregates by its own code)."""
    method = config.ads_method
    if method not in EXPANSION_METHODS or "ads" not in config.methods:  # no ADS booked: nothing expanded
        return
    if config.utility != DIFFERENTIABLE_UTILITY:
        raise ValueError(f"ads_method: {method!r} expands the round game at A_{{t−1}} and needs the differentiable "
                         f"utility; expected utility={DIFFERENTIABLE_UTILITY!r} with it; got utility={config.utility!r}. "
                         "Pass utility=neg_loss, or an estimator of coalitions ('auto', 'exact', 'mc', ...).")
    if not aggregates_by_weighted_mean(build_strategy(config, config.clients_per_round)):
        raise ValueError(f"ads_method: {method!r} expands the round game of FedAvg's weighted mean; expected a "
                         f"strategy that aggregates by it ('fedavg', 'fedprox'); got strategy={config.strategy!r}, "
                         "which aggregates by its own code. Use such a strategy, or an estimator of coalitions "
                         "('auto', 'exact', 'mc', ...).")


def _check_fixed_second_order(config: NoisyClientsConfig) -> None:
    """The fixed-weight game's second-order book only where the valuing strategy would take it
    (:func:`strategies.hooks.registry.check_fixed_second_order`), refused here before Ray starts: it
    differentiates U (``neg_loss``) and weighs coalitions by FedAvg's round weights ('fedavg', 'fedprox')."""
    if not fixed_second_order_asked(config.fixed_second_order, config.utility,
                                    "Pass utility=neg_loss, or leave it off."):
        return
    if not aggregates_by_weighted_mean(build_strategy(config, config.clients_per_round)):
        raise ValueError(f"fixed_second_order: expected a strategy that aggregates by FedAvg's weighted mean "
                         f"('fedavg', 'fedprox'; the fixed-weight coalition rule is defined for it only); got "
                         f"strategy={config.strategy!r}, which aggregates by its own code. Use such a strategy, or "
                         "leave it off.")


def _check_adaptive(config: NoisyClientsConfig) -> None:
    """The adaptive settings (:data:`ADAPTIVE_KEYS`): each in its range with ``ads_method="adaptive"``, at its
    default with any other method (a decision no estimator reads is refused, not ignored)."""
    if config.ads_method != ADAPTIVE:
        for name in ADAPTIVE_KEYS:
            value = getattr(config, name)
            default = getattr(NoisyClientsConfig, name)  # the field's default
            if value != default:
                raise ValueError(f"{name}: only ads_method='adaptive' reads it; expected the default {default!r} "
                                 f"with ads_method={config.ads_method!r}; got {value!r}. Set ads_method=adaptive, "
                                 "or leave it out.")
        return
    if config.adaptive_decision not in ADAPTIVE_DECISIONS:
        raise ValueError(f"adaptive_decision: expected one of {list(ADAPTIVE_DECISIONS)}; got "
                         f"{config.adaptive_decision!r}.")
    check_number("adaptive_z", config.adaptive_z, low=0.0, low_open=True)
    if config.adaptive_decision == "threshold":
        check_number("adaptive_cut", config.adaptive_cut)
        if config.adaptive_top_k is not None:
            raise ValueError(f"adaptive_top_k: a 'threshold' decision takes a cut, not a top k; expected none; got "
                             f"{config.adaptive_top_k!r}. Set adaptive_decision=top-k, or leave it out.")
        return
    if config.adaptive_cut != NoisyClientsConfig.adaptive_cut:
        raise ValueError(f"adaptive_cut: a 'top-k' decision takes a top k, not a cut; expected the default "
                         f"{NoisyClientsConfig.adaptive_cut!r}; got {config.adaptive_cut!r}. Set "
                         "adaptive_decision=threshold, or leave it out.")
    top_k = config.adaptive_top_k
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= config.clients_per_round:
        raise ValueError(f"adaptive_top_k: a 'top-k' decision takes how many clients of a round it decides; expected "
                         f"an integer from 1 to clients_per_round={config.clients_per_round}; got "
                         f"{'none' if top_k is None else repr(top_k)}.")


@functools.lru_cache(maxsize=2)
def _prepared(config_json: str) -> tuple[Dataset, Dataset, list[np.ndarray], frozenset[int]]:
    """Train pool, held-out set, partitions and noisy set of a config (seeded).

    Cached per process: Ray workers rebuild it once from the config instead of receiving
    the data with every message (the ClientApp travels pickled with each message).
    """
    config = saved_config(NoisyClientsConfig, json.loads(config_json))
    seeds = np.random.SeedSequence(config.seed).spawn(6)  # the first four as before: same draws
    if config.dataset in IDX_DATASETS:  # the dataset's own split: held out is its test set ([ADS] App. C.2)
        train = load_dataset(config.dataset, data_path=config.data_path or None, split="train")
        holdout = load_dataset(config.dataset, data_path=config.data_path or None, split="test")
    else:
        train, holdout = split_holdout(load_dataset(config.dataset), config.holdout_fraction,
                                       seed=np.random.default_rng(seeds[0]))
    if config.examples_per_client:  # [ADS] App. C.2: 30 × 120 images, balanced by class
        train = train.subset(sample_per_class(train.y, config.num_clients * config.examples_per_client,
                                              seed=np.random.default_rng(seeds[4]), name="examples_per_client"))
    if config.holdout_examples:
        holdout = holdout.subset(sample_per_class(holdout.y, config.holdout_examples,
                                                  seed=np.random.default_rng(seeds[5]), name="holdout_examples"))
    partitions = partition(train.y, config.num_clients, scheme=config.partition, seed=np.random.default_rng(seeds[1]),
                           alpha=config.dirichlet_alpha, classes_per_partition=config.classes_per_partition,
                           shards_per_partition=config.shards_per_partition)
    num_noisy = int(round(config.noisy_fraction * config.num_clients))
    noisy = frozenset(int(c) for c in np.random.default_rng(seeds[2]).choice(config.num_clients, num_noisy, replace=False))
    return train, holdout, partitions, noisy


def client_data(partition_id: int, *, config_json: str) -> ClientData:
    """Client ``partition_id``'s data; noisy clients flip labels ([ADS] App. C.2)."""
    train, _, partitions, noisy = _prepared(config_json)
    config = json.loads(config_json)
    behaviour = (
        LabelNoise(config["flip_probability"], train.num_classes, seed=[config["seed"], partition_id])
        if partition_id in noisy
        else HonestClient()
    )
    indices = partitions[partition_id]
    x, y = train.x[indices], train.y[indices]
    return ClientData(
        partition_id=partition_id, x_train=x, y_train=y, x_infer=x[:0], y_infer=y[:0],
        behaviour=behaviour, loss="cross_entropy",
    )


def build(config: NoisyClientsConfig):
    """Client loader, model factory, utility and noisy set for ``config``."""
    _check(config)
    config_json = json.dumps(config.as_dict(), sort_keys=True)
    train, holdout, _, noisy = _prepared(config_json)
    model_factory = functools.partial(make_model, config.model, train.x.shape[1], train.num_classes,
                                      hidden=tuple(config.hidden), seed=config.seed)
    loader = functools.partial(client_data, config_json=config_json)
    utility = TorchModelUtility(model_factory(), holdout.x, holdout.y, metric=config.utility, device=config.device)
    return loader, model_factory, utility, noisy


def run_noisy_clients(
    config: NoisyClientsConfig,
    out: str,
    *,
    on_round: Callable[[RoundRow], None] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    sign_key=None,
    on_valuation_progress: Callable[[int, int, int], None] | None = None,
) -> Run:
    """Run the simulation on Ray and return its ledger (see module docstring); ``resume``
    continues the run in ``out`` from its last completed round; ``sign_key`` signs its seals
    and manifest (:mod:`fedvalue.run.seals`); ``on_valuation_progress`` is told (round, coalitions
    evaluated, planned) during each round's valuation (:mod:`simulations.runner.progress`)."""
    loader, model_factory, utility, noisy = build(config)
    if config.valuation_workers:
        advice = valuation_workers_advice(utility, workers=config.valuation_workers,
                                          clients_per_round=config.clients_per_round, rounds=config.rounds)
        if advice is not None:
            logging.getLogger("flwr").warning("fedvalue: %s", advice)
        utility = RayParallelUtility(utility, num_workers=config.valuation_workers)
    try:
        return _simulate(config, loader, model_factory, utility, noisy, out, on_round, overwrite, resume, sign_key,
                         on_valuation_progress)
    finally:
        if config.valuation_workers:
            utility.close()


def _simulate(config, loader, model_factory, utility, noisy, out, on_round, overwrite, resume=False,
              sign_key=None, on_valuation_progress=None) -> Run:
    return simulate(
        strategy=build_strategy(config, config.clients_per_round),
        client_mods=client_mods(config.strategy),
        client_device=clients_device(config.device),
        model_factory=model_factory,
        load_client_data=loader,
        num_clients=config.num_clients,
        num_rounds=config.rounds,
        utility=utility,
        out=out,
        train_config=train_config(learning_rate=config.learning_rate, local_epochs=config.local_epochs,
                                  batch_size=config.batch_size, seed=config.seed),
        sampler=PartitionSampler(config.clients_per_round, schedule=config.schedule, seed=config.seed),
        seed=config.seed,
        books=BookSettings(noisy_clients=noisy, fixed_second_order=config.fixed_second_order),
        valuation=valuation_settings(config, utility),
        intake=IntakeSettings(query_timeout=config.query_timeout),
        run=RunSettings(run_config={"simulation": "noisy-clients", **config.as_dict(), "noisy_clients": sorted(noisy)},
                        resume=resume, sign_key=sign_key),
        callbacks=RunCallbacks(on_round=on_round, on_progress=on_valuation_progress),
        engine=config.engine,
        overwrite=overwrite,
        round_timeout=config.round_timeout,
    )


def cli_main(config: NoisyClientsConfig, options) -> int:
    """``fedvalue run noisy-clients``: run (or resume) and print one line per round."""
    from simulations.runner import ValuationProgress, print_federated_run, round_progress

    progress = None if options.quiet else ValuationProgress()
    try:
        run = run_noisy_clients(config, options.out,
                                on_round=None if options.quiet else round_progress(config.rounds),
                                overwrite=options.overwrite, resume=options.resume, sign_key=options.sign_key,
                                on_valuation_progress=progress)
    finally:
        if progress is not None:
            progress.close()
    return print_federated_run(run, options)


def audited_config(saved: dict) -> NoisyClientsConfig:
    """The configuration a saved run is audited with: run.json's, but never attached to a Ray
    cluster (an audit connects nowhere: run.json's ``ray_address`` is not even probed) and
    never reading data a user named outside the run directory (a run on MNIST files or on a
    ``data_path`` is refused: its utility is then not rebuilt and its values not verifiable).
    Data that ship with an installed package are read as the run read them: digits and the
    other scikit-learn sets, and Fashion-MNIST where Debian's dataset-fashion-mnist puts it."""
    config = saved_config(NoisyClientsConfig, saved, strict=False)
    if config.dataset == "mnist" or config.data_path:
        raise ValueError("data_path: the run's data lie outside the run directory "
                         f"({str(config.data_path)[:80]!r}); the audit opens no file outside it, so it does not "
                         "rebuild the run's utility")
    return dataclasses.replace(config, engine=dataclasses.replace(config.engine, ray_address=None),
                               valuation_workers=0)


def utility_from_run(saved: dict):
    """The utility a saved noisy-clients run was valued with (for the audit)."""
    return build(audited_config(saved))[2]


def audit_from_run(saved: dict) -> dict:
    """What the audit can rebuild of a saved run from its settings alone: the utility, the
    noisy clients (drawn from the seed), round t's sampled clients (the seeded sampler), each
    client's example count (its seeded partition) and its local training (replayed from the
    round's start with run.json's training settings and seed: :func:`clients.app.train_client`)."""
    from clients import train_client
    from strategies import replay_aggregator

    config = audited_config(saved)
    loader, model_factory, utility, noisy = build(config)
    sampler = PartitionSampler(config.clients_per_round, schedule=config.schedule, seed=config.seed)
    proximal_mu = config.proximal_mu if config.strategy == "fedprox" else 0.0

    def example_counts(client) -> int:
        return len(loader(int(client)).x_train)

    def retrain(server_round: int, client, start_arrays) -> dict:
        # As many torch threads as the client's Ray worker had: reductions then add in its order
        # (with another thread count 50 epochs can drift by 1e-4).
        with torch_threads(max(1, int(config.engine.num_cpus_per_client))):
            arrays, _, _ = train_client(loader(int(client)), model_factory, dict(start_arrays),
                                        learning_rate=config.learning_rate, local_epochs=config.local_epochs,
                                        batch_size=config.batch_size, seed=config.seed, server_round=server_round,
                                        proximal_mu=proximal_mu)
        return arrays

    return {"utility": utility, "noisy_clients": noisy,
            # A deployment that lost nodes samples from those left (the record lists them).
            "sampled": lambda t, available=None: sampler.sample(t, range(config.num_clients) if available is None
                                                               else available),
            "example_counts": example_counts, "retrain": retrain,
            "replay": replay_aggregator(lambda: build_strategy(config, config.clients_per_round))}


#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("noisy-clients", NoisyClientsConfig, cli_main, resumable=True,
                        utility_from_run=utility_from_run, audit_from_run=audit_from_run)
