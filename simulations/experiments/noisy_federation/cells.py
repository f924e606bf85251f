"""The benchmark's runs: one per (model, seed, federation, policy) cell, all on one engine a model.

Layout of ``out`` (a cell's directory is ``<model>/seed-<s>/<federation>/<policy>/``, the
federation ``clean`` or ``p<flip probability>``)::

    benchmark.json                 the configuration
    <cell>/run/                    the cell's run directory: ledger, rounds, records (fedvalue audit it)
    <cell>/curve.csv               per round: test accuracy, wall-clock seconds, valuation seconds
    <cell>/decisions.csv           per round: the clients the policy rules out (``ruled_out``, for policies
                                   with such a view) and the losses Power-of-Choice's candidates reported

A cell is done once its ``curve.csv`` exists (written after its run closed): running the same
command again skips it, so the benchmark resumes per cell. A cell found without it is run again
from scratch. Wall-clock per round is measured on the server from the end of the previous round's
test evaluation to the start of this one's: the clients' training, Power-of-Choice's loss queries,
the valuation and the books, everything a policy pays for; the test evaluation itself is not
counted, nor is the engine's start nor the clients' loading of a seed's data (:func:`warm_up`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid

from clients import make_client_app
from fedvalue.ledger import RoundRow
from fedvalue.utilities import TorchModelUtility
from simulations.experiments.noisy_federation.data import (
    REMEMBERING_KINDS,
    Federation,
    client_data,
    data_settings,
    federation,
    model_factory,
)
from simulations.experiments.noisy_federation.data import data_key as federation_key
from simulations.experiments.noisy_federation.policies import CLEAN, PolicyParts, build_policy, ruled_out
from simulations.runner import (
    EngineSettings,
    clients_device,
    default_max_parallel_clients,
    initial_model_arrays,
    package_versions,
    seeded_server_generators,
    serve,
    torch_threads,
)
from strategies import (
    LOCAL_LOSS_KEY,
    SERVER_ROUND_KEY,
    BookSettings,
    IntakeSettings,
    NodeDirectory,
    RunSettings,
    ValuingStrategy,
    arrays_to_numpy,
    train_config,
)

CURVE_FILE, DECISIONS_FILE, RUN_DIR = "curve.csv", "decisions.csv", "run"
#: torch threads of the server while cells run: its forward passes are small, and more threads
#: spin against the Ray clients on a small machine (noisy-clients-study measured 15-40x).
SERVER_TORCH_THREADS = 1


@dataclass(frozen=True)
class Cell:
    """One run of the benchmark."""

    model: str
    seed: int
    flip_probability: float
    policy: str
    #: Whether its bad clients remember what they received: its data key then names the policy too.
    remembers: bool = False

    @property
    def clean(self) -> bool:
        return self.policy == CLEAN

    @property
    def federation(self) -> str:
        return "clean" if self.clean else f"p{self.flip_probability:g}"

    def directory(self, out: Path) -> Path:
        return Path(out) / self.model / f"seed-{self.seed}" / self.federation / self.policy

    def done(self, out: Path) -> bool:
        return (self.directory(out) / CURVE_FILE).is_file()

    @property
    def data_key(self) -> str:
        return federation_key(self.seed, self.flip_probability, clean=self.clean,
                              run=self.policy if self.remembers and not self.clean else None)


def remembers(config) -> bool:
    """Whether ``config``'s bad clients remember the global models they received."""
    return config.bad_kind in REMEMBERING_KINDS or config.extra_bad_kind in REMEMBERING_KINDS


def plan(config) -> list[Cell]:
    """Every cell of ``config``: per seed and model, the clean reference first, then each flip
    probability's policies."""
    cells = []
    for seed in range(config.seed, config.seed + config.seeds):
        for model in config.models:
            cells.append(Cell(model, seed, 1.0, CLEAN))
            cells += [Cell(model, seed, float(p), policy, remembers(config))
                      for p in config.flip_probabilities for policy in config.policies]
    return cells


def seed_federation(config, seed: int) -> Federation:
    return federation(data_settings(dataclasses.replace(config, seed=seed)))


def cell_run_config(config, cell: Cell, parts: PolicyParts, bad: frozenset) -> dict:
    """run.json of a cell: the benchmark's settings, the cell and what the audit reads."""
    valuation = parts.valuation(config)
    return {"simulation": "noisy-federation", **config.as_dict(), "seed": cell.seed, "model": cell.model,
            "policy": cell.policy, "flip_probability": cell.flip_probability, "clean": cell.clean,
            "noisy_clients": sorted(bad), "num_rounds": config.rounds, "num_clients": config.num_clients,
            "strategy": type(parts.strategy).__name__, "methods": list(parts.methods),
            "valuation": valuation.ads.as_dict(),
            "coalition_rule": valuation.coalition_rule,  # the rule this policy values with, if it does
            "train_config": cell_train_config(config, cell),
            "versions": package_versions()}


def cell_train_config(config, cell: Cell) -> dict:
    return train_config(learning_rate=config.learning_rate, local_epochs=config.local_epochs,
                        batch_size=config.batch_size, seed=cell.seed, data_key=cell.data_key)


class RoundClock:
    """Flower's ``evaluate_fn``: test accuracy of each round's state (and, with ``mavericks``, on
    the test images of the classes mavericks alone hold), and the wall-clock seconds of each round
    without the evaluation itself."""

    def __init__(self, test: TorchModelUtility, mavericks: TorchModelUtility | None = None) -> None:
        self.test, self.mavericks = test, mavericks
        self.accuracy: dict[int, float] = {}
        self.maverick_accuracy: dict[int, float] = {}
        self.seconds: dict[int, float] = {}
        self._mark = time.perf_counter()

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        started = time.perf_counter()
        if server_round > 0:
            self.seconds[server_round] = started - self._mark
        state = arrays_to_numpy(arrays)
        self.accuracy[server_round] = float(self.test(state))
        if self.mavericks is not None:
            self.maverick_accuracy[server_round] = float(self.mavericks(state))
        self._mark = time.perf_counter()
        return MetricRecord({"test-accuracy": self.accuracy[server_round]})


def maverick_test(fed: Federation, factory, device: str) -> TorchModelUtility | None:
    """Accuracy on the test images of the classes the federation's mavericks alone hold (None: no maverick)."""
    if not fed.mavericks:
        return None
    rows = np.flatnonzero(np.isin(fed.test.y, [cls for cls, _ in fed.mavericks]))
    subset = fed.test.subset(rows)
    return TorchModelUtility(factory(), subset.x, subset.y, device=device)


def run_cell(grid: Grid, config, cell: Cell, out: Path, nodes: NodeDirectory) -> None:
    """Run one cell on the engine behind ``grid`` and write its files (module docstring)."""
    fed = seed_federation(config, cell.seed)
    parts = build_policy(cell.policy, config, cell.seed, honest=fed.clean, nodes=nodes)
    factory = model_factory(cell.model, config.hidden, cell.seed)
    utility = TorchModelUtility(factory(), fed.validation.x, fed.validation.y, metric=config.utility,
                                device=config.device)
    clock = RoundClock(TorchModelUtility(factory(), fed.test.x, fed.test.y, device=config.device),
                       maverick_test(fed, factory, config.device))
    bad = frozenset() if cell.clean else fed.bad
    directory = cell.directory(out)
    if directory.exists():  # an unfinished cell starts again from scratch
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    decisions: list[dict] = []

    def note_decisions(row: RoundRow) -> None:
        t, flagged = row.round, ruled_out(parts)
        if flagged is not None:
            decisions.extend({"round": t, "client": int(c), "decision": "ruled_out", "value": None}
                             for c in sorted(flagged))
        losses = getattr(parts.strategy, "losses", {}).get(t, {})  # Power-of-Choice: what its candidates reported
        decisions.extend({"round": t, "client": c, "decision": "local_loss", "value": v} for c, v in losses.items())

    strategy = ValuingStrategy(
        parts.strategy, utility, run_dir=str(directory / RUN_DIR), sampler=parts.sampler,
        acceptance=parts.acceptance, seed=cell.seed, valuation=parts.valuation(config),
        books=BookSettings(noisy_clients=bad), intake=IntakeSettings(nodes=nodes, query_timeout=config.query_timeout),
        run=RunSettings(run_config=cell_run_config(config, cell, parts, bad), checkpoint=False))
    strategy.on_round = note_decisions
    with seeded_server_generators(cell.seed):
        strategy.start(grid, initial_model_arrays(factory, cell.seed), num_rounds=config.rounds,
                       timeout=config.round_timeout, train_config=ConfigRecord(cell_train_config(config, cell)),
                       evaluate_fn=clock)
    if len(strategy.rounds) != config.rounds:
        raise RuntimeError(f"cell {directory}: {len(strategy.rounds)} of {config.rounds} rounds ran; it runs again "
                           "from scratch next time.")
    pd.DataFrame(decisions, columns=["round", "client", "decision", "value"]).to_csv(directory / DECISIONS_FILE,
                                                                                      index=False)
    curve = pd.DataFrame({"round": list(range(config.rounds + 1)),
                          "test_accuracy": [clock.accuracy[t] for t in range(config.rounds + 1)],
                          "seconds": [0.0] + [clock.seconds[t] for t in range(1, config.rounds + 1)],
                          "valuation_seconds": [0.0] + [float(r["valuation_seconds"]) for r in strategy.rounds]})
    if clock.mavericks is not None:
        curve["maverick_accuracy"] = [clock.maverick_accuracy[t] for t in range(config.rounds + 1)]
    curve.to_csv(directory / CURVE_FILE, index=False)  # last: the cell is done


def warm_up(grid: Grid, config, cell: Cell, nodes: NodeDirectory) -> None:
    """Have every client load ``cell``'s federation before any cell of it is timed: a loss query
    carrying the seed's initial model and data key (a Ray worker prepares a seed's data once, tens
    of seconds on a loaded machine, which no policy should be charged for), then one training
    round whose replies are discarded (without it the first timed round of a seed took 1-5 s more
    than the others on the 2-core machine). Under the clean federation's data key: a client that
    remembers the models it received keeps its memory per data key, and a run's must start empty."""
    cell = Cell(cell.model, cell.seed, cell.flip_probability, CLEAN)
    arrays = initial_model_arrays(model_factory(cell.model, config.hidden, cell.seed), cell.seed)
    query = ConfigRecord({**cell_train_config(config, cell), LOCAL_LOSS_KEY: True})
    node_ids = list(nodes.partition_map(grid, config.query_timeout).values())
    messages = [Message(RecordDict({"arrays": arrays, "config": query}), dst_node_id=node,
                        message_type=MessageType.QUERY) for node in node_ids]
    grid.send_and_receive(messages, timeout=config.round_timeout)
    train = ConfigRecord({**cell_train_config(config, cell), SERVER_ROUND_KEY: 0})  # one untimed round, discarded
    grid.send_and_receive([Message(RecordDict({"arrays": arrays, "config": train}), dst_node_id=node,
                                   message_type=MessageType.TRAIN) for node in node_ids[:config.clients_per_round]],
                          timeout=config.round_timeout)


def engine_options(config) -> EngineSettings:
    """The config's engine; by default every usable core trains clients (the server values a round
    only after its last reply, so it idles while they train)."""
    parallel = config.engine.max_parallel_clients or default_max_parallel_clients(
        config.clients_per_round, config.engine.num_cpus_per_client, server_core=False)
    return dataclasses.replace(config.engine, max_parallel_clients=parallel)


def run_cells(config, out: Path, cells: list[Cell], *, on_cell: Callable[[Cell], None] | None = None) -> None:
    """Run ``cells`` (those not done), one engine a model."""
    settings = data_settings(config)
    for model in dict.fromkeys(cell.model for cell in cells):
        todo = [cell for cell in cells if cell.model == model and not cell.done(out)]
        if not todo:
            continue

        def main(grid: Grid, todo=todo) -> None:
            nodes = NodeDirectory()  # one engine, one set of node ids: each node is asked its partition once
            warmed = set()
            for cell in todo:
                if cell.seed not in warmed:
                    warm_up(grid, config, cell, nodes)
                    warmed.add(cell.seed)
                run_cell(grid, config, cell, out, nodes)
                if on_cell is not None:
                    on_cell(cell)

        loader = functools.partial(client_data, settings=settings)
        with torch_threads(SERVER_TORCH_THREADS):
            client_app = make_client_app(loader, model_factory(model, config.hidden, config.seed),
                                         device=clients_device(config.device))
            serve(client_app, main,
                  num_supernodes=config.num_clients, engine=engine_options(config))


def read_cell(out: Path, cell: Cell) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A done cell's curve and decisions."""
    directory = cell.directory(out)
    return pd.read_csv(directory / CURVE_FILE), pd.read_csv(directory / DECISIONS_FILE)


def save_benchmark_config(out: Path, config) -> None:
    (Path(out) / "benchmark.json").write_text(json.dumps({"simulation": "noisy-federation", **config.as_dict(),
                                                          "versions": package_versions()}, indent=2) + "\n")
