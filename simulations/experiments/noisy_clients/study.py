"""The [ADS] federated study (§6.2, App. C.2, Figure 4) over many seeds, on one engine.

For every seed: the ``noisy-clients`` run is scored (within-round ADS and LOO), then
retrained from the same initial model keeping only each round's top k by ADS, by LOO
and by a seeded random choice (the paper's protocol: the scored run's clients and
acceptances are replayed). With ``clean_runs`` (default 1) every seed also scores the
same federation with the label noise turned off (``noisy_fraction`` 0), on which the
online flagging rules' false-positive rate is measured. Outputs, in ``--out``:

``accuracy.csv``   seed, method (ads, loo, random: top-k retrains; all: the scored run;
                   clean: the clean run), k, round, accuracy
``detection.csv``  the cumulative detection curve (share of a round's noisy clients among
                   its j lowest-ranked, averaged over rounds, 95% CI over seeds)
``metrics.csv``    per method: AUC and precision at the number of noisy clients (mean, CI)
``flagging.csv``   per online flagging rule (:data:`FLAGGING_RULES`): false-positive rate
                   on the clean runs, share of clean clients flagged in the noisy runs,
                   detection rate on the noisy runs (means, 95% CI over seeds)
``figure4.png``    top-3 accuracy, top-4 accuracy (mean and 95% CI per round), detection
``seed-S/``        every run's ledger (``scored``, ``clean``, ``top{k}-{method}``)

``--results FOLDER`` keeps the docs' results files besides (:mod:`simulations.experiments.noisy_clients.markdown`).

The paper's schedule values every client in exactly one round of the five, so an
online rule can only judge a client on that one round: the study's rules use
``patience=1`` (a longer patience never fires here).

One Flower engine serves every run: the ServerApp runs them one after another on the
same grid and the clients load the seed's data from the ``data-key`` in the train
config, so Ray starts once, not once per seed (it costs ~15 s on this machine, ~1% of a
20-seed study: measured, not the bottleneck either way). The runs share one
:class:`strategies.intake.nodes.NodeDirectory` (each node is asked its partition id once per
engine, not once per run), use every core for clients (the server values a round after
its last reply, so it idles while they train) and write no checkpoints (a study is not
resumed; the round records the audit recomputes from are kept).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from flwr.app import ConfigRecord
from flwr.clientapp.typing import Mod
from flwr.serverapp import Grid

from clients import make_client_app
from fedvalue import (
    FlaggingRule,
    detection_curve,
    detection_metrics,
    flagging_rates,
    retrain_plan,
    summarize_metrics,
)
from fedvalue.ledger import load_run
from simulations.experiments.noisy_clients.markdown import STUDY_RESULTS, mean_half_width, results_frames
from simulations.experiments.noisy_clients.noisy_clients import (
    NoisyClientsConfig,
    build,
    client_data,
    valuation_settings,
)
from simulations.runner import (
    Simulation,
    check_integers,
    clients_device,
    default_max_parallel_clients,
    fedavg_without_evaluation,
    initial_model_arrays,
    package_versions,
    prepare_run_dir,
    serve,
    torch_threads,
    write_results,
    write_run_config,
)
from strategies import (
    BookSettings,
    IntakeSettings,
    NodeDirectory,
    PartitionSampler,
    Replay,
    ReplaySampler,
    RunSettings,
    ValuationSettings,
    ValuingStrategy,
    train_config,
)

RANKINGS = ("ads", "loo", "random")
#: torch threads of the server process while the study runs (restored afterwards). The
#: valuation's forward passes are small (a few hundred held-out rows): with torch's default
#: of one thread per core they spin against the Ray clients and any other load, and were
#: measured 15–40× slower per round on this 2-core machine (1.5 s instead of 0.1 s).
SERVER_TORCH_THREADS = 1
#: Online flagging rules measured by the study (patience 1: the paper's schedule values a
#: client in one round only): a robust z below −threshold within the client's round, or
#: the client's accumulated value below a threshold in held-out accuracy (0: its books are
#: negative; −0.01 / −0.02: it cost at least 1% / 2% accuracy). A small calibration table:
#: pick the rule whose false-positive rate on the clean runs you can afford.
FLAGGING_RULES = tuple(
    [FlaggingRule(method, kind="robust_z", threshold=z, patience=1) for method in ("ads", "loo")
     for z in (1.0, 2.0)]
    + [FlaggingRule(method, kind="threshold", threshold=t, patience=1) for method in ("ads", "loo")
       for t in (0.0, -0.01, -0.02)]
)


@dataclass
class NoisyClientsStudyConfig(NoisyClientsConfig):
    """The noisy-clients setting plus the study's own numbers (``seed`` is the first seed:
    the study runs seeds seed, seed + 1, ..., seed + seeds − 1)."""

    seeds: int = 20
    ks: tuple[int, ...] = (3, 4)
    clean_runs: int = 1


#: Help of the study's options that differ from a single run's (``fedvalue run noisy-clients-study --help``).
HELP = {
    "seed": "first seed: the study runs seeds seed, seed+1, ..., seed+seeds-1",
    "seeds": "number of seeds, all run on one engine",
}


#: Settings a study's ``data-key`` may override (the engine serves every seed, noisy and clean).
DATA_KEY_FIELDS = ("seed", "noisy_fraction")


def data_key(seed: int, *, clean: bool = False) -> str:
    """The ``data-key`` naming a seed's federation (``clean``: with noisy_fraction 0)."""
    return json.dumps({"seed": int(seed), **({"noisy_fraction": 0.0} if clean else {})}, sort_keys=True)


def study_client_data(partition_id: int, data_key: int | str | None = None, *, config_json: str):
    """Client data of the federation named by ``data_key``: a seed, or a JSON object of
    :data:`DATA_KEY_FIELDS` overrides (see :func:`data_key`)."""
    config = json.loads(config_json)
    if isinstance(data_key, str):
        try:
            overrides = json.loads(data_key)
        except json.JSONDecodeError:
            overrides = None
        if not isinstance(overrides, dict) or set(overrides) - set(DATA_KEY_FIELDS):
            raise ValueError(f"data_key: expected a JSON object with keys among {list(DATA_KEY_FIELDS)}; "
                             f"got {data_key!r}.")
        config.update(overrides)
    elif data_key is not None:
        config["seed"] = int(data_key)
    return client_data(partition_id, config_json=json.dumps(config, sort_keys=True))


def _check(config: NoisyClientsStudyConfig) -> None:
    # The study is [ADS]'s: FedAvg, ADS against LOO, coalitions scored in the server.
    for name, expected in (("strategy", "fedavg"), ("methods", ("ads", "loo")), ("valuation_workers", 0)):
        got = getattr(config, name)
        if (set(got) != set(expected)) if name == "methods" else got != expected:
            raise ValueError(f"{name}: the study runs [ADS]'s FedAvg with ADS and LOO in the server process; "
                             f"expected {expected!r}, got {got!r}.")
    check_integers(config, ("seeds",))
    if not config.ks or any(k < 1 or k > config.clients_per_round for k in config.ks):
        raise ValueError(f"ks: expected sizes in 1..clients_per_round={config.clients_per_round}; got {config.ks!r}.")
    if isinstance(config.clean_runs, bool) or config.clean_runs not in (0, 1):
        raise ValueError(f"clean_runs: expected 1 (score a clean run per seed for the flagging false-positive "
                         f"rate) or 0 (skip it); got {config.clean_runs!r}.")


def _base(config: NoisyClientsStudyConfig, seed: int, *, clean: bool = False) -> NoisyClientsConfig:
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(NoisyClientsConfig)}
    return NoisyClientsConfig(**{**fields, "seed": seed, "methods": ("ads", "loo"),
                                 **({"noisy_fraction": 0.0} if clean else {})})


def _parallel_clients(config: NoisyClientsStudyConfig) -> int | None:
    """Clients training at once: the config's, else every usable core, at most a round's clients.
    Unlike a single run's default no core is kept for the server: it values a round after its
    last reply, so it idles while clients train (on 2 cores two actors cut the wait for
    training replies by ~20%: 18.8 and 22.1 s against 24.7 and 26.4 s a seed, runs side by side)."""
    engine = config.engine
    if engine.max_parallel_clients is not None or engine.ray_address is not None:
        return engine.max_parallel_clients
    return default_max_parallel_clients(config.clients_per_round, engine.num_cpus_per_client, server_core=False)


def _random_acceptance(sampled: dict[int, list[str]], k: int, seed: int) -> dict[int, list[str]]:
    accepted = {}
    for server_round, clients in sampled.items():
        rng = np.random.default_rng([seed, server_round, 99])
        accepted[server_round] = sorted(rng.choice(clients, size=min(k, len(clients)), replace=False).tolist())
    return accepted


def run_study(
    config: NoisyClientsStudyConfig,
    out: str,
    *,
    on_run: Callable[[str], None] | None = None,
    overwrite: bool = False,
    client_mods: Sequence[Mod] = (),
) -> dict:
    """Run the study (module docstring); returns the tables and timings.

    ``timings``: seconds of the whole engine run (``total``), of the runs' rounds
    (``rounds``, first round's start to last round's commit) and of the valuation in them;
    per message type, the messages sent (``messages``) and the seconds the server waited
    for their replies (``waiting``: the clients' work plus the engine's messaging).
    ``client_mods`` wrap the clients' ``train`` handler (``make_client_app``'s ``mods``).
    """
    _check(config)
    seeds = list(range(config.seed, config.seed + config.seeds))
    for seed in seeds:
        build(_base(config, seed))  # every seed's input is checked before Ray starts
    study_config = {"simulation": "noisy-clients-study", **config.as_dict(), "versions": package_versions()}
    out_dir = prepare_run_dir(out, overwrite=overwrite)
    write_run_config(out_dir, study_config)
    runs = _StudyRuns(config, out_dir)

    def main(grid: Grid) -> None:
        nodes = NodeDirectory()  # one engine, one set of node ids: each node is asked its partition once
        for seed in seeds:
            runs.seed(grid, nodes, seed)
            if on_run is not None:
                on_run(f"seed {seed}: {'clean + ' if config.clean_runs else ''}scored + "
                       f"{len(config.ks) * len(RANKINGS)} retrained runs")
        # per message type: messages sent and seconds waiting for their replies (the engine's grid counts)
        runs.timings["messages"] = dict(getattr(grid, "messages_sent", {}))
        runs.timings["waiting"] = dict(getattr(grid, "wait_seconds", {}))

    started = time.perf_counter()
    base = _base(config, seeds[0])
    loader = functools.partial(study_client_data, config_json=json.dumps(base.as_dict(), sort_keys=True))
    _, model_factory, _, _ = build(base)
    with torch_threads(SERVER_TORCH_THREADS):  # the valuation's forward passes, in this process
        client_app = make_client_app(loader, model_factory, mods=client_mods, device=clients_device(config.device))
        serve(client_app, main, num_supernodes=config.num_clients,
              engine=dataclasses.replace(config.engine, max_parallel_clients=_parallel_clients(config)))
    runs.timings["total"] = time.perf_counter() - started
    return write_outputs(out_dir, seeds, pd.DataFrame(runs.accuracy_rows), runs.timings)


class _StudyRuns:
    """The study's runs on one engine: per seed, the clean run, the scored run and every
    retrained top-k run, each timed; their accuracy per round."""

    def __init__(self, config: NoisyClientsStudyConfig, out_dir: Path) -> None:
        self.config, self.out_dir = config, out_dir
        self.timings = {"valuation": 0.0, "rounds": 0.0, "runs": 0}
        self.accuracy_rows: list[dict] = []

    def seed(self, grid: Grid, nodes: NodeDirectory, seed: int) -> None:
        config = self.config
        _, model_factory, utility, noisy = build(_base(config, seed))
        # A budget in seconds: timed once, for both runs.
        valuation = dataclasses.replace(valuation_settings(config, utility), methods=("ads", "loo"))
        intake = IntakeSettings(nodes=nodes, query_timeout=config.query_timeout)
        initial, seed_dir = initial_model_arrays(model_factory, seed), self.out_dir / f"seed-{seed}"

        def scored_run(name: str, noisy_clients: frozenset, run_config: dict, clean: bool = False):
            """One run scored with ADS and LOO on the paper's schedule (the clean one: no label noise)."""
            sampler = PartitionSampler(config.clients_per_round, schedule=config.schedule, seed=seed)
            return self.start(ValuingStrategy(
                fedavg_without_evaluation(), utility, run_dir=str(seed_dir / name), sampler=sampler, seed=seed,
                valuation=valuation, books=BookSettings(noisy_clients=noisy_clients), intake=intake,
                run=RunSettings(run_config=run_config, checkpoint=False)), grid, initial, seed, clean=clean)

        if config.clean_runs:  # same data, model, schedule and utility; no label noise
            self.record(seed, "clean", config.clients_per_round,
                        scored_run("clean", frozenset(), {"seed": seed, "noisy_fraction": 0.0}, clean=True))
        self.record(seed, "all", config.clients_per_round, scored_run("scored", noisy, {"seed": seed}))
        ledger = load_run(seed_dir / "scored").ledger
        for k in config.ks:
            for ranking in RANKINGS:
                sampled, accepted = retrain_plan(ledger, "ads" if ranking == "random" else ranking, k)
                if ranking == "random":
                    accepted = _random_acceptance(sampled, k, seed)
                retrained = self.start(ValuingStrategy(
                    fedavg_without_evaluation(), utility, acceptance=Replay(accepted), sampler=ReplaySampler(sampled),
                    seed=seed, run_dir=str(seed_dir / f"top{k}-{ranking}"), valuation=ValuationSettings(methods=()),
                    books=BookSettings(noisy_clients=noisy), intake=intake,
                    run=RunSettings(run_config={"seed": seed, "k": k, "ranking": ranking}, checkpoint=False)),
                    grid, initial, seed)
                self.record(seed, ranking, k, retrained)

    def start(self, strategy: ValuingStrategy, grid: Grid, initial, seed: int, clean: bool = False):
        """Run ``strategy`` on ``grid``, adding its rounds' and valuation's seconds to the timings."""
        config = self.config
        train_record = ConfigRecord(train_config(learning_rate=config.learning_rate, local_epochs=config.local_epochs,
                                                 batch_size=config.batch_size, seed=seed,
                                                 data_key=data_key(seed, clean=clean)))
        marks = [time.perf_counter()]
        strategy.on_round = lambda row: marks.append(time.perf_counter())
        strategy.start(grid, initial, num_rounds=config.rounds, timeout=config.round_timeout, train_config=train_record)
        self.timings["rounds"] += marks[-1] - marks[0]
        self.timings["valuation"] += sum(r["valuation_seconds"] for r in strategy.rounds)
        self.timings["runs"] += 1
        return strategy

    def record(self, seed: int, method: str, k: int, strategy: ValuingStrategy) -> None:
        self.accuracy_rows.extend({"seed": seed, "method": method, "k": k, "round": r["round"],
                                   "accuracy": r["utility_realized"]} for r in strategy.rounds)


def write_outputs(out_dir: Path, seeds: list[int], accuracy: pd.DataFrame, timings: dict) -> dict:
    """Tables and Figure 4 from the runs on disk."""
    ledgers = []
    for seed in seeds:
        ledger = load_run(out_dir / f"seed-{seed}" / "scored").ledger
        ledger.insert(0, "seed", seed)
        ledgers.append(ledger)
    ledger = pd.concat(ledgers, ignore_index=True)
    clean_ledgers = []
    for seed in seeds:
        if (out_dir / f"seed-{seed}" / "clean").exists():
            clean = load_run(out_dir / f"seed-{seed}" / "clean").ledger
            clean.insert(0, "seed", seed)
            clean_ledgers.append(clean)
    curve = detection_curve(ledger, methods=RANKINGS)
    metrics = summarize_metrics(detection_metrics(ledger, methods=RANKINGS))
    flagging = flagging_rates(FLAGGING_RULES, [ledger] + ([pd.concat(clean_ledgers, ignore_index=True)]
                                                          if clean_ledgers else []))
    accuracy.to_csv(out_dir / "accuracy.csv", index=False)
    curve.to_csv(out_dir / "detection.csv", index=False)
    metrics.to_csv(out_dir / "metrics.csv", index=False)
    flagging.to_csv(out_dir / "flagging.csv", index=False)
    (out_dir / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    _figure(out_dir / "figure4.png", accuracy, curve,
            sorted(int(k) for k in accuracy.loc[accuracy["method"].isin(RANKINGS), "k"].unique()))
    return {"accuracy": accuracy, "detection": curve, "metrics": metrics, "flagging": flagging, "timings": timings}


def _figure(path: Path, accuracy: pd.DataFrame, curve: pd.DataFrame, ks: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    selected = [k for k in ks if ((accuracy["k"] == k) & accuracy["method"].isin(RANKINGS)).any()]
    fig, axes = plt.subplots(1, len(selected) + 1, figsize=(5 * (len(selected) + 1), 4))
    colors = {"ads": "tab:blue", "loo": "tab:orange", "random": "tab:green", "all": "gray"}
    for ax, k in zip(axes, selected):
        for method in ("ads", "loo", "random", "all"):
            rows = accuracy[(accuracy["method"] == method) & ((accuracy["k"] == k) | (method == "all"))]
            stats = rows.groupby("round")["accuracy"].apply(mean_half_width)
            rounds = np.array(stats.index)
            mean = np.array([m for m, _ in stats])
            half = np.array([h for _, h in stats])
            label = f"all {int(rows['k'].iloc[0])} clients" if method == "all" else f"top-{k} by {method.upper()}"
            ax.plot(rounds, mean, marker="o", color=colors[method], label=label,
                    linestyle="--" if method == "all" else "-")
            ax.fill_between(rounds, mean - half, mean + half, color=colors[method], alpha=0.2)
        ax.set_xticks(rounds)
        ax.set_xlabel("round")
        ax.set_ylabel("held-out accuracy")
        ax.set_title(f"retrained with each round's top {k}")
        ax.legend()
    ax = axes[-1]
    for method in RANKINGS:
        rows = curve[curve["method"] == method]
        ax.plot(rows["j"], rows["mean"], marker="o", color=colors[method], label=method.upper())
        ax.fill_between(rows["j"], rows["ci_low"], rows["ci_high"], color=colors[method], alpha=0.2)
    ax.set_xticks(sorted(curve["j"].unique()))
    ax.set_xlabel("j lowest-ranked clients of a round")
    ax.set_ylabel("share of the round's noisy clients found")
    ax.set_title("cumulative detection")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cli_main(config: NoisyClientsStudyConfig, options) -> int:
    """``fedvalue run noisy-clients-study``: run every seed and print the study's tables."""
    from simulations.runner import progress_bar

    with progress_bar(config.seeds, "noisy-clients study", enabled=not options.quiet) as advance:
        result = run_study(config, options.out, overwrite=options.overwrite, on_run=advance)
    accuracy, curve, metrics = result["accuracy"], result["detection"], result["metrics"]
    last = accuracy[accuracy["round"] == accuracy["round"].max()]
    print("final-round accuracy (mean over seeds):")
    print(last.groupby(["k", "method"])["accuracy"].mean().unstack().to_string(float_format=lambda v: f"{v:.4f}"))
    print("detection at j = 1 (share of a round's noisy clients found first):")
    print(curve[curve["j"] == 1].set_index("method")["mean"].to_string(float_format=lambda v: f"{v:.3f}"))
    print(metrics.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if "flagging" in result and result["flagging"] is not None and len(result["flagging"]):
        print("online flagging (false-positive rate on clean runs, detection on noisy runs):")
        columns = ["method", "kind", "threshold", "false_positive_rate", "detection_rate",
                   "false_positive_rate_noisy_runs"]
        print(result["flagging"][[c for c in columns if c in result["flagging"]]].to_string(
            index=False, float_format=lambda v: f"{v:.3f}"))
    timings = result["timings"]
    print(f"wrote {options.out} ({timings['runs']} runs) in {options.elapsed():.1f}s: "
          f"rounds {timings['rounds']:.1f}s of which valuation {timings['valuation']:.1f}s; see figure4.png")
    if options.results:
        written = write_results(options.results, results_frames(options.out), options.command)
        print(f"results files: {', '.join(map(str, written))}")
    return 0


#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("noisy-clients-study", NoisyClientsStudyConfig, cli_main, help=HELP, results=STUDY_RESULTS)
