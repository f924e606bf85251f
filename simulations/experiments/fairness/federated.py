"""Fair books: who pushes the shared model toward unfair outcomes, and aggregating against it.

For each data set (:mod:`simulations.experiments.fairness.data`: the Gaussian example of [FAIRINFL] §5,
SLID standing in for Adult (the default pair) and German credit with ``sex``), FedAvg trains a logistic model over ``num_clients`` clients
with different group and label mixes, ``clients_per_round`` sampled per round (the same
seeded sample in every run). This is the project's federated extension of [FAIRIJ], not a
protocol of either paper.

**Decide on one split, report on another.** Each seed splits the held-out rows in two
halves: the *decide* half is the data of every book and every rule (the accuracy utility,
the fairness objective F, its gradient); the *report* half only measures the realized
states (``per_round.csv`` and every table).

Every run books, per round and client, ADS and LOO on accuracy, ``ads_fairness`` /
``loo_fairness`` (the round game with U = −relaxed gap), the first-order
``fairness_influence`` I^F_t(u) = ∇F(A_{t−1})·(p_u Δ_u), and, from the clients' training loss
gradients and Fisher diagonals at A_{t−1}, ``fairness_influence_curvature`` I^H_t(u) =
−∇Fᵀ(D + δI)⁻¹G_u ([FAIRIJ] Eq. 6 at client level, App. A's damped diagonal Fisher, δ =
``damping``) and its FedAvg-renormalized derivative ``fairness_weight_derivative``
(:mod:`fedvalue.scoring.fairness.curvature`). The runs differ in what the server aggregates:

* ``fedavg``: every reply;
* ``drop-k``: all but the K replies with the largest positive first-order influence I^F
  ([FAIRIJ] Prop. 3.1 at client level, K fixed), K in ``drops``;
* ``drop-k-renormalized``: the same by the renormalized derivative I^F(u) − p_u Σ_v I^F(v);
* ``drop-k-curvature``: the same by the renormalized curvature derivative;
* ``drop-k-exact``: the same by the exact drop effect −loo_fairness (the reference);
* ``random``: all but K random replies (the baseline of [FAIRINFL] §6.1), K in ``drops``;
* ``ijack``: every reply, weights n_u·max(0, 1 − λ I^F_t(u)) normalized ([FAIRIJ] Prop. 3.2),
  λ in ``lams``.

Outputs in ``--out`` (all metrics on the report half): ``per_round.csv`` (accuracy and hard
DP/EOP/EO gaps of every realized state, round 0 = A_0, and the majority-class accuracy),
``tradeoff.csv`` (per rule: each metric averaged over the last ``tail`` rounds, mean over
``seeds`` with Student-t intervals at ``confidence``, and the paired accuracy cost and DP-gap
reduction against FedAvg), ``comparison.csv`` (every rule against dropping K random clients,
paired by seed, and whether it beats random at equal accuracy cost:
:func:`simulations.experiments.fairness.tables.against_random`), ``scoring.csv`` (each first-order score
against the exact drop effect over the FedAvg runs' rounds:
:func:`simulations.experiments.fairness.tables.scoring`),
``clients.csv`` (the FedAvg run's per-client totals beside each client's group and label
mix), ``fairness.png`` (DP gap and accuracy per round, and the trade-off over K and λ in the
style of [FAIRINFL] Figure 2), and every run's ledger under ``DATASET/seed-S/RUN/`` (``fedvalue
report`` and ``fedvalue audit`` read them). ``--results FOLDER`` writes the tradeoff, comparison and scoring
tables again as the docs' results files (:mod:`simulations.experiments.fairness.markdown`). One Flower engine
(Ray) per data set serves every run of it; they share one :class:`strategies.intake.nodes.NodeDirectory` (nodes are asked their
partition ids once) and write no checkpoints (the simulation is not resumed; the round
records the audit recomputes from are kept).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from flwr.app import ConfigRecord, MetricRecord
from flwr.serverapp import Grid

from clients import ClientData, make_client_app
from fedvalue.ledger import load_run
from fedvalue.utilities import GAPS, GroupFairness, TorchModelUtility
from simulations.datasets import make_linear_model
from simulations.experiments.fairness import tables as fairness_tables
from simulations.experiments.fairness.data import DATASETS, FairFederation, build_federation
from simulations.experiments.fairness.markdown import FEDERATED_RESULTS
from simulations.runner import (
    EngineSettings,
    Simulation,
    check_choice,
    check_engine_keys,
    check_integers,
    check_numbers,
    fedavg_without_evaluation,
    flat_settings,
    package_versions,
    prepare_run_dir,
    serve,
    torch_threads,
    write_results,
    write_run_config,
)
from strategies import (
    AcceptAll,
    BookSettings,
    FairDropK,
    FairReweight,
    IntakeSettings,
    NodeDirectory,
    PartitionSampler,
    RunSettings,
    TopK,
    ValuationSettings,
    ValuingStrategy,
    arrays_to_numpy,
    initial_arrays,
    train_config,
)

POLICIES = ("fedavg", "drop-k", "drop-k-renormalized", "drop-k-curvature", "drop-k-exact", "random", "ijack")
#: The score each drop rule acts on (fedvalue.scoring.fairness.curvature.SCORES).
DROP_SCORES = {"drop-k": "first-order", "drop-k-renormalized": "renormalized", "drop-k-curvature": "curvature",
               "drop-k-exact": "exact"}
#: Torch threads of the server process (valuation forward passes) while the runs go.
SERVER_TORCH_THREADS = 1


@dataclass(frozen=True)
class FairnessConfig:
    seed: int = 0
    seeds: int = 10
    datasets: tuple[str, ...] = ("gaussian", "slid")
    policies: tuple[str, ...] = POLICIES
    num_clients: int = 20
    clients_per_round: int = 8
    rounds: int = 20
    local_epochs: int = 10
    learning_rate: float = 0.5
    concentration: float = 0.5
    examples_per_client: int = 40
    gap: str = "dp"
    drops: tuple[int, ...] = (1, 2)
    lams: tuple[float, ...] = (10.0, 30.0, 60.0, 100.0)
    tail: int = 5
    damping: float = 1.0
    confidence: float = 0.95
    round_timeout: float = 600.0
    # num_cpus_per_client 1, not 1.0: run.json has always written the int, and its bytes start the hash chain.
    engine: EngineSettings = EngineSettings(num_cpus_per_client=1)

    #: The engine settings this job takes (CPUs only), flat in run.json and on the command line.
    ENGINE_KEYS: ClassVar[tuple[str, ...]] = ("num_cpus_per_client", "max_parallel_clients", "ray_address")

    def check(self) -> None:
        check_integers(self, ("seeds", "num_clients", "clients_per_round", "rounds", "local_epochs",
                              "examples_per_client", "tail"))
        check_integers(self, ("seed",), minimum=0)
        check_engine_keys(self)
        check_numbers(self, ("learning_rate", "concentration", "round_timeout", "damping"))
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence: expected a number in the open interval (0, 1); got {self.confidence!r}.")
        if (not self.policies or "fedavg" not in self.policies or any(p not in POLICIES for p in self.policies)
                or len(set(self.policies)) != len(self.policies)):
            raise ValueError(f"policies: expected distinct names among {list(POLICIES)}, fedavg among them; got "
                             f"{list(self.policies)}.")
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
    "datasets": "comma-separated among gaussian, german, slid",
    "drops": "numbers of clients dropped per round by drop-k and random, comma-separated",
    "lams": "I-JACK strengths λ, comma-separated (w_u = max(0, 1 − λ·influence))",
    "tail": "final rounds averaged in tradeoff.csv",
    "policies": "comma-separated rules among " + ", ".join(POLICIES) + " (fedavg always)",
    "damping": "δ added to the summed client Fisher diagonals of the curvature influence ([FAIRIJ] App. A)",
    "confidence": "level of the Student-t intervals over seeds",
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


def held_out_halves(num_rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of the decide half and the report half of ``num_rows`` held-out rows (seeded)."""
    order = np.random.default_rng([seed, 31]).permutation(num_rows)
    half = num_rows // 2
    return np.sort(order[:half]), np.sort(order[half:])


def _split_of(run_config: dict, split: str) -> tuple[FairFederation, np.ndarray]:
    data = _federation_of(run_config, run_config["dataset"])
    decide, report = held_out_halves(len(data.y_test), int(run_config["seed"]))
    return data, decide if split == "decide" else report


def utility_from_run(run_config: dict) -> TorchModelUtility:
    """The accuracy utility a run was valued with (the decide half), rebuilt from its run.json."""
    data, rows = _split_of(run_config, "decide")
    return TorchModelUtility(model_factory(data.num_features, run_config["seed"]), data.x_test[rows], data.y_test[rows])


def fairness_from_run(run_config: dict, split: str = "decide") -> GroupFairness:
    """The fairness objective a run was booked with (the decide half), rebuilt from its
    run.json; ``split="report"``: the same gap on the report half (what the tables measure)."""
    data, rows = _split_of(run_config, split)
    return GroupFairness(model_factory(data.num_features, run_config["seed"]), data.x_test[rows], data.y_test[rows],
                         data.z_test[rows], gap=run_config["gap"])


def audit_from_run(run_config: dict) -> dict:
    """What the audit recomputes a run's books with: its accuracy utility and fairness objective."""
    return {"utility": utility_from_run(run_config), "fairness": fairness_from_run(run_config)}


def policies(config: FairnessConfig) -> list[tuple[str, float, object]]:
    """(policy, parameter, acceptance) of every run of a data set."""
    runs: list[tuple[str, float, object]] = [("fedavg", 0, AcceptAll())]
    for policy in POLICIES[1:]:
        if policy not in config.policies:
            continue
        if policy in DROP_SCORES:
            runs += [(policy, k, FairDropK(k, score=DROP_SCORES[policy])) for k in config.drops]
        elif policy == "random":
            runs += [("random", k, TopK(config.clients_per_round - k, score="random")) for k in config.drops]
        else:
            runs += [("ijack", float(lam), FairReweight(float(lam))) for lam in config.lams]
    return runs


def run_name(policy: str, parameter: float) -> str:
    return policy if policy == "fedavg" else f"{policy}-{parameter:g}"


# -------------------------------------------------------------------------- runs


def run_fairness(config: FairnessConfig, out: str | Path, *, overwrite: bool = False,
                 say: Callable[[str], None] | None = None) -> dict[str, pd.DataFrame]:
    """Every run of every data set on one engine; writes and returns the tables (module docstring)."""
    config.check()
    settings = flat_settings(config)
    for dataset in config.datasets:  # bad data surfaces before the engine starts
        _federation_of(settings, dataset)
    out_dir = prepare_run_dir(out, overwrite=overwrite)
    write_run_config(out_dir, {"simulation": "fairness-study", **settings, "versions": package_versions()})
    per_round: list[dict] = []
    with torch_threads(SERVER_TORCH_THREADS):
        for dataset in config.datasets:  # one engine per data set: the model's input width differs
            _serve_dataset(config, settings, dataset, out_dir, per_round, say)
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
            report = fairness_from_run(run_config, "report")
            majority = float(max(report.y.double().mean(), 1 - report.y.double().mean()))
            initial = initial_arrays(model_factory(width, seed))
            record = ConfigRecord(train_config(learning_rate=config.learning_rate, local_epochs=config.local_epochs,
                                               seed=seed, data_key=str(seed)))
            for policy, parameter, acceptance in policies(config):
                name = run_name(policy, parameter)

                def evaluate(server_round: int, arrays, policy=policy, parameter=parameter, seed=seed) -> MetricRecord:
                    metrics = report.metrics(arrays_to_numpy(arrays))
                    per_round.append({"dataset": dataset, "seed": seed, "policy": policy, "parameter": parameter,
                                      "round": server_round, **metrics, "majority_accuracy": majority})
                    return MetricRecord({k: float(v) for k, v in metrics.items()})

                strategy = ValuingStrategy(
                    fedavg_without_evaluation(), utility, run_dir=str(out_dir / dataset / f"seed-{seed}" / name),
                    sampler=PartitionSampler(config.clients_per_round, seed=seed), acceptance=acceptance, seed=seed,
                    valuation=ValuationSettings(methods=("ads", "loo")),
                    books=BookSettings(fairness=objective, fair_curvature=config.damping),
                    intake=IntakeSettings(nodes=nodes),
                    run=RunSettings(run_config={**run_config, "policy": policy, "parameter": parameter},
                                    checkpoint=False))
                strategy.start(grid, initial, num_rounds=config.rounds, timeout=config.round_timeout,
                               train_config=record, evaluate_fn=evaluate)
                if say is not None:
                    final = per_round[-1]
                    say(f"{dataset} seed {seed} {name}: accuracy {final['accuracy']:.3f}, DP gap {final['dp_gap']:.3f}")

    loader = functools.partial(fair_client_data, dataset=dataset, config_json=json.dumps(settings, sort_keys=True))
    # Every seed's model has the same shape (the inputs' width does not depend on the seed).
    serve(make_client_app(loader, functools.partial(model_factory, width, config.seed)), main,
          num_supernodes=config.num_clients, engine=config.engine)


# -------------------------------------------------------------------------- outputs


def client_table(out_dir: Path, config: FairnessConfig) -> pd.DataFrame:
    """The first seed's FedAvg run: per-client totals beside each client's group and label mix."""
    frames = []
    settings = flat_settings(config)
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
    shown = [("fedavg", 0, "FedAvg")] + [(p, k, f"{p} (K={k})") for p in (*DROP_SCORES, "random")
                                         if p in config.policies]
    shown += [("ijack", float(lam), f"I-JACK (λ={lam:g})")] if "ijack" in config.policies else []
    colors = {"fedavg": "black", "drop-k": "tab:blue", "drop-k-renormalized": "tab:cyan",
              "drop-k-curvature": "tab:purple", "drop-k-exact": "tab:green", "random": "tab:gray",
              "ijack": "tab:orange"}
    for row, dataset in enumerate(datasets):
        runs = per_round[per_round["dataset"] == dataset].groupby(
            ["policy", "parameter", "round"], sort=False)[["dp_gap", "accuracy"]].mean().reset_index()
        for column, metric in enumerate(("dp_gap", "accuracy")):
            ax = axes[row][column]
            for policy, parameter, label in shown:
                line = runs[(runs["policy"] == policy) & (runs["parameter"] == parameter)]
                ax.plot(line["round"], line[metric], marker="o", ms=3, label=label, color=colors[policy])
            ax.set_xlabel(f"round (mean over {config.seeds} seed{'s' if config.seeds > 1 else ''})")
            ax.set_ylabel("DP gap (report half)" if metric == "dp_gap" else "accuracy (report half)")
            ax.set_title(f"{dataset}: {'DP gap' if metric == 'dp_gap' else 'accuracy'} per round")
            ax.legend(fontsize=8)
        ax = axes[row][2]
        points = table[table["dataset"] == dataset]
        for policy in config.policies:
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
    table = fairness_tables.tradeoff(per_round, config.tail, config.confidence)
    versus = fairness_tables.against_random(per_round, config.tail, config.confidence)
    fedavg_runs = {(d, s): out_dir / d / f"seed-{s}" / "fedavg" for d in config.datasets
                   for s in range(config.seed, config.seed + config.seeds)}
    scored = fairness_tables.scoring(fedavg_runs, config.confidence)
    clients = client_table(out_dir, config)
    per_round.to_csv(out_dir / "per_round.csv", index=False)
    table.to_csv(out_dir / "tradeoff.csv", index=False)
    versus.to_csv(out_dir / "comparison.csv", index=False)
    scored.to_csv(out_dir / "scoring.csv", index=False)
    clients.to_csv(out_dir / "clients.csv", index=False)
    plot(per_round, table, config, out_dir / "fairness.png")
    return {"per_round": per_round, "tradeoff": table, "comparison": versus, "scoring": scored, "clients": clients}


def _with_interval(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``columns`` as "mean [low, high]" text (what the console prints)."""
    shown = frame.copy()
    for column in columns:
        shown[column] = [f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]" for m, lo, hi in
                         zip(frame[column], frame[f"{column}_low"], frame[f"{column}_high"])]
        shown = shown.drop(columns=[f"{column}_low", f"{column}_high"])
    return shown


def cli_main(config: FairnessConfig, options) -> int:
    """``fedvalue run fairness``: every run, the tables and the figure; prints the comparison."""
    tables = run_fairness(config, options.out, overwrite=options.overwrite, say=options.say())
    level = f"{config.confidence:.0%}"
    with pd.option_context("display.width", 250, "display.max_columns", None, "display.max_colwidth", 40):
        table = tables["tradeoff"]
        print(f"Rules on the report half, last {config.tail} rounds, mean and {level} interval over {config.seeds} "
              f"seeds (majority-class accuracy {tables['per_round'].groupby('dataset')['majority_accuracy'].first().round(3).to_dict()}):")
        metrics = ["accuracy", "dp_gap", "eop_gap", "eo_gap"]
        print(_with_interval(table, metrics)[["dataset", "policy", "parameter", *metrics]].to_string(index=False))
        print(f"\nEach rule minus random drops of K clients, paired by seed ({level} intervals):")
        versus = tables["comparison"]
        if len(versus):
            shown = _with_interval(versus, [f"{m}_diff" for m in metrics])
            print(shown[["dataset", "policy", "parameter", "random_k", *[f"{m}_diff" for m in metrics],
                         "beats_random_dp", "beats_random_eop", "beats_random_eo"]].to_string(index=False))
            for line in fairness_tables.verdicts(versus):
                print(line)
        print(f"\nFirst-order scores against the exact drop effect (FedAvg runs, {level} intervals over seeds):")
        scored = tables["scoring"]
        print(_with_interval(scored, ["correlation", "top_is_best", "top_raises_gap"])[
            ["dataset", "score", "correlation", "top_is_best", "top_raises_gap"]].to_string(index=False))
    if options.results:
        written = write_results(options.results, {name: tables[key] for name, key in FEDERATED_RESULTS.items()},
                                options.command)
        print(f"results files: {', '.join(map(str, written))}")
    print(f"done in {options.elapsed():.1f}s; tables, figure and ledgers in {options.out}")
    return 0


#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("fairness", FairnessConfig, cli_main, utility_from_run=utility_from_run,
                        audit_from_run=audit_from_run, help=HELP, results=tuple(FEDERATED_RESULTS))
