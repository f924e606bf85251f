"""The simulation engine: one real (small) Ray simulation (under ``-m slow``: the default suite
runs the engine in tests/examples/test_examples.py and tests/simulations/runner/), argument
checks, and the guard that releases the ServerApp when the engine stops."""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import json
import time
import typing

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.app.metadata import Metadata
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from clients import ClientData, get_model_arrays, make_client_app
from simulations.datasets.loaders import load_dataset
from simulations.datasets.partitions import partition_iid
from simulations.runner.engine import run_flower_simulation
from simulations.runner.engine_settings import (
    EngineSettings,
    check_engine_keys,
    default_max_parallel_clients,
    flat_fields,
    flat_settings,
    nest_settings,
)
from simulations.runner.grid import EngineStoppedError, StoppableGrid
from simulations.runner.config_checks import saved_config
from simulations.datasets.models import make_mlp

NUM_SUPERNODES = 4


@functools.lru_cache(maxsize=4)
def digits_partitions(num_partitions: int, seed: int):
    """Loaded once per Ray worker process (the loader runs there for every message)."""
    digits = load_dataset("digits")
    return digits, partition_iid(len(digits), num_partitions, seed=seed)


def digits_client(partition_id: int, *, num_partitions: int, seed: int, fail_partition: int = -1) -> ClientData:
    if partition_id == fail_partition:
        raise RuntimeError(f"client {partition_id} failed on purpose")
    digits, parts = digits_partitions(num_partitions, seed)
    rows = parts[partition_id]
    return ClientData(partition_id, digits.x[rows], digits.y[rows], digits.x[:0], digits.y[:0])


class RecordingFedAvg(FedAvg):
    """FedAvg that keeps, per round, who replied and which replies were errors."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rounds: list[dict] = []

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.rounds.append({
            "partition_ids": sorted(int(m.content["client"]["partition-id"]) for m in replies if not m.has_error()),
            "errors": [m.error.reason for m in replies if m.has_error()],
        })
        return super().aggregate_train(server_round, replies)


def fedavg_server(strategy: FedAvg, initial: dict[str, np.ndarray], results: dict, *, num_rounds: int) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        # A crash must never leave this thread waiting for Flower's default 3600 s.
        results["result"] = strategy.start(
            grid, ArrayRecord({key: Array(value) for key, value in initial.items()}), num_rounds=num_rounds, timeout=60,
            train_config=ConfigRecord({"lr": 0.1, "local-epochs": 2, "batch-size": 0, "seed": 0}),
        )

    return app


def run_digits(num_rounds: int, *, fail_partition: int = -1) -> tuple[RecordingFedAvg, dict, dict, float]:
    model_factory = functools.partial(make_mlp, 64, 10, hidden=(32,), seed=0)
    loader = functools.partial(digits_client, num_partitions=NUM_SUPERNODES, seed=0, fail_partition=fail_partition)
    initial = get_model_arrays(model_factory())
    strategy = RecordingFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=NUM_SUPERNODES)
    results: dict = {}
    start = time.perf_counter()
    run_flower_simulation(
        fedavg_server(strategy, initial, results, num_rounds=num_rounds),
        make_client_app(loader, model_factory),
        num_supernodes=NUM_SUPERNODES,
    )
    return strategy, initial, results, time.perf_counter() - start


@pytest.mark.slow  # the fast sibling: test_a_serverapp_wrapping_fedadam_books_its_clients in tests/examples/
# test_examples.py (a user's own ServerApp and the project's ClientApp on digits through run_flower_simulation on real
# Ray: every sampled client trains and is booked each round, FedAdam's step is the realized one, no deprecated Flower
# feature) and the pair fixture of tests/simulations/runner/test_simulate_policies.py (the same engine under simulate())
def test_real_ray_simulation_of_fedavg_on_digits(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    strategy, initial, results, seconds = run_digits(num_rounds=2)
    assert [r["partition_ids"] for r in strategy.rounds] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert [r["errors"] for r in strategy.rounds] == [[], []]
    final = results["result"].arrays.to_numpy_ndarrays()
    assert [a.shape for a in final] == [a.shape for a in initial.values()]
    assert any(not np.allclose(a, b) for a, b in zip(final, initial.values()))
    losses = results["result"].train_metrics_clientapp
    assert sorted(losses) == [1, 2] and set(losses[2]) == {"train-loss"}  # no averaged partition id
    assert not [r for r in caplog.records if "DEPRECATED FEATURE" in r.getMessage()]
    assert seconds < 60, f"the simulation took {seconds:.1f} s"


@pytest.mark.slow
def test_a_failing_client_gives_the_server_an_error_reply_and_the_others_still_count():
    strategy, _, results, _ = run_digits(num_rounds=1, fail_partition=2)
    (round_,) = strategy.rounds
    assert round_["partition_ids"] == [0, 1, 3], round_
    assert len(round_["errors"]) == 1 and "client 2 failed on purpose" in round_["errors"][0]
    assert results["result"].arrays is not None


@pytest.mark.slow
def test_an_engine_crash_raises_and_releases_the_server_thread():
    import ray

    # Ray already up with 1 CPU: Flower skips ray.init, and no 2-CPU actor fits.
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    model_factory = functools.partial(make_mlp, 64, 10, hidden=(8,), seed=0)
    strategy = FedAvg(fraction_evaluate=0.0, min_available_nodes=2)
    start = time.perf_counter()
    try:
        with pytest.raises(RuntimeError):
            run_flower_simulation(
                fedavg_server(strategy, get_model_arrays(model_factory()), {}, num_rounds=1),
                make_client_app(functools.partial(digits_client, num_partitions=2, seed=0), model_factory),
                num_supernodes=2, engine=EngineSettings(num_cpus_per_client=2),
            )
    finally:
        ray.shutdown()
    assert time.perf_counter() - start < 30  # not the strategy's 60 s timeout
    lingering = [t for t in threading.enumerate() if "server_th" in t.name]
    for thread in lingering:  # released: it ends once it polls the stop, which may be just after the raise
        thread.join(timeout=10)
    assert not [t for t in lingering if t.is_alive()]


# --- without Ray ---------------------------------------------------------------------------


class SilentGrid(Grid):
    """Accepts messages and never replies (an engine that died)."""

    def set_run(self, run) -> None: ...

    @property
    def run(self):
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        raise NotImplementedError

    def get_node_ids(self):
        return [1, 2]

    def push_messages(self, messages):
        return [f"id-{k}" for k, _ in enumerate(messages)]

    def pull_messages(self, message_ids):
        return []

    def send_and_receive(self, messages, *, timeout=None):
        raise NotImplementedError


def test_stoppable_grid_stops_waiting_when_the_engine_stops():
    stopped = threading.Event()
    grid = StoppableGrid(SilentGrid(), stopped)
    threading.Timer(0.3, stopped.set).start()
    start = time.perf_counter()
    with pytest.raises(EngineStoppedError, match="engine stopped"):
        grid.send_and_receive([object(), object()], timeout=60)
    assert time.perf_counter() - start < 5
    with pytest.raises(EngineStoppedError):
        grid.get_node_ids()


def test_node_ids_are_shown_only_once_all_supernodes_registered():
    class Registering(SilentGrid):
        def __init__(self) -> None:
            self.calls = 0

        def get_node_ids(self):
            self.calls += 1
            return list(range(min(self.calls, 4)))

    inner = Registering()
    grid = StoppableGrid(inner, threading.Event(), expected_nodes=4)
    assert grid.get_node_ids() == [0, 1, 2, 3] and inner.calls == 4
    assert grid.get_node_ids() == [0, 1, 2, 3] and inner.calls == 5  # no more waiting


def test_stoppable_grid_honours_the_timeout():
    grid = StoppableGrid(SilentGrid(), threading.Event())
    start = time.perf_counter()
    assert grid.send_and_receive([object()], timeout=0.3) == []
    assert 0.3 <= time.perf_counter() - start < 3


def test_default_parallelism_leaves_a_core_for_the_server_and_never_exceeds_the_nodes(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    assert default_max_parallel_clients(100) == 7
    assert default_max_parallel_clients(3) == 3
    assert default_max_parallel_clients(100, num_cpus_per_client=2) == 3
    assert default_max_parallel_clients(100, server_core=False) == 8
    assert default_max_parallel_clients(100, num_cpus_per_client=3, server_core=False) == 2
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    assert default_max_parallel_clients(10) == 1


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(num_supernodes=0), ValueError, "num_supernodes: expected a positive integer"),
        (dict(num_cpus_per_client=0), ValueError, "num_cpus_per_client: expected a finite number > 0"),
        (dict(max_parallel_clients=0), ValueError, "max_parallel_clients: expected a positive integer"),
        (dict(ray_address=""), ValueError, "ray_address"),
        (dict(ray_address="auto", max_parallel_clients=2), ValueError, "max_parallel_clients: cannot be set with ray_address"),
    ],
)
def test_bad_arguments_fail_before_anything_starts(kwargs, error, message):
    supernodes = kwargs.pop("num_supernodes", 2)
    with pytest.raises(error, match=message):  # the engine's options are checked when made, before anything runs
        run_flower_simulation(ServerApp(), ClientApp(), num_supernodes=supernodes, engine=EngineSettings(**kwargs))


@dataclasses.dataclass
class _NestedConfig:
    rounds: int = 5
    engine: EngineSettings = EngineSettings(num_cpus_per_client=1)
    device: str = "cpu"
    hidden: tuple[int, ...] = (4,)

    ENGINE_KEYS: typing.ClassVar[tuple[str, ...]] = ("num_cpus_per_client", "device", "max_parallel_clients")


def test_a_config_nesting_engine_options_is_flat_where_the_engine_field_stands_and_back():
    fields = flat_fields(_NestedConfig)
    assert [f.name for f in fields] == ["rounds", "num_cpus_per_client", "device", "max_parallel_clients", "hidden"]
    assert [f.default for f in fields] == [5, 1, "cpu", None, (4,)]  # the config's engine default, int kept
    config = _NestedConfig(rounds=2, engine=EngineSettings(max_parallel_clients=3), device="cuda", hidden=(8, 2))
    settings = flat_settings(config)
    assert settings == {"rounds": 2, "num_cpus_per_client": 1.0, "device": "cuda", "max_parallel_clients": 3,
                        "hidden": (8, 2)}
    assert list(settings) == [f.name for f in fields]
    assert json.dumps(flat_settings(_NestedConfig())) == ('{"rounds": 5, "num_cpus_per_client": 1, "device": "cpu", '
                                                          '"max_parallel_clients": null, "hidden": [4]}')
    assert saved_config(_NestedConfig, json.loads(json.dumps(settings))) == config  # run.json read back, flat keys
    assert _NestedConfig(**nest_settings(_NestedConfig, {"max_parallel_clients": 3})).engine == EngineSettings(
        num_cpus_per_client=1, max_parallel_clients=3)
    with pytest.raises(ValueError, match="max_parallel_clients: expected a positive integer"):
        nest_settings(_NestedConfig, {"max_parallel_clients": 0})  # checked as the engine options are made
    check_engine_keys(config)
    with pytest.raises(ValueError, match="ray_address: this simulation does not take it"):
        check_engine_keys(_NestedConfig(engine=EngineSettings(ray_address="auto")))  # run.json would not record it


def test_engine_options_are_refused_in_place_of_the_wrong_type():
    with pytest.raises(TypeError, match="engine: expected a simulations.runner.engine_settings.EngineSettings .or None.; got dict"):
        run_flower_simulation(ServerApp(), ClientApp(), num_supernodes=1, engine={"num_cpus_per_client": 1})


def test_apps_of_the_wrong_type_are_named():
    with pytest.raises(TypeError, match="server_app: expected a flwr.serverapp.ServerApp"):
        run_flower_simulation(FedAvg(), ClientApp(), num_supernodes=1)
    with pytest.raises(TypeError, match="client_app: expected a flwr.clientapp.ClientApp"):
        run_flower_simulation(ServerApp(), lambda message, context: message, num_supernodes=1)


def instruction(message_id: str) -> Message:
    metadata = Metadata(
        run_id=1, message_id=message_id, src_node_id=0, dst_node_id=1, reply_to_message_id="",
        group_id="", created_at=time.time(), ttl=60.0, message_type="train",
    )
    return Message(RecordDict(), metadata=metadata)


def test_replies_come_back_in_the_order_the_messages_were_sent():
    class ReplyingBackwards(SilentGrid):
        """Answers one pending message per pull, the last one sent first."""

        def pull_messages(self, message_ids):
            latest = max(message_ids, key=lambda i: int(i.split("-")[1]))
            return [Message(RecordDict(), reply_to=instruction(latest))]

    grid = StoppableGrid(ReplyingBackwards(), threading.Event())
    replies = grid.send_and_receive([object(), object(), object()], timeout=5)
    assert [r.metadata.reply_to_message_id for r in replies] == ["id-0", "id-1", "id-2"]
