"""Run a Flower simulation with contributor books, with the user's own parts.

    from flwr.serverapp.strategy import FedAdam
    run = simulations.simulate(
        strategy=FedAdam(), model_factory=my_model,
        load_client_data=my_loader, num_clients=20, num_rounds=10,
        utility=TorchModelUtility(my_model(), x_test, y_test), out="runs/mine",
    )
    run.summary()          # per-client totals, pandas

Ray runs the clients through Flower's simulation engine (simulations.runner.engine); the
ServerApp is a thread of this process, so the wrapped strategy and its books stay here.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from clients.app import ClientData, make_client_app
from clients.seeding import seeded_call
from fedvalue._checks import check_integer
from fedvalue.analysis.run_summary import Run, load_run
from fedvalue.run.run_info import package_versions
from fedvalue.schema import PROBLEM_STATUSES, Status
from fedvalue.valuation.round_game import ArraysUtility
from simulations.runner.config_checks import check_gpu_shares
from simulations.runner.engine import serve, stop_on_signals
from simulations.runner.engine_settings import EngineSettings, check_ray_address
from simulations.runner.out_dir import RunHold, claim_run_dir
from strategies import (
    SEED_KEY,
    Acceptance,
    BookSettings,
    ChoosesOwnClients,
    IntakeSettings,
    PartitionSampler,
    Sampler,
    RunSettings,
    ValuationSettings,
    ValuingStrategy,
    arrays_to_numpy,
    initial_arrays,
)
from strategies.aggregation.random_state import RandomState
from strategies.valuing_settings import RunCallbacks, settings_or_default


#: Entropy tail of the initial model's seed ([run seed, this]): its own stream, apart from
#: the server generators' (a factory's draws never shift the DP noise or node sampling).
INITIAL_MODEL_STREAM = 0x1A0


def initial_model_arrays(model_factory: Callable[[], torch.nn.Module], seed: int) -> ArrayRecord:
    """A_0: ``model_factory()``'s state as an ArrayRecord, the factory run with the global
    generators seeded from the run's ``seed`` (:func:`clients.seeding.seeded_call`): a
    factory that does not seed torch itself (``torch.nn.Linear`` draws from the global
    generator) still gives the same A_0 for the same seed, and the caller's generators are
    left as they were."""
    if not callable(model_factory) or isinstance(model_factory, torch.nn.Module):
        raise TypeError("model_factory: expected a callable that builds a fresh torch.nn.Module; got "
                        f"{type(model_factory).__name__}.")
    return initial_arrays(seeded_call(model_factory, [int(seed), INITIAL_MODEL_STREAM], name="seed"))


def default_sampler(strategy: Strategy, num_clients: int, seed: int) -> PartitionSampler | None:
    """The seeded sampler a run uses when none is given: as many clients per round as the
    inner strategy would sample (Flower's FedAvg family: max(⌊N·fraction_train⌋,
    min_train_nodes)), drawn by partition id from ``seed`` instead of Flower's global
    ``random`` over random node ids. None for a strategy that trains no client, or that chooses
    its own clients (:class:`strategies.ChoosesOwnClients`: Power-of-Choice)."""
    if isinstance(strategy, ChoosesOwnClients):
        return None
    fraction = getattr(strategy, "fraction_train", None)
    if fraction is None:
        raise ValueError(
            f"sampler: expected a sampler (e.g. strategies.PartitionSampler(k, seed=seed)) for a "
            f"{type(strategy).__name__}: it has no fraction_train to size a seeded one from, and Flower's own "
            "sampling draws random node ids, so the same seed would not give the same run."
        )
    if not fraction:
        return None
    per_round = max(int(num_clients * float(fraction)), int(getattr(strategy, "min_train_nodes", 1) or 1))
    return PartitionSampler(min(per_round, num_clients), seed=seed)


def check_inference_splits(load_client_data: Callable[[int], ClientData], num_clients: int) -> None:
    """ValueError unless every client's data holds an inference split (TracIn flows need
    one: an empty split would book every flow into it as 0, silently)."""
    missing = []
    for partition_id in range(num_clients):
        data = load_client_data(partition_id)
        if not isinstance(data, ClientData):
            raise TypeError(f"load_client_data: expected it to return a clients.ClientData; got "
                            f"{type(data).__name__} for partition {partition_id}.")
        if len(data.x_infer) == 0:
            missing.append(partition_id)
    if missing:
        shown = ", ".join(str(c) for c in missing[:10]) + (", ..." if len(missing) > 10 else "")
        raise ValueError(
            f"flows: TracIn flows need every client's inference split (ClientData's x_infer, y_infer); "
            f"{len(missing)} of {num_clients} clients have none (partition {shown}). Give them one, or book no "
            "flows (BookSettings(flows=False))."
        )


@contextmanager
def seeded_server_generators(seed: int) -> Iterator[None]:
    """Seed the server's global generators (numpy's legacy one, Python's ``random``, torch)
    from the run's seed for the block, and put the caller's state back after.

    Flower's randomized strategies draw from them (DP noise from ``np.random.normal``,
    node sampling from ``random.sample``): seeding them is what makes the same seed give
    the same ledger for those strategies too. A simulation (this module, the Flower App)
    does it; the library never seeds a global generator.
    """
    found = RandomState.capture()
    numpy_seed, python_seed, torch_seed = np.random.SeedSequence([int(seed), 0x5EED]).generate_state(3)
    np.random.seed(int(numpy_seed))
    random.seed(int(python_seed))
    torch.manual_seed(int(torch_seed))
    try:
        yield
    finally:
        found.restore()


def simulate(
    *, strategy: Strategy, model_factory: Callable[[], torch.nn.Module], load_client_data: Callable[[int], ClientData],
    num_clients: int, num_rounds: int, utility: ArraysUtility, out: str | os.PathLike,
    train_config: Mapping[str, int | float | str] | None = None, sampler: Sampler | None = None,
    seed: int = 0, acceptance: Acceptance | None = None, valuation: ValuationSettings | None = None,
    books: BookSettings | None = None, intake: IntakeSettings | None = None, run: RunSettings | None = None,
    engine: EngineSettings | None = None, callbacks: RunCallbacks | None = None, client_mods: Sequence[Mod] = (),
    overwrite: bool = False, round_timeout: float = 600.0,
    evaluate: Callable[[int, dict[str, np.ndarray]], Mapping[str, float] | None] | None = None,
    client_device: str = "cpu",
) -> Run:
    """Simulate ``num_rounds`` of FL on Ray with ``strategy`` wrapped by
    :class:`strategies.ValuingStrategy`, and return the run's books.

    ``model_factory`` builds the global model (A_0 is its state, built with the global generators
    seeded from ``seed``: :func:`initial_model_arrays`); ``load_client_data`` maps a partition id
    to a :class:`clients.ClientData` and travels to the Ray workers (a module-level function or a
    functools.partial of one); ``utility`` is U(arrays) on held-out data; ``out`` the run directory
    (``overwrite`` replaces a run there). ``train_config`` goes to the clients every round ("seed"
    defaults to ``seed``). ``sampler`` picks the partitions that train (None: a seeded
    :class:`~strategies.PartitionSampler` of the inner strategy's size, :func:`default_sampler`).
    ``seed`` seeds everything the run draws: the same seed gives the same ledger, byte for byte.
    The valuing strategy's options come whole: ``acceptance`` (what is aggregated),
    ``valuation`` (methods, the ADS estimator), ``books`` (TracIn flows, which need every client's
    inference split, :func:`check_inference_splits`; fairness; the clients known to be noisy),
    ``intake``, ``run`` (run.json's configuration, completed here so that the run can be audited
    from it alone; records, checkpoints, resume, signing) and ``callbacks``; ``engine`` says how Ray
    runs the clients and ``client_mods`` wrap their training (picklable, like the loader);
    ``client_device`` is the torch device the clients train on (``"cuda"`` needs GPU shares,
    ``engine.num_gpus_per_client > 0``: :func:`clients.make_client_app`).
    ``evaluate(t, A_t)`` is called on the server with the global arrays (name -> numpy array)
    after every round t, and with A_0 before the first: to measure what one's own policy does
    (test accuracy per round, say). It may return a mapping of metrics (Flower logs them), or
    None; the global generators it draws from are put back after each call, so it changes
    nothing booked.

    The clients are not asked to evaluate (no federated evaluation rounds, whatever the inner
    strategy's ``fraction_evaluate``): the books value every round on ``utility``.

    Raises :class:`NoClientValued` when no client of any round gave a usable reply (the ledger
    then holds every round and each failure's reason).
    """
    check_integer("num_rounds", num_rounds)
    check_integer("num_clients", num_clients)
    valuation, books, run, engine = _settings_or_defaults(valuation, books, run, engine)
    train_config = dict(train_config or {})
    train_config.setdefault(SEED_KEY, seed)  # clients draw from the run's seed unless told otherwise
    config = _run_config(run, strategy, valuation, train_config, seed, num_rounds, num_clients, books)
    _check_before_writing(engine, run, books, load_client_data, num_clients)
    sampler = default_sampler(strategy, num_clients, seed) if sampler is None else sampler
    initial = initial_model_arrays(model_factory, seed)
    client_app = _client_app(load_client_data, model_factory, client_mods, client_device, engine)
    run_dir, lock = claim_run_dir(out, overwrite=overwrite, resume=run.resume)  # one writer at a time
    with RunHold(run_dir, lock, resume=run.resume) as hold:
        valuing = hold.books = ValuingStrategy(
            strategy, utility, run_dir=str(run_dir), sampler=sampler, acceptance=acceptance, seed=seed,
            valuation=valuation, books=books,
            intake=dataclasses.replace(settings_or_default("intake", intake, IntakeSettings), federated_evaluation=False),
            run=dataclasses.replace(run, run_config=config))
        if callbacks is not None:
            valuing.on_round, valuing.on_progress = callbacks.on_round, callbacks.on_progress
        valuing.open_books()  # bad input surfaces here, before the engine starts
        if engine.ray_address is not None and run.resume:  # probed once the directory is verified as the run's
            check_ray_address(engine.ray_address)
        _serve(valuing, initial, ConfigRecord(train_config), num_rounds, round_timeout, seed,
               client_app, num_clients, engine,
               None if evaluate is None else ServerEvaluation(evaluate))
    if len(valuing.rounds) < num_rounds:
        raise RuntimeError(f"the simulation stopped after {len(valuing.rounds)} of {num_rounds} rounds; the ledger "
                           f"in {run_dir} holds the completed rounds. See the engine's log above.")
    return check_some_client_valued(load_run(run_dir), run_dir)


def _settings_or_defaults(valuation: ValuationSettings | None, books: BookSettings | None, run: RunSettings | None,
                          engine: EngineSettings | None) -> tuple[ValuationSettings, BookSettings, RunSettings,
                                                                 EngineSettings]:
    """Each settings object as given (a wrong type is refused, named) or, None, its defaults."""
    return (settings_or_default("valuation", valuation, ValuationSettings),
            settings_or_default("books", books, BookSettings), settings_or_default("run", run, RunSettings),
            settings_or_default("engine", engine, EngineSettings))


def _client_app(load_client_data: Callable[[int], ClientData], model_factory: Callable[[], torch.nn.Module],
                client_mods: Sequence[Mod], client_device: str, engine: EngineSettings) -> ClientApp:
    """The clients' app on ``client_device``, checked before anything is written: a CUDA device needs GPU shares."""
    client_app = make_client_app(load_client_data, model_factory, mods=client_mods, device=client_device)
    check_gpu_shares(client_device, engine.num_gpus_per_client, name="engine.num_gpus_per_client",
                     subject=f"clients training on {client_device!r} need", instead="client_device='cpu'")
    return client_app


def _check_before_writing(engine: EngineSettings, run: RunSettings, books: BookSettings,
                          load_client_data: Callable[[int], ClientData], num_clients: int) -> None:
    """What is refused before anything is written (a refusal leaves no run directory): a new
    run's unreachable Ray cluster (a resumed run's is probed once its directory is verified as
    the run's) and, with flows, a client without an inference split."""
    if engine.ray_address is not None and not run.resume:
        check_ray_address(engine.ray_address)
    if books.flows:
        check_inference_splits(load_client_data, num_clients)


def _run_config(run: RunSettings, strategy: Strategy, valuation: ValuationSettings, train_config: dict, seed: int,
                num_rounds: int, num_clients: int, books: BookSettings) -> dict:
    """run.json's configuration: the caller's, completed with what the audit needs to read the
    run from run.json alone (seed, rounds, clients, strategy, training, the estimator, the flows'
    projection where there is one, versions)."""
    config = dict(run.run_config or {})
    config.setdefault("seed", seed)
    config.setdefault("num_rounds", num_rounds)
    config.setdefault("num_clients", num_clients)
    config.setdefault("strategy", type(strategy).__name__)
    config.setdefault("train_config", train_config)
    config.setdefault("methods", list(valuation.methods))
    config.setdefault("valuation", valuation.ads.as_dict())  # the estimator, as the round records write it
    projection = books.flows_projection(seed)
    if projection is not None:  # absent otherwise: run.json of other runs reads the same
        config.setdefault("flows_projection", projection.as_json())
    config["versions"] = package_versions()
    return config


class ServerEvaluation:
    """Flower's ``evaluate_fn`` around a user's ``evaluate(t, arrays)`` (:func:`simulate`): numpy
    arrays in, the global generators put back after, a returned mapping checked and logged."""

    def __init__(self, evaluate: Callable[[int, dict[str, np.ndarray]], Mapping[str, float] | None]) -> None:
        if not callable(evaluate):
            raise TypeError(f"evaluate: expected a callable (round, arrays) -> metrics or None; got "
                            f"{type(evaluate).__name__}.")
        self.evaluate = evaluate

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        found = RandomState.capture()
        try:
            metrics = self.evaluate(int(server_round), arrays_to_numpy(arrays))
        finally:
            found.restore()
        if metrics is None:
            return None
        numbers = isinstance(metrics, Mapping) and all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in metrics.items())
        if not numbers:
            raise TypeError(f"evaluate: expected it to return None or a mapping of metric names to numbers; got "
                            f"{metrics!r} in round {server_round}.")
        return MetricRecord({k: float(v) for k, v in metrics.items()})


def _serve(valuing: ValuingStrategy, initial: ArrayRecord, train_record: ConfigRecord, num_rounds: int,
           round_timeout: float, seed: int, client_app, num_clients: int, engine: EngineSettings,
           evaluate_fn: ServerEvaluation | None = None) -> None:
    """Run the rounds on the engine; Ctrl-C / SIGTERM stops after the round in flight commits."""
    def main(grid: Grid) -> None:
        with seeded_server_generators(seed):
            valuing.start(grid, initial, num_rounds=num_rounds, timeout=round_timeout, train_config=train_record,
                          evaluate_fn=evaluate_fn)

    with stop_on_signals(valuing.stop_requested):
        serve(client_app, main, num_supernodes=num_clients, engine=engine, on_worker_lost=valuing.request_stop)


class NoClientValued(RuntimeError):
    """A run in which every sampled client failed every round."""


def check_some_client_valued(run: Run, run_dir: str | os.PathLike) -> Run:
    """``run``, or :class:`NoClientValued` naming the booked reasons when no client of any
    round was valued (nothing was aggregated: a run that only looks finished)."""
    if not (run.ledger["status"] == Status.OK).any():
        reasons = run.ledger.loc[run.ledger["status"].isin(PROBLEM_STATUSES), "reason"].value_counts()
        raise NoClientValued(
            f"no client gave a usable reply in any of the {len(run.rounds)} rounds, so nothing was aggregated or "
            f"valued (the ledger in {run_dir} books every failure). Reasons: "
            + "; ".join(f"{reason} ({count} rows)" for reason, count in reasons.items())
        )
    return run
