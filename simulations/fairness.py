"""Fair books: who pushes the shared model toward unfair outcomes, and aggregating against it.

For each data set (:mod:`simulations.fair_data`: the Gaussian example of [FAIRINFL] §5 and
German credit with ``sex``), FedAvg trains a logistic model over ``num_clients`` clients
with different group and label mixes, ``clients_per_round`` sampled per round (the same
seeded sample in every run). Every run books, per round and client, ADS and LOO on accuracy,
``ads_fairness`` / ``loo_fairness`` (the round game with U = −relaxed gap) and the first-order
``fairness_influence`` I^F_t(u) = ∇F(A_{t−1})·(p_u Δ_u) ([FAIRIJ] Eq. 6 at client level). The
runs differ in what the server aggregates:

* ``fedavg``: every reply;
* ``drop-k``: all but the K replies with the largest positive fairness influence
  ([FAIRIJ] Prop. 3.1), K in ``drops``;
* ``random``: all but K random replies (the baseline of [FAIRINFL] §6.1), K in ``drops``;
* ``ijack``: every reply, weights n_u·max(0, 1 − λ I^F_t(u)) normalized ([FAIRIJ] Prop. 3.2),
  λ in ``lams``.

Outputs in ``--out``: ``per_round.csv`` (accuracy and hard DP/EOP/EO gaps of every realized
state on the held-out rows, round 0 = A_0), ``tradeoff.csv`` (per rule: accuracy and DP gap
averaged over the last ``tail`` rounds and over ``seeds`` repetitions, and the accuracy cost
and gap reduction against FedAvg), ``comparison.csv`` (drop-K against dropping K random clients, per K),
``clients.csv`` (the FedAvg run's per-client totals beside each client's group and label
mix), ``fairness.png`` (DP gap and accuracy per round, and the trade-off over K and λ in the
style of [FAIRINFL] Figure 2), and every run's ledger under ``DATASET/seed-S/RUN/`` (``fedvalue
report`` and ``fedvalue audit`` read them). One Flower engine (Ray) per data set serves every
run of it; they share one :class:`strategies.nodes.NodeDirectory` (nodes are asked their
partition ids once) and write no checkpoints (the simulation is not resumed; the round
records the audit recomputes from are kept).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from flwr.app import ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from clients.app import ClientData, make_client_app
from fedvalue.fairness import GAPS, GroupFairness
from fedvalue.ledger import load_run, write_json
from fedvalue.schema import RUN_CONFIG_FILE
from fedvalue.utilities import TorchModelUtility
from simulations.api import package_versions
from simulations.augmentation import prepare_out
from simulations.engine import serve
from simulations.fair_data import DATASETS, FairFederation, build_federation
from simulations.models import make_linear_model
from fedvalue._checks import check_choice
from simulations.settings import check_integers, check_numbers
from strategies import AcceptAll, FairDropK, FairReweight, PartitionSampler, TopK, ValuingStrategy
from strategies.nodes import NodeDirectory
from strategies.protocol import train_config
from strategies.records import arrays_to_numpy, initial_arrays

POLICIES = ("fedavg", "drop-k", "random", "ijack")
#: Torch threads of the server process (valuation forward passes) while the runs go.
SERVER_TORCH_THREADS = 1


@dataclass(frozen=True)
class FairnessConfig:
    seed: int = 0
    seeds: int = 5
    datasets: tuple[str, ...] = DATASETS
    num_clients: int = 20
    clients_per_round: int = 8
    rounds: int = 8
    local_epochs: int = 10
    learning_rate: float = 0.5
    concentration: float = 0.5
    examples_per_client: int = 40
    gap: str = "dp"
    drops: tuple[int, ...] = (1, 2)
    lams: tuple[float, ...] = (10.0, 30.0, 60.0, 100.0)
    tail: int = 3
    round_timeout: float = 600.0
    num_cpus_per_client: float = 1
    max_parallel_clients: int = 0
    ray_address: str = ""

    def check(self) -> None:
        check_integers(self, ("seeds", "num_clients", "clients_per_round", "rounds", "local_epochs",
                              "examples_per_client", "tail"))
        check_integers(self, ("seed", "max_parallel_clients"), minimum=0)
        check_numbers(self, ("learning_rate", "concentration", "round_timeout", "num_cpus_per_client"))
        if not self.datasets or any(d not in DATASETS for d in self.datasets) or len(set(self.datasets)) != len(
                self.datasets):
            raise ValueError(f"datasets: expected distinct names among {list(DATASETS)}; got {list(self.datasets)}.")
        check_choice("gap", self.gap, GAPS)
        if self.clients_per_round > self.num_clients:
            raise ValueError(f"clients_per_round: expected at most num_clients ({self.num_clients}); got "
                             f"{self.clients_per_round}.")
        if any(isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < self.clients_per_round
               for k in self.drops):
            raise ValueError(f"drops: expected integers in [1, clients_per_round - 1 = {self.clients_per_round - 1}]; "
                             f"got {list(self.drops)}.")
        bad_lam = [v for v in self.lams if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0]
        if bad_lam:
            raise ValueError(f"lams: expected numbers > 0; got {list(self.lams)}.")
        if self.tail > self.rounds:
            raise ValueError(f"tail: expected at most rounds ({self.rounds}); got {self.tail}.")


HELP = {
    "seeds": "repetitions with seeds seed, seed+1, ... (data, initial model, sampling, random drops)",
    "datasets": "comma-separated among gaussian, german",
    "drops": "numbers of clients dropped per round by drop-k and random, comma-separated",
    "lams": "I-JACK strengths λ, comma-separated (w_u = max(0, 1 − λ·influence))",
    "tail": "final rounds averaged in tradeoff.csv",
    "gap": "fairness gap the influences and the fairness utility use: dp, eop, eo",
    "concentration": "Dirichlet concentration of the clients' group and label mixes",
}


# -------------------------------------------------------------------------- federation


@functools.lru_cache(maxsize=4)
def federation(dataset: str, num_clients: int, concentration: float, seed: int,
               examples_per_client: int) -> FairFederation:
    return build_federation(dataset, num_clients=num_clients, concentration=concentration, seed=seed,
                            examples_per_client=examples_per_client)


def _federation_of(config: dict, dataset: str) -> FairFederation:
    return federation(dataset, int(config["num_clients"]), float(config["concentration"]), int(config["seed"]),
                      int(config["examples_per_client"]))


def fair_client_data(partition_id: int, data_key: str | None = None, *, dataset: str, config_json: str) -> ClientData:
    """Client ``partition_id`` of the federation of ``dataset`` with the seed ``data_key``
    (default: the config's), picklable for Ray."""
    config = json.loads(config_json)
    if data_key is not None:
        config["seed"] = int(data_key)
    return _federation_of(config, dataset).client_data(partition_id)


def model_factory(num_features: int, seed: int) -> torch.nn.Module:
    return make_linear_model(num_features, 2, seed=seed)


def utility_from_run(run_config: dict) -> TorchModelUtility:
    """The accuracy utility a run was valued with, rebuilt from its run.json."""
    data = _federation_of(run_config, run_config["dataset"])
    return TorchModelUtility(model_factory(data.num_features, run_config["seed"]), data.x_test, data.y_test)


def fairness_from_run(run_config: dict) -> GroupFairness:
    """The fairness objective a run was booked with, rebuilt from its run.json."""
    data = _federation_of(run_config, run_config["dataset"])
    return GroupFairness(model_factory(data.num_features, run_config["seed"]), data.x_test, data.y_test,
                         data.z_test, gap=run_config["gap"])


def audit_from_run(run_config: dict) -> dict:
    """What the audit recomputes a run's books with: its accuracy utility and fairness objective."""
    return {"utility": utility_from_run(run_config), "fairness": fairness_from_run(run_config)}


def policies(config: FairnessConfig) -> list[tuple[str, float, object]]:
    """(policy, parameter, acceptance) of every run of a data set."""
    runs: list[tuple[str, float, object]] = [("fedavg", 0, AcceptAll())]
    runs += [("drop-k", k, FairDropK(k)) for k in config.drops]
    runs += [("random", k, TopK(config.clients_per_round - k, score="random")) for k in config.drops]
    runs += [("ijack", float(lam), FairReweight(float(lam))) for lam in config.lams]
    return runs


def run_name(policy: str, parameter: float) -> str:
    return policy if policy == "fedavg" else f"{policy}-{parameter:g}"


# -------------------------------------------------------------------------- runs


def run_fairness(config: FairnessConfig, out: str | Path, *, overwrite: bool = False,
                 say: Callable[[str], None] | None = None) -> dict[str, pd.DataFrame]:
    """Every run of every data set on one engine; writes and returns the tables (module docstring)."""
    config.check()
    settings = dataclasses.asdict(config)
    for dataset in config.datasets:  # bad data surfaces before the engine starts
        _federation_of(settings, dataset)
    out_dir = prepare_out(out, overwrite)
    write_json(out_dir / RUN_CONFIG_FILE, {"simulation": "fairness-study", **settings, "versions": package_versions()})
    per_round: list[dict] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(SERVER_TORCH_THREADS)
    try:
        for dataset in config.datasets:  # one engine per data set: the model's input width differs
            _serve_dataset(config, settings, dataset, out_dir, per_round, say)
    finally:
        torch.set_num_threads(threads)
    return write_outputs(out_dir, config, pd.DataFrame(per_round))


def _serve_dataset(config: FairnessConfig, settings: dict, dataset: str, out_dir: Path, per_round: list[dict],
                   say: Callable[[str], None] | None) -> None:
    """Every run of one data set and every seed, one after another on one engine; per-round
    metrics to ``per_round``. Ledgers go to ``DATASET/seed-S/RUN``."""
    seeds = range(config.seed, config.seed + config.seeds)
    width = _federation_of(settings, dataset).num_features

    def main(grid: Grid) -> None:
        nodes = NodeDirectory()  # one engine: each node is asked its partition id once, not once per run
        for seed in seeds:
            run_config = {"simulation": "fairness", "dataset": dataset, **{
                k: settings[k] for k in ("num_clients", "concentration", "examples_per_client", "gap")}, "seed": seed}
            utility, objective = utility_from_run(run_config), fairness_from_run(run_config)
            initial = initial_arrays(model_factory(width, seed))
            record = ConfigRecord(train_config(learning_rate=config.learning_rate, local_epochs=config.local_epochs,
                                               seed=seed, data_key=str(seed)))
            for policy, parameter, acceptance in policies(config):
                name = run_name(policy, parameter)

                def evaluate(server_round: int, arrays, policy=policy, parameter=parameter, seed=seed) -> MetricRecord:
                    metrics = objective.metrics(arrays_to_numpy(arrays))
                    per_round.append({"dataset": dataset, "seed": seed, "policy": policy, "parameter": parameter,
                                      "round": server_round, **metrics})
                    return MetricRecord({k: float(v) for k, v in metrics.items()})

                strategy = ValuingStrategy(
                    FedAvg(fraction_evaluate=0.0), utility, run_dir=str(out_dir / dataset / f"seed-{seed}" / name),
                    methods=("ads", "loo"), sampler=PartitionSampler(config.clients_per_round, seed=seed),
                    seed=seed, acceptance=acceptance, fairness=objective, nodes=nodes, checkpoint=False,
                    run_config={**run_config, "policy": policy, "parameter": parameter})
                strategy.start(grid, initial, num_rounds=config.rounds, timeout=config.round_timeout,
                               train_config=record, evaluate_fn=evaluate)
                if say is not None:
                    final = per_round[-1]
                    say(f"{dataset} seed {seed} {name}: accuracy {final['accuracy']:.3f}, DP gap {final['dp_gap']:.3f}")

    loader = functools.partial(fair_client_data, dataset=dataset, config_json=json.dumps(settings, sort_keys=True))
    # Every seed's model has the same shape (the inputs' width does not depend on the seed).
    serve(make_client_app(loader, functools.partial(model_factory, width, config.seed)), main,
          num_supernodes=config.num_clients, num_cpus_per_client=config.num_cpus_per_client,
          max_parallel_clients=config.max_parallel_clients or None, ray_address=config.ray_address or None)


# -------------------------------------------------------------------------- outputs


def tradeoff(per_round: pd.DataFrame, tail: int) -> pd.DataFrame:
    """Per data set and rule: accuracy and gaps averaged over the last ``tail`` rounds and over
    seeds; accuracy cost and DP-gap reduction against FedAvg (the same seeds), and the
    standard error of the DP gap over seeds."""
    last = per_round[per_round["round"] > per_round["round"].max() - tail]
    columns = ["accuracy", "dp_gap", "eop_gap", "eo_gap"]
    runs = last.groupby(["dataset", "seed", "policy", "parameter"], sort=False)[columns].mean().reset_index()
    keys = ["dataset", "policy", "parameter"]
    table = runs.groupby(keys, sort=False)[columns].mean().reset_index()
    spread = runs.groupby(keys, sort=False)["dp_gap"].agg(lambda v: float(v.std(ddof=1) / np.sqrt(len(v)))
                                                          if len(v) > 1 else float("nan"))
    table["dp_gap_stderr"] = spread.to_numpy()
    table["seeds"] = runs.groupby(keys, sort=False).size().to_numpy()
    base = table[table["policy"] == "fedavg"].set_index("dataset")
    table["accuracy_cost"] = table["dataset"].map(base["accuracy"]) - table["accuracy"]
    table["dp_gap_reduction"] = table["dataset"].map(base["dp_gap"]) - table["dp_gap"]
    return table


def comparison(table: pd.DataFrame) -> pd.DataFrame:
    """Per data set and K: drop-K by fairness influence against dropping K random clients.

    ``fair_dominates``: drop-K leaves a smaller DP gap at no larger accuracy cost."""
    rows = []
    for dataset, group in table.groupby("dataset", sort=False):
        fair = group[group["policy"] == "drop-k"].set_index("parameter")
        rand = group[group["policy"] == "random"].set_index("parameter")
        for k in fair.index:
            rows.append({
                "dataset": dataset, "k": int(k),
                "drop_k_dp_gap": fair.at[k, "dp_gap"], "random_dp_gap": rand.at[k, "dp_gap"],
                "drop_k_accuracy_cost": fair.at[k, "accuracy_cost"],
                "random_accuracy_cost": rand.at[k, "accuracy_cost"],
                "fair_dominates": bool(fair.at[k, "dp_gap"] < rand.at[k, "dp_gap"]
                                       and fair.at[k, "accuracy_cost"] <= rand.at[k, "accuracy_cost"]),
            })
    return pd.DataFrame(rows)


def client_table(out_dir: Path, config: FairnessConfig) -> pd.DataFrame:
    """The first seed's FedAvg run: per-client totals beside each client's group and label mix."""
    frames = []
    settings = dataclasses.asdict(config)
    for dataset in config.datasets:
        summary = load_run(out_dir / dataset / f"seed-{config.seed}" / "fedavg").summary().reset_index()
        summary["client"] = summary["client_id"].astype(int)
        mixes = _federation_of(settings, dataset).mixes()
        merged = mixes.merge(summary.drop(columns=["client_id"]), on="client", how="left")
        merged.insert(0, "dataset", dataset)
        frames.append(merged)
    return pd.concat(frames, ignore_index=True)


def plot(per_round: pd.DataFrame, table: pd.DataFrame, config: FairnessConfig, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(config.datasets)
    figure, axes = plt.subplots(len(datasets), 3, figsize=(15, 4.2 * len(datasets)), squeeze=False)
    k = config.drops[len(config.drops) // 2]
    lam = config.lams[len(config.lams) // 2]
    shown = [("fedavg", 0, "FedAvg"), ("drop-k", k, f"drop-K (K={k})"), ("random", k, f"random drop (K={k})"),
             ("ijack", float(lam), f"I-JACK (λ={lam:g})")]
    colors = {"fedavg": "black", "drop-k": "tab:blue", "random": "tab:gray", "ijack": "tab:orange"}
    for row, dataset in enumerate(datasets):
        runs = per_round[per_round["dataset"] == dataset].groupby(
            ["policy", "parameter", "round"], sort=False)[["dp_gap", "accuracy"]].mean().reset_index()
        for column, metric in enumerate(("dp_gap", "accuracy")):
            ax = axes[row][column]
            for policy, parameter, label in shown:
                line = runs[(runs["policy"] == policy) & (runs["parameter"] == parameter)]
                ax.plot(line["round"], line[metric], marker="o", ms=3, label=label, color=colors[policy])
            ax.set_xlabel(f"round (mean over {config.seeds} seed{'s' if config.seeds > 1 else ''})")
            ax.set_ylabel("DP gap (held-out)" if metric == "dp_gap" else "accuracy (held-out)")
            ax.set_title(f"{dataset}: {'DP gap' if metric == 'dp_gap' else 'accuracy'} per round")
            ax.legend(fontsize=8)
        ax = axes[row][2]
        points = table[table["dataset"] == dataset]
        for policy in POLICIES:
            chosen = points[points["policy"] == policy]
            ax.plot(chosen["dp_gap"], chosen["accuracy"], marker="o", color=colors[policy],
                    linestyle="-" if policy != "fedavg" else "none", label=policy)
            for _, r in chosen.iterrows():
                if policy != "fedavg":
                    symbol = "λ" if policy == "ijack" else "K"
                    ax.annotate(f"{symbol}={r['parameter']:g}", (r["dp_gap"], r["accuracy"]), fontsize=7,
                                xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(f"DP gap (mean of last {config.tail} rounds)")
        ax.set_ylabel("accuracy")
        ax.set_title(f"{dataset}: accuracy–fairness trade-off")
        ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_outputs(out_dir: Path, config: FairnessConfig, per_round: pd.DataFrame) -> dict[str, pd.DataFrame]:
    per_round = per_round.sort_values(["dataset", "seed", "policy", "parameter", "round"], kind="mergesort")
    table = tradeoff(per_round, config.tail)
    versus = comparison(table)
    clients = client_table(out_dir, config)
    per_round.to_csv(out_dir / "per_round.csv", index=False)
    table.to_csv(out_dir / "tradeoff.csv", index=False)
    versus.to_csv(out_dir / "comparison.csv", index=False)
    clients.to_csv(out_dir / "clients.csv", index=False)
    plot(per_round, table, config, out_dir / "fairness.png")
    return {"per_round": per_round, "tradeoff": table, "comparison": versus, "clients": clients}


def cli_main(config: FairnessConfig, options) -> int:
    """``fedvalue run fairness``: every run, the tables and the figure."""
    tables = run_fairness(config, options.out, overwrite=options.overwrite, say=options.say())
    with pd.option_context("display.width", 160, "display.max_columns", None):
        print(tables["tradeoff"].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        print(tables["comparison"].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"done in {options.elapsed():.1f}s; tables, figure and ledgers in {options.out}")
    return 0
