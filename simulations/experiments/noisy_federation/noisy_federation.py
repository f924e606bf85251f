"""The ``noisy-federation`` benchmark: does acting on the books train a better model, sooner?

Fashion-MNIST over 100 clients with label skew (Flower Datasets' DirichletPartitioner, α = 0.5),
half of them flipping labels with probability p (p = 1.0 and p = 0.5, one federation each), 10
clients a round. Each policy of :mod:`.policies` (random sampling with FedAvg, Power-of-Choice,
GreedyFed, value-ucb, value-guard, top-k acceptance by ADS and by LOO, value-weighted aggregation, the
trimmed mean, the median, Krum, the oracle) trains the same federation from the same initial model;
the server values on a validation split of the training images and reports test accuracy on the
10,000 test images. The measures (:mod:`.measures`): rounds and wall-clock seconds to 90% and 95%
of the clean federation's final test accuracy, final accuracy and its area under the curve, the
share of training given to bad clients, detection precision and recall, valuation seconds a
round; over seeds with 95% intervals. Every run writes a ledger ``fedvalue audit`` recomputes.

Outputs in ``--out``: the cells (:mod:`.cells`), ``per_cell.csv``, ``summary.csv``, ``curves.csv``,
``detection.csv`` (per round: precision and recall of the clients a sampler has ruled out) and
``accuracy-<model>.png``. Running the same command again skips the done cells (the benchmark
resumes per cell) and rebuilds the tables from every done cell. ``--results FOLDER`` keeps the docs' results files
besides (:mod:`simulations.experiments.noisy_federation.markdown`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from clients import RoundAware, train_client
from fedvalue.utilities import TorchModelUtility
from simulations.datasets import MODELS
from simulations.experiments.noisy_federation.cells import (
    SERVER_TORCH_THREADS,
    Cell,
    cell_train_config,
    plan,
    read_cell,
    remembers,
    run_cells,
    save_benchmark_config,
    seed_federation,
)
from simulations.experiments.noisy_federation.config import HELP, POLICY_NAMES, NoisyFederationConfig, check_config
from simulations.experiments.noisy_federation.data import client_data, data_settings, model_factory
from simulations.experiments.noisy_federation.figures import accuracy_figures
from simulations.experiments.noisy_federation.markdown import NOISY_FEDERATION_RESULTS, estimate, results_frames
from simulations.experiments.noisy_federation.measures import (
    cell_measures,
    detection_by_round,
    final_accuracy,
    paired_differences,
    summary_table,
)
from simulations.experiments.noisy_federation.policies import CLEAN, build_policy, ruled_out
from simulations.runner import Simulation, flat_fields, saved_config, torch_threads, write_results
from strategies import NodeDirectory, PartitionSampler, replay_aggregator

BENCHMARK_FILE = "benchmark.json"
#: Settings a continued benchmark may change: which cells it runs and how the engine runs them.
ADJUSTABLE = ("seed", "seeds", "policies", "final_window", "flip_probabilities", "models", "num_cpus_per_client",
              "num_gpus_per_client", "max_parallel_clients", "round_timeout", "query_timeout")


def open_benchmark(config: NoisyFederationConfig, out: str | Path, *, overwrite: bool) -> Path:
    """``out`` ready for the benchmark: new, or one holding this benchmark's done cells (continued)."""
    out = Path(out).expanduser().resolve()
    saved_file = out / BENCHMARK_FILE
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: expected a directory for the benchmark; {out} is a file.")
    if out.is_dir() and any(out.iterdir()):
        if not saved_file.is_file():
            raise ValueError(f"out: expected an empty or new directory, or a noisy-federation benchmark to continue; "
                             f"{out} holds other files.")
        if overwrite:
            shutil.rmtree(out)
        else:
            saved = json.loads(saved_file.read_text())
            # A setting the saved run predates had its default there.
            settings = config.as_dict()
            changed = [f.name for f in flat_fields(type(config)) if f.name not in ADJUSTABLE
                       and saved.get(f.name, json.loads(json.dumps(f.default)))
                       != json.loads(json.dumps(settings[f.name]))]
            if changed:
                raise ValueError(f"out: {out} holds a benchmark run with other settings ({', '.join(changed)}); its "
                                 "done cells would not be comparable. Use the same settings to continue it, another "
                                 "--out, or --overwrite.")
    out.mkdir(parents=True, exist_ok=True)
    save_benchmark_config(out, config)
    return out


def run_benchmark(config: NoisyFederationConfig, out: str | Path, *, overwrite: bool = False,
                  on_cell: Callable[[Cell], None] | None = None) -> dict:
    """Run every cell of ``config`` not done yet in ``out``, then write and return the tables."""
    check_config(config)
    for seed in range(config.seed, config.seed + config.seeds):
        seed_federation(config, seed)  # every seed's data are checked before an engine starts
    out = open_benchmark(config, out, overwrite=overwrite)
    cells = plan(config)
    for seed in range(config.seed, config.seed + config.seeds):  # tables after each seed: partial runs count
        run_cells(config, out, [c for c in cells if c.seed == seed], on_cell=on_cell)
        tables = write_tables(config, out)
    return tables


def collect(config: NoisyFederationConfig, out: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The done cells' measures (one row a cell), curves and detection by round (policies whose
    sampler rules clients out)."""
    measures, curves, detection = [], [], []
    for cell in plan(config):
        if not cell.done(out):
            continue
        curve, decisions = read_cell(out, cell)
        curves.append(curve.assign(model=cell.model, seed=cell.seed, federation=cell.federation, policy=cell.policy))
        clean = Cell(cell.model, cell.seed, 1.0, CLEAN)
        clean_final = final_accuracy(read_cell(out, clean)[0], config.final_window) if clean.done(out) else math.nan
        fed = seed_federation(config, cell.seed)
        has_view = ruled_out(build_policy(cell.policy, config, cell.seed, honest=fed.clean,
                                          nodes=NodeDirectory())) is not None
        row = cell_measures(curve, decisions, cell.directory(out) / "run", bad=set() if cell.clean else fed.bad,
                            clean_final=float(clean_final), has_view=has_view, window=config.final_window,
                            mavericks=[client for _, client in fed.mavericks])
        measures.append({"model": cell.model, "seed": cell.seed, "federation": cell.federation,
                         "policy": cell.policy, **row})
        if has_view and not cell.clean:
            detection.append(detection_by_round(decisions, fed.bad, config.rounds).assign(
                model=cell.model, seed=cell.seed, federation=cell.federation, policy=cell.policy))
    return (pd.DataFrame(measures), pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(),
            pd.concat(detection, ignore_index=True) if detection else pd.DataFrame())


def write_tables(config: NoisyFederationConfig, out: Path) -> dict:
    per_cell, curves, detection = collect(config, out)
    if per_cell.empty:
        return {"per_cell": per_cell, "summary": per_cell, "curves": curves, "figures": []}
    if not detection.empty:
        detection.to_csv(out / "detection.csv", index=False)
    summary = summary_table(per_cell)
    paired = paired_differences(per_cell, config.rounds)
    per_cell.to_csv(out / "per_cell.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    paired.to_csv(out / "paired.csv", index=False)
    curves.to_csv(out / "curves.csv", index=False)
    return {"per_cell": per_cell, "summary": summary, "paired": paired, "curves": curves,
            "figures": accuracy_figures(curves, out)}


def table_text(summary: pd.DataFrame) -> str:
    """The summary as the console shows it, one block per model and federation."""
    columns = (("final_accuracy", "final acc", 3), ("auc", "AUC", 3), ("rounds_to_90", "rounds→90%", 1),
               ("rounds_to_95", "rounds→95%", 1), ("steady_seconds_to_90", "s→90%", 0),
               ("steady_seconds_to_95", "s→95%", 0), ("bad_trained_share", "bad trained", 2),
               ("ruled_out_precision", "out prec", 2), ("ruled_out_recall", "out rec", 2),
               ("rejected_precision", "rej prec", 2), ("rejected_recall", "rej rec", 2),
               ("valuation_seconds", "val s/rd", 2))
    if summary["maverick_accuracy_n"].gt(0).any():
        columns += (("maverick_accuracy", "mav acc", 3), ("mavericks_ruled_out", "mav out", 2))
    blocks = []
    for (model, fed), rows in summary.groupby(["model", "federation"], sort=False):
        blocks.append(f"{model}, federation {fed} (mean ± 95% interval over seeds; (k/n): seeds that have it; "
                      "s→: rounds × median seconds a round)\n" + _console(rows, columns))
    return "\n\n".join(blocks)


def paired_text(paired: pd.DataFrame) -> str:
    """The paired test against random as the console shows it, one block per model and federation."""
    columns = (("final_accuracy_diff", "Δ final acc", 3), ("auc_diff", "Δ AUC", 3),
               ("rounds_to_95_diff", "Δ rounds→95%", 1), ("seconds_ratio", "s→95% / random's", 2))
    blocks = []
    for (model, fed), rows in paired.groupby(["model", "federation"], sort=False):
        blocks.append(f"{model}, federation {fed}: policy minus random, paired by seed (mean ± 95% interval)\n"
                      + _console(rows, columns))
    return "\n\n".join(blocks)


def _console(rows: pd.DataFrame, columns) -> str:
    """``rows`` as a console table: a policy a line, each (measure, label, decimals) of ``columns`` a column."""
    lines = [{"policy": r["policy"], **{label: estimate(r[m], r[f"{m}_ci"], int(r[f"{m}_n"]), int(r["seeds"]), d,
                                                       plus="±", none="-") for m, label, d in columns}}
             for _, r in rows.iterrows()]
    return pd.DataFrame(lines).to_string(index=False)


def cli_main(config: NoisyFederationConfig, options) -> int:
    """``fedvalue run noisy-federation``: run (or continue) the benchmark, print its table."""
    total = len(plan(config))
    done = []

    def progress(cell: Cell) -> None:
        done.append(cell)
        if not options.quiet:
            print(f"[{len(done)}] {cell.directory(Path('.'))} done ({options.elapsed():.0f}s; {total} cells planned)",
                  flush=True)

    tables = run_benchmark(config, options.out, overwrite=options.overwrite, on_cell=progress)
    if not tables["summary"].empty:
        print(table_text(tables["summary"]))
    if not tables.get("paired", pd.DataFrame()).empty:
        print(paired_text(tables["paired"]))
    print(f"wrote {options.out}: {len(tables['per_cell'])} cells done of {total}, in {options.elapsed():.0f}s; "
          f"figures {', '.join(str(p.name) for p in tables['figures'])}; audit a cell with `fedvalue audit "
          f"{options.out}/{config.models[0]}/seed-{config.seed}/clean/clean/run`")
    if options.results:
        written = write_results(options.results, results_frames(options.out), options.command)
        print(f"results files: {', '.join(map(str, written))}")
    return 0


class PinnedThreads:
    """A utility computed on the server's torch thread count of the run (:data:`SERVER_TORCH_THREADS`),
    so that the audit's float sums add in the run's order (a loss utility summed over other thread
    counts differs in the last bits); it delegates everything else."""

    def __init__(self, utility: TorchModelUtility, threads: int = SERVER_TORCH_THREADS) -> None:
        self.utility, self.threads = utility, threads

    def __call__(self, arrays):
        with torch_threads(self.threads):
            return self.utility(arrays)

    @property
    def supports_linear(self) -> bool:
        return self.utility.supports_linear

    def batch(self, states):
        with torch_threads(self.threads):
            return self.utility.batch(states)

    def linear(self, basis):
        with torch_threads(self.threads):
            return _PinnedScorer(self.utility.linear(basis), self.threads)

    @property
    def differentiable(self) -> bool:
        return self.utility.differentiable

    def gradient(self, arrays):
        with torch_threads(self.threads):
            return self.utility.gradient(arrays)

    def hessian_vector_product(self, arrays, vector):
        with torch_threads(self.threads):
            return self.utility.hessian_vector_product(arrays, vector)

    @property
    def rounded_by_machine(self) -> bool:
        return self.utility.rounded_by_machine

    def float64_value(self, arrays):
        with torch_threads(self.threads):
            return self.utility.float64_value(arrays)


class _PinnedScorer:
    def __init__(self, scorer, threads: int) -> None:
        self.scorer, self.threads = scorer, threads

    def values(self, rows, **keywords):
        with torch_threads(self.threads):
            return self.scorer.values(rows, **keywords)

    def __getattr__(self, name):
        return getattr(self.scorer, name)


def _saved_cell(saved: dict) -> tuple[NoisyFederationConfig, Cell]:
    """The benchmark settings and the cell a run.json names (ValueError naming a bad field)."""
    config = saved_config(NoisyFederationConfig, saved, strict=False)
    check_config(dataclasses.replace(config, seeds=1))
    policy, model, flip = saved.get("policy"), saved.get("model"), saved.get("flip_probability")
    if policy not in (*POLICY_NAMES, CLEAN):
        raise ValueError(f"policy: expected one of {[*POLICY_NAMES, CLEAN]} in run.json; got {policy!r}.")
    if model not in MODELS:
        raise ValueError(f"model: expected one of {list(MODELS)} in run.json; got {model!r}.")
    if isinstance(flip, bool) or not isinstance(flip, (int, float)) or not 0 < flip <= 1:
        raise ValueError(f"flip_probability: expected a number in (0, 1] in run.json; got {flip!r}.")
    return config, Cell(model, config.seed, float(flip), policy, remembers(config))


def audit_from_run(saved: dict) -> dict:
    """What the audit rebuilds of a cell from its run.json: the validation utility, the bad clients,
    the seeded sampler's choice (uniform and oracle sampling), each client's example count and local
    training, and the robust aggregators' own aggregation."""
    config, cell = _saved_cell(saved)
    fed = seed_federation(config, cell.seed)
    factory = model_factory(cell.model, config.hidden, cell.seed)
    parts = build_policy(cell.policy, config, cell.seed, honest=fed.clean, nodes=NodeDirectory())
    settings = data_settings(config)
    train = cell_train_config(config, cell)

    received: dict[int, dict[int, dict]] = {}  # client -> round -> A_{t-1}, as the audit meets its rounds in order

    def retrain(server_round: int, client, start_arrays) -> dict:
        with torch_threads(max(1, int(config.engine.num_cpus_per_client))):  # as the client's Ray worker had
            data = client_data(int(client), cell.data_key, settings=settings)
            if isinstance(data.behaviour, RoundAware):  # it remembers the models of its earlier rounds
                held = received.setdefault(int(client), {})
                earlier = sorted((t for t in held if t < server_round), reverse=True)
                data.behaviour.begin_round(server_round, [held[t] for t in earlier[:data.behaviour.history_length]])
                held.setdefault(server_round, dict(start_arrays))  # the round's own start, not a probe's
            arrays, _, _ = train_client(data, factory, dict(start_arrays), learning_rate=train["lr"],
                                        local_epochs=train["local-epochs"], batch_size=train["batch-size"],
                                        seed=cell.seed, server_round=server_round)
        return arrays

    sampler = parts.sampler if isinstance(parts.sampler, PartitionSampler) else None
    return {"utility": PinnedThreads(TorchModelUtility(factory(), fed.validation.x, fed.validation.y,
                                                       metric=config.utility, device=config.device)),
            "noisy_clients": frozenset() if cell.clean else fed.bad,
            "sampled": None if sampler is None else (lambda t: sampler.sample(t, range(config.num_clients))),
            "example_counts": lambda client: len(fed.partitions[int(client)]),
            "retrain": retrain,
            "replay": replay_aggregator(lambda: build_policy(cell.policy, config, cell.seed, honest=fed.clean,
                                                             nodes=NodeDirectory()).strategy)}


#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("noisy-federation", NoisyFederationConfig, cli_main, audit_from_run=audit_from_run, help=HELP,
                        results=NOISY_FEDERATION_RESULTS)
