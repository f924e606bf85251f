"""The attack study: every attack of :mod:`.plan` over seeds, IID and Dirichlet data and inner
strategies, with the defences' books beside the plain ones, through Flower on Ray.

Data: ``dataset`` (Fashion-MNIST from Debian's dataset-fashion-mnist, or digits), a
class-balanced sample of ``train_examples`` training images split among ``num_clients``
clients (IID, or Dirichlet label skew with concentration ``dirichlet_alpha``), each keeping
half for training and half as its inference split; the utility is held-out accuracy (or −loss:
``utility``) on a class-balanced sample of ``holdout_examples`` test images. Model: softmax regression (a
stand-in for the papers' networks), full-batch local SGD. Every participant trains every
round; the claim review caps claims at each identity's registered size (its true size).

With ``fixed_second_order`` (under ``utility="neg_loss"``, FedAvg only) every run also books the fixed-weight round
game's second-order book, ``ads_fixed_second_order`` ([ADS] Remark 4.1 on the expansion), and with the defences on
its defended counterpart, ``ads_fixed_second_order_defended``; both are summed in totals.csv and tabled as a book in
gains.csv and honest_cost.csv. Off, neither appears anywhere.

Runs are grouped by how many identities take part (each is a node): one Flower engine per
group, the runs of a group one after another on it. Run directories:
``OUT/<partition>-<strategy>-seed<S>/<attack>/``; tables: ``totals.csv`` (each client's total per
book in each run), ``runs.csv`` (accuracy and flags per run) and ``gains.csv`` (:mod:`fedvalue.analysis.gains`).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from flwr.app import ConfigRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedMedian, FedTrimmedAvg

from clients import ClientData, make_client_app, overlapping_shard_indices, shard_indices
from fedvalue import Status
from fedvalue.ledger import load_run
from fedvalue.utilities import TorchModelUtility
from simulations.datasets import load_dataset, make_linear_model, partition, sample_per_class, split_holdout
from simulations.experiments.attacks.plan import AttackSettings, RunPlan, behaviour_of, plan_of
from simulations.runner import (
    fedavg_without_evaluation,
    initial_model_arrays,
    saved_config,
    seeded_server_generators,
    serve,
    skipped_evaluation_unannounced,
)
from strategies import (
    AdsSettings,
    BookSettings,
    ClaimReview,
    DefenceSettings,
    IntakeSettings,
    NodeDirectory,
    PartitionSampler,
    RepresentativesOnly,
    RunSettings,
    ValuationSettings,
    ValuingStrategy,
    train_config,
)

def _quietly(build: Callable) -> Callable:
    """``build`` without Flower's notice that federated evaluation is off (the server's utility is the evaluation)."""
    def built():
        with skipped_evaluation_unannounced():
            return build()
    return built


#: Inner strategies of the study: FedAvg and robust rules (valued by their own aggregation).
STRATEGIES: dict[str, Callable] = {
    "fedavg": fedavg_without_evaluation,
    "fedmedian": _quietly(lambda: FedMedian(fraction_evaluate=0.0)),
    "fedtrimmedavg": _quietly(lambda: FedTrimmedAvg(fraction_evaluate=0.0, beta=0.2)),
}
PARTITIONS = ("iid", "dirichlet")
#: Ledger methods summed per client into totals.csv.
TOTALS = ("ads", "loo", "tracin_outflow", "tracin_inflow", "ads_defended", "loo_defended", "tracin_outflow_defended",
          "defence_free_rider")
#: The fixed-weight game's second-order book and its defended one, summed too when the study books them
#: (``fixed_second_order``); absent otherwise, so that totals.csv reads as before.
SECOND_ORDER_TOTALS = ("ads_fixed_second_order", "ads_fixed_second_order_defended")


def study_totals(config) -> tuple[str, ...]:
    """The ledger methods totals.csv sums for ``config``: :data:`TOTALS`, then :data:`SECOND_ORDER_TOTALS` when on."""
    return TOTALS + (SECOND_ORDER_TOTALS if config.fixed_second_order else ())


@dataclass(frozen=True)
class StudyRun:
    """One run: its data (partition scheme, seed), inner strategy and attack plan."""

    scheme: str
    strategy: str
    seed: int
    plan: RunPlan

    @property
    def key(self) -> str:
        """The run's name to the clients (train config ``data-key``): attack|scheme|seed|strategy."""
        return f"{self.plan.attack}|{self.scheme}|{self.seed}|{self.strategy}"

    @property
    def directory(self) -> str:
        """Where its books go (a ``module:callable`` attack's name with ``-`` for ``:``)."""
        return f"{self.scheme}-{self.strategy}-seed{self.seed}/{self.plan.attack.replace(':', '-')}"


@functools.lru_cache(maxsize=2)
def cached_dataset(name: str, split: str):
    return load_dataset(name, split=split) if name == "fashion-mnist" else load_dataset(name)


def _data_seeds(seed: int) -> list[np.random.SeedSequence]:
    """The seeds of the training pool, the held-out sample, the partition and the halves."""
    return np.random.SeedSequence([seed, 41]).spawn(4)


def holdout_rows(test_labels: np.ndarray, seed: int, holdout_examples: int) -> np.ndarray:
    """Fashion-MNIST: the test rows of the server's held-out set (all of them when ``holdout_examples`` is 0)."""
    if not holdout_examples:
        return np.arange(len(test_labels))
    return sample_per_class(test_labels, holdout_examples, seed=_data_seeds(seed)[1], name="holdout_examples")


@functools.lru_cache(maxsize=16)
def study_data(dataset: str, seed: int, num_clients: int, scheme: str, alpha: float, train_examples: int,
               holdout_examples: int, holdout_fraction: float):
    """(training pool, held-out set, per client (training rows, inference rows)), from the seed."""
    pool_seed, holdout_seed, partition_seed, halves_seed = _data_seeds(seed)
    if dataset == "fashion-mnist":
        pool, holdout = cached_dataset(dataset, "train"), cached_dataset(dataset, "test")
        if train_examples:
            pool = pool.subset(sample_per_class(pool.y, train_examples, seed=pool_seed, name="train_examples"))
        holdout = holdout.subset(holdout_rows(holdout.y, seed, holdout_examples))
    else:
        pool, holdout = split_holdout(cached_dataset(dataset, "all"), holdout_fraction, seed=holdout_seed)
    labels = pool.y if scheme == "dirichlet" else np.zeros(len(pool), dtype=np.int64)
    shares = partition(labels, num_clients, scheme=scheme, seed=partition_seed, alpha=alpha, min_partition_size=32)
    halves = np.random.default_rng(halves_seed)
    splits = []
    for share in shares:
        chosen = halves.permutation(share)
        splits.append((np.sort(chosen[: len(chosen) // 2]), np.sort(chosen[len(chosen) // 2:])))
    return pool, holdout, tuple(splits)


def data_of(config, run: StudyRun):
    return study_data(config.dataset, run.seed, config.num_clients, run.scheme, config.dirichlet_alpha,
                      config.train_examples, config.holdout_examples, config.holdout_fraction)


def model_factory(config) -> Callable:
    num_features, num_classes = (784, 10) if config.dataset == "fashion-mnist" else (64, 10)
    return functools.partial(make_linear_model, num_features, num_classes, seed=0)


def _owner(config, identity: int) -> int:
    """Whose data an identity holds: its own, or (an added Sybil identity) the attacker's."""
    return identity if identity < config.num_clients else config.attacker


def shard_rows(plan: RunPlan, identity: int, num_examples: int, seed) -> np.ndarray | None:
    """The rows of its owner's ``num_examples`` that a split's identity holds (None: all of them)."""
    if identity not in plan.identities or plan.kind not in ("sybil-split", "adaptive-split"):
        return None
    position = plan.identities.index(identity)
    if plan.kind == "sybil-split":
        return shard_indices(num_examples, position, plan.size, seed=seed)
    return overlapping_shard_indices(num_examples, position, plan.size, plan.margin, seed=seed)


def registered_sizes(config, run: StudyRun) -> dict[int, int]:
    """Each identity's true training size, as it registered it (a Sybil shard its shard's)."""
    _, _, splits = data_of(config, run)
    sizes = {}
    for identity in run.plan.participants:
        size = len(splits[_owner(config, identity)][0])
        rows = shard_rows(run.plan, identity, size, run.seed)
        sizes[identity] = size if rows is None else len(rows)
    return sizes


def attack_settings(config, seed: int) -> AttackSettings:
    """The attacks' own numbers of ``config`` in the run of ``seed``."""
    return AttackSettings(seed, config.noise_std, config.inflation, config.boost, config.replica_noise,
                          config.colluder_spread, config.honest_rounds, config.craft_budget, config.craft_steps,
                          config.norm_cap)


def study_client_data(partition_id: int, data_key: str | None = None, *, config_json: str,
                      config_type: type) -> ClientData:
    """Identity ``partition_id``'s data and behaviour in the run ``data_key`` names (Ray workers call
    it with the study's settings as JSON and the job's config class to read them into)."""
    config = saved_config(config_type, json.loads(config_json), strict=False)
    attack, scheme, seed, strategy = str(data_key).split("|")
    run = StudyRun(scheme, strategy, int(seed), plan_of(attack, config.num_clients, config.attacker, config.colluders))
    pool, _, splits = data_of(config, run)
    own, infer = splits[_owner(config, partition_id)]
    plan = run.plan
    rows = shard_rows(plan, partition_id, len(infer), [run.seed, 1])
    infer = infer if rows is None else infer[rows]
    source = splits[config.source if config.source < config.num_clients else config.attacker][0]  # replicator only
    settings = attack_settings(config, run.seed)
    behaviour = behaviour_of(plan, partition_id, settings, counts={c: len(splits[_owner(config, c)][0])
                                                                   for c in plan.participants},
                             model_factory=model_factory(config), source_data=(pool.x[source], pool.y[source]))
    return ClientData(partition_id, pool.x[own], pool.y[own], pool.x[infer], pool.y[infer], behaviour=behaviour)


def utility_of(config, run: StudyRun) -> TorchModelUtility:
    _, holdout, _ = data_of(config, run)
    return TorchModelUtility(model_factory(config)(), holdout.x, holdout.y, metric=config.utility)


def study_runs(config) -> list[StudyRun]:
    """Every run of the study, in the order they are made (grouped by participants later)."""
    return [StudyRun(scheme, strategy, seed, plan_of(attack, config.num_clients, config.attacker, config.colluders))
            for scheme in config.partitions for strategy in config.strategies
            for seed in range(config.seed, config.seed + config.seeds) for attack in config.attacks
            if attack != "group-split"]


def _strategy(config, run: StudyRun, out_dir, utility, nodes: NodeDirectory, run_config: dict) -> ValuingStrategy:
    plan = run.plan
    defences = DefenceSettings(norm_cap=config.norm_cap or None,
                               duplicate_median_fraction=config.duplicate_median_fraction or None) if config.defences else None
    return ValuingStrategy(
        STRATEGIES[run.strategy](), utility, run_dir=str(out_dir / run.directory),
        sampler=PartitionSampler(len(plan.participants), seed=run.seed), seed=run.seed,
        acceptance=RepresentativesOnly(defences) if config.defences == 2 else None,
        valuation=ValuationSettings(methods=("ads", "loo"), ads=AdsSettings(budget=config.valuation_budget)),
        books=BookSettings(flows=True, noisy_clients=set(plan.identities), defences=defences,
                           fixed_second_order=config.fixed_second_order),
        intake=IntakeSettings(claims=ClaimReview(registered=registered_sizes(config, run)), nodes=nodes,
                              query_data_key=True),
        run=RunSettings(run_config=run_config))


def study_run_config(config, run: StudyRun) -> dict:
    """run.json of one study run: enough for the audit to rebuild its utility, strategy and sampler."""
    return {"simulation": "attacks", "study": {"attack": run.plan.attack, "partition": run.scheme,
                                               "seed": run.seed, "strategy": run.strategy,
                                               "participants": list(run.plan.participants),
                                               "identities": list(run.plan.identities)},
            "claim_review": "registered sizes", **config.as_dict()}


def run_group(config, runs: list[StudyRun], out_dir, on_run) -> list[tuple[StudyRun, object]]:
    """The runs of one group (same participants count) on one engine; (run, loaded run dir) each."""
    done = []
    config_json = json.dumps(config.as_dict(), sort_keys=True)
    factory = model_factory(config)

    def main(grid: Grid) -> None:
        nodes = NodeDirectory()
        for run in runs:
            started = time.perf_counter()
            utility = utility_of(config, run)
            strategy = _strategy(config, run, out_dir, utility, nodes, study_run_config(config, run))
            initial = initial_model_arrays(functools.partial(factory.func, *factory.args, seed=run.seed), run.seed)
            with seeded_server_generators(run.seed):
                strategy.start(grid, initial, num_rounds=config.rounds, timeout=config.round_timeout,
                               train_config=ConfigRecord(train_config(
                                   learning_rate=config.learning_rate, local_epochs=config.local_epochs,
                                   seed=run.seed, data_key=run.key)))
            done.append((run, load_run(out_dir / run.directory)))
            if on_run is not None:
                on_run(f"{run.directory}: {config.rounds} rounds in {time.perf_counter() - started:.1f}s")

    loader = functools.partial(study_client_data, config_json=config_json, config_type=type(config))
    serve(make_client_app(loader, factory), main, num_supernodes=len(runs[0].plan.participants),
          engine=config.engine)
    return done


def run_frames(done: list[tuple[StudyRun, object]],
               methods: tuple[str, ...] = TOTALS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """totals.csv (a row per run and client, a column per ledger method of ``methods``: :func:`study_totals`) and
    runs.csv (a row per run) of the finished runs."""
    totals, runs = [], []
    for run, books in done:
        ledger = books.ledger[books.ledger["status"] == Status.OK]
        table = ledger[ledger["method"].isin(methods)].pivot_table(index="client_id", columns="method",
                                                                    values="value", aggfunc="sum")
        common = {"partition": run.scheme, "strategy": run.strategy, "seed": run.seed, "attack": run.plan.attack}
        for client, row in table.iterrows():
            role = "identity" if int(client) in run.plan.identities else "honest"
            totals.append({**common, "client_id": int(client), "role": role,
                           **{m: float(row.get(m, np.nan)) for m in methods}})
        clusters = ledger[(ledger["method"] == "defence_cluster") & (pd.to_numeric(ledger["value"]) > 1)]
        claims = books.ledger["method"].astype(str).str.startswith("claim_")
        runs.append({**common, "accuracy": float(books.rounds["utility_realized"].iloc[-1]),
                     "identities": " ".join(map(str, run.plan.identities)),
                     "seats": " ".join(map(str, run.plan.seats)),
                     "clustered_rows": int(len(clusters)), "claim_flags": int(claims.sum())})
    return pd.DataFrame(totals), pd.DataFrame(runs)
