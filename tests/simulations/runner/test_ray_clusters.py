"""Ray as cluster users run it: an exported RAY_ADDRESS leaves a local run local; a reply saying
its Ray worker died stops the run after the round commits, and the resumed run books what an
uninterrupted run with the same failure books; ``--valuation-workers`` says when it loses."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Error, Message
from flwr.serverapp.strategy import FedAvg

from clients import make_client_app
from simulations.runner.engine import ray_init_args
from simulations.runner.engine_settings import EngineSettings
from simulations.runner.grid import StoppableGrid, worker_lost
from simulations.runner.parallel import valuation_workers_advice
from strategies import PartitionSampler, RunInterrupted, RunSettings, ValuingStrategy
from strategies.arrays import numpy_to_arrays
from tests.strategies.harness.inprocess import InProcessGrid, set_server_identity
from tests.strategies.hooks.test_flow_books import initial_state, load_client, make_model, utility

ROOT = Path(__file__).resolve().parents[3]
DIED = "<class 'ray.exceptions.ActorDiedError'>:<'The actor died unexpectedly before finishing this task.'>"
NODES = {4001 + 3 * pid: pid for pid in range(4)}


class PushPullGrid(InProcessGrid):
    """An in-process grid answering through push/pull, as the engine's grid does (so the
    runner's stoppable grid sits on it), the real ClientApp behind it; node ``dies`` answers
    round ``dies_in``'s train message as a dead Ray worker does."""

    def __init__(self, dies: int | None = None, dies_in: int = 1) -> None:
        super().__init__(list(NODES), handler=None)
        self.client_app = make_client_app(load_client, make_model)
        self.dies, self.dies_in = dies, dies_in
        self.replies: dict[str, Message] = {}

    def push_messages(self, messages):
        from flwr.app import Context, RecordDict

        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message_id = f"m{len(self.replies)}"
            node = int(message.metadata.dst_node_id)
            config = message.content.config_records.get("config", {})
            if node == self.dies and str(message.metadata.message_type) == "train" \
                    and config.get("server-round") == self.dies_in:
                reply = Message(error=Error(code=0, reason=DIED), reply_to=message)
            else:
                context = Context(run_id=1, node_id=node, node_config={"partition-id": NODES[node]},
                                  state=RecordDict(), run_config={})
                reply = self.client_app(message, context)
            self.replies[message_id] = reply
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]


def valued(run_dir: Path, *, grid: PushPullGrid, resume: bool = False, stop_on_lost: bool = True) -> ValuingStrategy:
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility(), run_dir=str(run_dir),
                               sampler=PartitionSampler(3, seed=1), seed=1,
                               run=RunSettings(run_config={"experiment": "worker-lost"}, resume=resume))
    import threading

    stoppable = StoppableGrid(grid, threading.Event(), on_worker_lost=strategy.request_stop if stop_on_lost else None)
    strategy.start(stoppable, numpy_to_arrays(initial_state()), num_rounds=3, timeout=10,
                   train_config=ConfigRecord({"lr": 0.05, "local-epochs": 2, "batch-size": 0, "seed": 0}))
    return strategy


def test_a_dead_worker_stops_the_run_after_its_round_and_the_resumed_books_are_the_uninterrupted_ones(tmp_path):
    set_server_identity()
    dying = next(node for node, pid in NODES.items() if pid in PartitionSampler(3, seed=1).sample(1, range(4)))
    with pytest.raises(RunInterrupted) as stopped:
        valued(tmp_path / "run", grid=PushPullGrid(dies=dying))
    assert str(stopped.value) == (f"stopped because a Ray worker died (ActorDiedError: Flower keeps routing clients to "
                                  f"it) after round 1 committed in {tmp_path / 'run'}; continue it with --resume")
    assert len((tmp_path / "run" / "rounds.csv").read_text().splitlines()) == 2  # header and round 1
    valued(tmp_path / "run", grid=PushPullGrid(), resume=True)
    # The reference: the same failure in round 1, and no stop.
    valued(tmp_path / "through", grid=PushPullGrid(dies=dying), stop_on_lost=False)
    assert (tmp_path / "run" / "ledger.csv").read_bytes() == (tmp_path / "through" / "ledger.csv").read_bytes()
    assert "ActorDiedError" in (tmp_path / "run" / "ledger.csv").read_text()


def test_only_rays_own_dead_worker_errors_count():
    assert worker_lost(DIED) == "ActorDiedError"
    assert worker_lost("<class 'ray.exceptions.NodeDiedError'>:<'node lost'>") == "NodeDiedError"
    # A ClientApp's own exception naming it is the client's failure, not a lost worker.
    assert worker_lost("<class 'flwr.clientapp.client_app.ClientAppException'>:<'ray.exceptions.ActorDiedError'>") \
        is None


def test_valuation_workers_say_when_they_cost_more_than_they_save():
    digits_utility = utility()
    too_few_cores = valuation_workers_advice(digits_utility, workers=2, clients_per_round=6, rounds=5, cores=2)
    assert too_few_cores.startswith("valuation_workers: 2 Ray actors will cost more than they save on this "
                                    "machine's 2 usable cores")
    small_rounds = valuation_workers_advice(digits_utility, workers=2, clients_per_round=6, rounds=5, cores=16)
    assert "a round's 71 coalition states score in about" in small_rounds and "leave it at 0" in small_rounds
    assert valuation_workers_advice(digits_utility, workers=4, clients_per_round=6, rounds=10**9, cores=16) is None


LOCAL_RAY = """
import logging, ray
from simulations.runner.engine import ray_init_args
from simulations.runner.engine_settings import EngineSettings
class Said(logging.Handler):
    def emit(self, record):
        print(record.getMessage())
logging.getLogger("flwr").addHandler(Said())
init_args = ray_init_args(EngineSettings(max_parallel_clients=1), 4)
assert init_args["address"] == "local" and init_args["num_cpus"] == 1, init_args
ray.init(**init_args, logging_level="ERROR")
try:
    assert ray.cluster_resources()["CPU"] == 1, ray.cluster_resources()  # the CPUs asked for, on a Ray of its own
finally:
    ray.shutdown()
"""


def test_an_exported_ray_address_leaves_a_local_run_local(monkeypatch):
    """On a cluster RAY_ADDRESS is exported; a local run (no --ray-address) starts its own Ray with
    the CPUs it asks for, instead of joining that cluster (where ``num_cpus`` is refused), and
    says so once. Ray starts as the engine starts it, in a process of its own (in this one, a Ray
    another test left running would be joined instead)."""
    done = subprocess.run([sys.executable, "-c", LOCAL_RAY], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": "127.0.0.1:1"})  # no one there
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line for line in done.stdout.splitlines() if "RAY_ADDRESS" in line] == [
        "fedvalue: RAY_ADDRESS=127.0.0.1:1 is set; this run starts a local Ray of its own (to run on that cluster, "
        "pass --ray-address 127.0.0.1:1)"]
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_init_args(EngineSettings(max_parallel_clients=1), 4)["address"] == "local"  # the same without it


def fedvalue_run(out: Path, *options: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulations.cli", "run", "noisy-clients", "--out", str(out),
                           "--num-clients", "3", "--clients-per-round", "2", "--rounds", "2", "--local-epochs", "2",
                           "--hidden", "8", "--quiet", *options], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, **env})


@pytest.mark.slow
def test_ray_address_in_the_environment_changes_nothing_a_local_cli_run_books(tmp_path):
    plain = fedvalue_run(tmp_path / "plain")
    exported = fedvalue_run(tmp_path / "exported", RAY_ADDRESS="127.0.0.1:1")
    assert plain.returncode == 0 and exported.returncode == 0, exported.stderr[-3000:]
    assert "Traceback" not in exported.stderr
    for name in ("ledger.csv", "rounds.csv"):
        plain_lines = (tmp_path / "plain" / name).read_text().splitlines()
        exported_lines = (tmp_path / "exported" / name).read_text().splitlines()
        if name == "ledger.csv":
            assert plain_lines == exported_lines
        else:  # the wall-time column and the hashes covering it differ run to run
            assert [line.split(",")[:4] for line in plain_lines] == [line.split(",")[:4] for line in exported_lines]


@pytest.mark.slow
def test_the_docs_two_node_cluster_books_the_local_ledger_and_stops_by_pid(tmp_path):
    """docs/flower.md's recipe: a head and a worker node on this machine (`ray start --block`, one
    CPU each), a run joined to them, both stopped by PID; nothing they started is left, and the
    ledger is a local run's."""
    from tests.simulations.experiments.noisy_clients.flower_processes import alive, descendants, free_port

    ray_bin, port = Path(sys.executable).parent / "ray", free_port()
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's socket paths must stay short
    logs = [open(tmp_path / f"{name}.log", "w") for name in ("head", "worker")]  # noqa: SIM115 (closed below)
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--port", str(port), "--num-cpus", "1", "--temp-dir",
                             str(temp), "--block"], stdout=logs[0], stderr=subprocess.STDOUT)
    started, tree = [head], set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "now block forever" not in (tmp_path / "head.log").read_text():
            time.sleep(1)
        worker = subprocess.Popen([str(ray_bin), "start", "--address", f"127.0.0.1:{port}", "--num-cpus", "1",
                                   "--block"], stdout=logs[1], stderr=subprocess.STDOUT)
        started.append(worker)
        while time.monotonic() < deadline + 120 and "now block forever" not in (tmp_path / "worker.log").read_text():
            time.sleep(1)
        cluster = fedvalue_run(tmp_path / "cluster", "--ray-address", f"127.0.0.1:{port}")
        tree = set().union(*(descendants(p.pid) for p in started))
    finally:
        for process in reversed(started):
            process.terminate()
            process.wait(timeout=60)
        for log in logs:
            log.close()
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert tree and not [pid for pid in tree if alive(pid)]
    assert cluster.returncode == 0, cluster.stderr[-3000:]
    plain = fedvalue_run(tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert (tmp_path / "cluster" / "ledger.csv").read_bytes() == (tmp_path / "plain" / "ledger.csv").read_bytes()


def dying_client(partition_id: int, *, marker: str):
    """Partition 1's worker process dies the first time it is asked (as an OOM kill or a lost Ray
    node ends it); ``marker`` records that it did, so a resumed run's workers live."""
    if partition_id == 1 and not os.path.exists(marker):
        open(marker, "w").close()  # noqa: SIM115
        os._exit(1)
    return load_client(partition_id)


@pytest.mark.slow
def test_a_ray_worker_that_dies_stops_the_run_after_the_round_and_the_resume_finishes(tmp_path):
    from simulations.runner.api import simulate
    from strategies import RunSettings as Settings

    sampler = PartitionSampler(2, seed=1)
    first = next(t for t in range(1, 10) if 1 in sampler.sample(t, range(4)))
    options = dict(strategy=FedAvg(), model_factory=make_model, num_clients=4, num_rounds=first + 1,
                   load_client_data=functools.partial(dying_client, marker=str(tmp_path / "died")), utility=utility(),
                   sampler=sampler, train_config={"lr": 0.05, "local-epochs": 2}, seed=1, out=tmp_path / "run")
    with pytest.raises(RunInterrupted, match=rf"stopped because a Ray worker died \(ActorDiedError: Flower keeps "
                                             rf"routing clients to it\) after round {first} committed in .*run; "
                                             "continue it with --resume"):
        simulate(**options)
    run = simulate(**options, run=Settings(resume=True))
    assert list(run.rounds["round"]) == list(range(1, first + 2))
    died = run.ledger[run.ledger["status"] == "failed"]
    assert set(died["round"]) == {first} and died["reason"].str.contains("ActorDiedError").all()
