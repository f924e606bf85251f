"""Run a Flower simulation with contributor books, with the user's own parts.

    from flwr.serverapp.strategy import FedAdam
    run = simulations.simulate(
        strategy=FedAdam(fraction_evaluate=0.0), model_factory=my_model,
        load_client_data=my_loader, num_clients=20, num_rounds=10,
        utility=TorchModelUtility(my_model(), x_test, y_test), out="runs/mine",
    )
    run.summary()          # per-client totals, pandas

Ray runs the clients through Flower's simulation engine (simulations.engine); the
ServerApp is a thread of this process, so the wrapped strategy and its books stay here.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import random
import shutil
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from flwr.app import ConfigRecord
from flwr.clientapp.typing import Mod
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedvalue._checks import check_integer
from clients.app import ClientData, make_client_app
from fedvalue.ledger import Run, load_run
from fedvalue.rounds import VALUATION_METHODS, ArraysUtility
from fedvalue.schema import LEDGER_FILE, PROBLEM_STATUSES, RUN_CONFIG_FILE, STATUS_OK
from simulations.engine import check_ray_address, serve, stop_on_signals
from strategies import PartitionSampler, ValuingStrategy
from strategies.acceptance import Acceptance
from strategies.claims import ClaimReview
from strategies.counterfactual import RandomState
from strategies.records import initial_arrays


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("fedvalue", "flwr", "ray", "torch", "numpy", "pandas"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


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


def prepare_run_dir(out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Create ``out``; refuse a directory that already holds a run unless ``overwrite``."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: expected a directory for the run; {out} is a file.")
    if out.is_dir() and any(out.iterdir()):
        if not (out / LEDGER_FILE).exists() and not (out / RUN_CONFIG_FILE).exists():
            raise ValueError(f"out: expected an empty or new directory; {out} holds other files.")
        if not overwrite:
            raise ValueError(
                f"out: {out} already holds a run; choose a new directory, continue that run with "
                "resume=True (--resume DIR), or pass overwrite=True (--overwrite) to replace it."
            )
        shutil.rmtree(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".fedvalue-write-check"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise ValueError(f"out: expected a directory fedvalue can create and write; {out} cannot be "
                         f"({error.strerror or error}).") from None
    return out


def simulate(
    *,
    strategy: Strategy,
    model_factory: Callable[[], torch.nn.Module],
    load_client_data: Callable[[int], ClientData],
    num_clients: int,
    num_rounds: int,
    utility: ArraysUtility,
    out: str | os.PathLike,
    train_config: Mapping[str, int | float | str] | None = None,
    sampler: PartitionSampler | None = None,
    methods: Sequence[str] = VALUATION_METHODS,
    valuation_options: Mapping | None = None,
    seed: int = 0,
    noisy_clients: Collection[int] | None = None,
    on_round: Callable[[dict], None] | None = None,
    run_config: Mapping | None = None,
    overwrite: bool = False,
    round_timeout: float = 600.0,
    num_cpus_per_client: float = 1,
    max_parallel_clients: int | None = None,
    ray_address: str | None = None,
    flows: bool = False,
    num_gpus_per_client: float = 0.0,
    resume: bool = False,
    save_records: bool = True,
    client_mods: Sequence[Mod] = (),
    claims: ClaimReview | None = None,
    reject_non_finite: bool = True,
    query_timeout: float = 120.0,
    checkpoint: bool = True,
    acceptance: Acceptance | None = None,
    sign_key=None,
    on_valuation_progress: Callable[[int, int, int], None] | None = None,
) -> Run:
    """Simulate ``num_rounds`` of FL on Ray with ``strategy`` wrapped for valuation.

    Parameters
    ----------
    strategy
        Any Flower strategy; it is wrapped by :class:`strategies.ValuingStrategy`.
    model_factory
        Builds the global model (its initial state is the run's A_0).
    load_client_data
        partition id -> :class:`clients.ClientData`; must be picklable (it travels to
        the Ray workers): a module-level function or a functools.partial of one.
    utility
        U(arrays) on held-out data, e.g. :class:`fedvalue.utilities.TorchModelUtility`.
    out
        Run directory for the ledger (see :mod:`fedvalue.ledger`).
    train_config
        Sent to clients every round ("lr", "local-epochs", "batch-size", "seed").

    flows
        Book TracIn flows between clients (inflow, outflow, self per round; see
        :class:`strategies.ValuingStrategy`). Clients need an inference split.
    resume
        Continue the run in ``out`` from its last completed round (its run.json must
        equal this call's configuration); the ledger ends as an uninterrupted run's.
    save_records
        Save each round's record (states, replies, gradients) under ``out/records`` for
        ``fedvalue audit`` to recompute the books.
    num_gpus_per_client
        GPUs Ray gives each client actor (0: none; fractions share one GPU).
    client_mods
        Flower client mods around the clients' training (e.g. ``fixedclipping_mod`` with
        ``DifferentialPrivacyClientSideFixedClipping``); picklable, like the loader.
    claims, reject_non_finite, query_timeout, checkpoint, acceptance
        As :class:`strategies.ValuingStrategy` takes them (``acceptance``: top-k selection or
        a replayed plan, :mod:`strategies.acceptance`) (claim review, NaN/inf replies
        kept out, seconds to wait for partition ids and gradients, checkpoints for resume).
    sign_key
        An Ed25519 private key (PEM path or :class:`fedvalue.seals.Signer`) signing each
        round's seal and the final manifest (:mod:`fedvalue.seals`).
    on_valuation_progress
        Called with (round, coalitions evaluated, coalitions planned) while a round is
        valued (:class:`simulations.progress.ValuationProgress` shows it).

    Raises
    ------
    NoClientValued
        When no client of any round gave a usable reply: the ledger holds every round,
        each failed client with its reason, and the error names the reasons.

    Returns
    -------
    Run
        The ledger, rounds table and configuration as DataFrames.
    """
    check_integer("num_rounds", num_rounds)
    check_integer("num_clients", num_clients)
    config = dict(run_config or {})
    config.setdefault("seed", seed)
    config.setdefault("num_rounds", num_rounds)
    config.setdefault("num_clients", num_clients)
    config.setdefault("strategy", type(strategy).__name__)
    # The full training settings, so that the run can be read (and audited) from run.json alone.
    config.setdefault("train_config", dict(train_config or {}))
    config.setdefault("methods", list(methods))
    config.setdefault("valuation_options", dict(valuation_options or {}))
    config["versions"] = package_versions()
    if ray_address is not None:
        check_ray_address(ray_address)  # before anything is written: a refusal leaves no run directory
    if resume:
        run_dir = Path(out)
        if not (run_dir / RUN_CONFIG_FILE).exists():
            raise ValueError(f"resume: expected the directory of a run to continue, holding run.json; {run_dir} "
                             "has none.")
    else:
        run_dir = prepare_run_dir(out, overwrite=overwrite)
    try:
        valuing = ValuingStrategy(
            strategy, utility, run_dir=str(run_dir), methods=methods, sampler=sampler, seed=seed,
            noisy_clients=noisy_clients, on_round=on_round, run_config=config, flows=flows, resume=resume,
            save_records=save_records, claims=claims, reject_non_finite=reject_non_finite,
            query_timeout=query_timeout, checkpoint=checkpoint, acceptance=acceptance, sign_key=sign_key,
            on_valuation_progress=on_valuation_progress,
            **dict(valuation_options or {}),
        )
        valuing.open_books()  # bad input surfaces here, before the engine starts
    except (TypeError, ValueError):
        if not resume:  # a rejected option leaves no half-made run behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    initial = initial_arrays(model_factory())
    train_record = ConfigRecord(dict(train_config or {}))
    def main(grid: Grid) -> None:
        with seeded_server_generators(seed):
            valuing.start(grid, initial, num_rounds=num_rounds, timeout=round_timeout, train_config=train_record)

    try:
        with stop_on_signals(valuing.stop_requested):  # Ctrl-C / SIGTERM: stop after the round in flight commits
            serve(make_client_app(load_client_data, model_factory, mods=client_mods), main,
                  num_supernodes=num_clients, num_cpus_per_client=num_cpus_per_client,
                  max_parallel_clients=max_parallel_clients, ray_address=ray_address,
                  num_gpus_per_client=num_gpus_per_client)
    except (TypeError, ValueError):
        if not resume and not valuing.rounds:  # refused before any round committed: no half-made run
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    if len(valuing.rounds) < num_rounds:
        raise RuntimeError(
            f"the simulation stopped after {len(valuing.rounds)} of {num_rounds} rounds; the ledger in "
            f"{run_dir} holds the completed rounds. See the engine's log above."
        )
    return check_some_client_valued(load_run(run_dir), run_dir)


class NoClientValued(RuntimeError):
    """A run in which every sampled client failed every round."""


def check_some_client_valued(run: Run, run_dir: str | os.PathLike) -> Run:
    """``run``, or :class:`NoClientValued` naming the booked reasons when no client of any
    round was valued (nothing was aggregated: a run that only looks finished)."""
    if not (run.ledger["status"] == STATUS_OK).any():
        reasons = run.ledger.loc[run.ledger["status"].isin(PROBLEM_STATUSES), "reason"].value_counts()
        raise NoClientValued(
            f"no client gave a usable reply in any of the {len(run.rounds)} rounds, so nothing was aggregated or "
            f"valued (the ledger in {run_dir} books every failure). Reasons: "
            + "; ".join(f"{reason} ({count} rows)" for reason, count in reasons.items())
        )
    return run
