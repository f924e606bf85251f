"""The Flower App (``flwr run .``): every option a run-config key, settings reaching server and
clients, refusals; ``flwr run`` on a local SuperLink (simulation runtime) and on a deployed
federation (SuperLink and SuperNodes as processes) against ``fedvalue run``'s ledger."""

from __future__ import annotations

import subprocess
import sys
import time

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.app.metadata import Metadata

from simulations.experiments.noisy_clients.flower_app import (
    ENGINE_OPTIONS,
    FROM_FEDERATION,
    NUM_CLIENTS_KEY,
    OUT_KEY,
    client_app_for,
    config_from_run_config,
    federation_size,
    one_torch_thread,
    run_config_key,
    same_ledger_command,
    with_sizes,
)
from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig
from simulations.runner import flat_fields
from tests.simulations.experiments.noisy_clients.flower_processes import (
    BIN,
    PROJECT,
    flower_env,
    flower_processes,
    flwr_run,
    free_port,
    processes_with_home,
    stop_processes_with_home,
    write_federation,
)

PYPROJECT_CONFIG = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_every_noisy_clients_option_is_a_run_config_key_with_its_default():
    fields = {run_config_key(f.name) for f in flat_fields(NoisyClientsConfig)}  # the engine options flat
    assert set(PYPROJECT_CONFIG) == fields | {OUT_KEY}
    config, out = config_from_run_config(PYPROJECT_CONFIG)
    # The sizes come from the federation (0); every other option is fedvalue run's default.
    assert config == NoisyClientsConfig(num_clients=FROM_FEDERATION, clients_per_round=FROM_FEDERATION)
    assert out.endswith("fedvalue-runs/flwr-{run_id}") and "~" not in out
    assert with_sizes(config, 30) == NoisyClientsConfig()  # 30 SuperNodes: the main job


def test_sizes_from_the_federation_value_every_client_once():
    config = config_from_run_config({"num-clients": 0, "clients-per-round": 0, "rounds": 5})[0]
    assert (with_sizes(config, 2).num_clients, with_sizes(config, 2).clients_per_round) == (2, 1)
    assert (with_sizes(config, 12).num_clients, with_sizes(config, 12).clients_per_round) == (12, 3)
    assert with_sizes(config, 7).clients_per_round == 2  # ⌈7 / 5⌉: the even schedule covers all 7
    explicit = config_from_run_config({"num-clients": 8, "clients-per-round": 3})[0]
    assert with_sizes(explicit, 2) == explicit  # a size the run config sets is kept (and checked)
    assert same_ledger_command(with_sizes(config, 2), "x") == (
        "fedvalue run noisy-clients --out DIR --num-clients 2 --clients-per-round 1")
    assert same_ledger_command(NoisyClientsConfig(hidden=(32, 16), seed=3), "x") == (
        "fedvalue run noisy-clients --out DIR --seed 3 --hidden 32,16")
    adaptive = NoisyClientsConfig(ads_method="adaptive", adaptive_decision="top-k", adaptive_top_k=2)
    assert same_ledger_command(adaptive, "x") == (  # the adaptive settings, which a default run.json leaves out
        "fedvalue run noisy-clients --out DIR --ads-method adaptive --adaptive-decision top-k --adaptive-top-k 2")


def test_run_config_values_are_typed_and_bad_ones_named():
    config, out = config_from_run_config({"hidden": "32,16", "learning-rate": 1, "methods": "ads", "out": "/x/y",
                                          "partition": "shard", "rounds": 2})
    assert config.hidden == (32, 16) and config.learning_rate == 1.0 and isinstance(config.learning_rate, float)
    assert config.methods == ("ads",) and config.partition == "shard" and config.rounds == 2 and out == "/x/y"
    with pytest.raises(ValueError, match="rounds: expected a int; got '2'"):
        config_from_run_config({"rounds": "2"})
    with pytest.raises(ValueError, match="hidden: expected comma-separated int values; got '3,a'"):
        config_from_run_config({"hidden": "3,a"})
    for name in ENGINE_OPTIONS:
        changed = {"num_cpus_per_client": 2.0, "num_gpus_per_client": 1.0, "max_parallel_clients": 2,
                   "ray_address": "auto", "valuation_workers": 2}[name]
        with pytest.raises(ValueError, match=f"{run_config_key(name)}: a fedvalue run engine option"):
            config_from_run_config({run_config_key(name): changed})


class NodeIds:
    """The one grid method the size check calls: a federation whose nodes register one by one."""

    def __init__(self, count: int, per_call: int | None = None) -> None:
        self.count, self.per_call, self.seen = count, per_call, 0

    def get_node_ids(self):
        self.seen = min(self.count, self.seen + (self.per_call or self.count))
        return list(range(100, 100 + self.seen))


def test_the_federation_size_is_read_once_stable_or_checked_loudly():
    assert federation_size(NodeIds(4), 4, wait_s=1) == 4
    assert federation_size(NodeIds(5, per_call=1), FROM_FEDERATION, stable_s=0.5, wait_s=30) == 5
    with pytest.raises(ValueError, match="num-clients: the run config asks for 30 clients .* the federation has 2 "
                                         "SuperNodes after 0s.*num-clients at 0 to take the federation's size.*"
                                         "--num-supernodes 30"):
        federation_size(NodeIds(2), 30, wait_s=0.1, stable_s=0.05)
    started = time.monotonic()
    with pytest.raises(ValueError, match="the federation has 2 SuperNodes after 1s"):
        federation_size(NodeIds(2), 30, wait_s=60, stable_s=1, simulation=True)  # all nodes came: no minute's wait
    assert time.monotonic() - started < 10
    with pytest.raises(ValueError, match="asks for 3 clients .* has 4 SuperNodes\\. .*num-clients=4"):
        federation_size(NodeIds(4), 3, wait_s=60)  # too many: no wait
    with pytest.raises(ValueError, match="no SuperNode registered within 0s"):
        federation_size(NodeIds(0), FROM_FEDERATION, wait_s=0.1)


def context(partition_id, num_partitions, **run_config):
    return Context(run_id=1, node_id=1, node_config={"partition-id": partition_id, "num-partitions": num_partitions},
                   state=RecordDict(), run_config={"rounds": 1, **run_config})


def train_message(num_clients: int) -> Message:
    metadata = Metadata(run_id=1, message_id="m", src_node_id=0, dst_node_id=1, reply_to_message_id="",
                        group_id="1", created_at=time.time(), ttl=3600.0, message_type="train")
    return Message(RecordDict({"config": ConfigRecord({NUM_CLIENTS_KEY: num_clients})}), metadata=metadata)


def test_client_app_checks_its_partition_against_the_run_config_and_the_server():
    with pytest.raises(ValueError, match="num-clients: the run asks for 3 partitions; this SuperNode holds "
                                         "partition-id=3 of num-partitions=4"):
        client_app_for(context(3, 4, **{"num-clients": 3, "clients-per-round": 1}))
    explicit = {"num-clients": 3, "clients-per-round": 3}  # what 0, 0 become with 3 SuperNodes and 1 round
    assert client_app_for(context(2, 3, **explicit)) is client_app_for(context(0, 3, **explicit))  # one per config
    # num-clients = 0: the SuperNode's num-partitions, which must be the number the server found.
    sizes = {"num-clients": 0, "clients-per-round": 0}
    assert client_app_for(context(1, 3, **sizes), train_message(3)) is client_app_for(context(0, 3, **explicit))
    with pytest.raises(ValueError, match="the run asks for 4 partitions; this SuperNode holds partition-id=1 of "
                                         "num-partitions=3"):
        client_app_for(context(1, 3, **sizes), train_message(4))


def test_clients_train_on_one_torch_thread_and_the_count_comes_back():
    threads = torch.get_num_threads()
    with one_torch_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads


# --- flwr run against fedvalue run -----------------------------------------------------------

#: Server settings (rounds, sampling, local epochs) and client settings (partitions, scheme).
OPTIONS = {"seed": 3, "num-clients": 4, "rounds": 2, "clients-per-round": 2, "schedule": "random",
           "local-epochs": 5, "partition": "pathological", "classes-per-partition": 3}


def run_config(out, options=OPTIONS) -> str:
    return " ".join(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"
                    for key, value in {OUT_KEY: str(out), **options}.items()).replace("'", '"')


def fedvalue_run_ledger(out, options=OPTIONS) -> bytes:
    flags = [item for key, value in options.items() for item in (f"--{key}", str(value))]
    subprocess.run([sys.executable, "-m", "simulations.cli", "run", "noisy-clients", "--out", str(out), "--quiet",
                    *flags], cwd=PROJECT, check=True, capture_output=True, timeout=900)
    return (out / "ledger.csv").read_bytes()


@pytest.mark.slow
def test_flwr_run_on_a_local_superlink_gives_fedvalue_runs_ledger_and_refuses_what_it_must(tmp_path):
    port = free_port()
    write_federation(tmp_path, "local-simulation", port, num_supernodes=OPTIONS["num-clients"])
    with flower_processes(tmp_path) as processes:
        processes.superlink(port, simulation=True)
        first = flwr_run(processes, "local-simulation", run_config(tmp_path / "flwr"))
        assert (tmp_path / "flwr" / "ledger.csv").exists(), first.stdout[-3000:]
        booked = (tmp_path / "flwr" / "ledger.csv").read_bytes()

        again = flwr_run(processes, "local-simulation", run_config(tmp_path / "flwr"))
        assert "already holds a run" in again.stdout, again.stdout[-3000:]
        assert (tmp_path / "flwr" / "ledger.csv").read_bytes() == booked  # refused, not deleted

        wrong_size = flwr_run(processes, "local-simulation",
                              run_config(tmp_path / "small", {**OPTIONS, "num-clients": 3}))
        assert "num-clients: the run config asks for 3 clients" in wrong_size.stdout, wrong_size.stdout[-3000:]
        assert not (tmp_path / "small").exists()

        # A budget in seconds is timed on the run's utility, as `fedvalue run` times it.
        timed = flwr_run(processes, "local-simulation",
                         run_config(tmp_path / "timed", {**OPTIONS, "valuation-budget": "30s"}))
        assert (tmp_path / "timed" / "ledger.csv").exists(), timed.stdout[-3000:]
    assert booked == fedvalue_run_ledger(tmp_path / "fedvalue")


@pytest.mark.slow
def test_a_deployed_federation_books_fedvalue_runs_ledger_and_passes_the_audit(tmp_path):
    """The docs' recipe: a SuperLink and three SuperNodes on loopback, each SuperNode given its
    partition in --node-config, then ``flwr run . loopback``."""
    options = {**OPTIONS, "num-clients": 3}
    port = free_port()
    write_federation(tmp_path, "loopback", port)
    with flower_processes(tmp_path) as processes:
        processes.superlink(port, simulation=False)
        for partition_id in range(3):
            processes.supernode(port, partition_id, 3)
        result = flwr_run(processes, "loopback", run_config(tmp_path / "deployed", options))
        assert (tmp_path / "deployed" / "ledger.csv").exists(), result.stdout[-3000:]
    audit = subprocess.run([sys.executable, "-m", "simulations.cli", "audit", str(tmp_path / "deployed")],
                           cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert audit.returncode == 0 and "intact" in audit.stdout, audit.stdout + audit.stderr
    assert (tmp_path / "deployed" / "ledger.csv").read_bytes() == fedvalue_run_ledger(tmp_path / "fedvalue", options)


@pytest.mark.slow
def test_flwr_run_on_flowers_default_federation_books_fedvalue_runs_ledger_and_leaves_nothing_running(tmp_path):
    """``flwr run .`` as a new user types it: no federation of our own (Flower writes its default
    config: a local SuperLink it starts itself, 2 SuperNodes of 2 CPUs each). The App takes its
    sizes from the federation, logs the equivalent ``fedvalue run`` command and books that
    command's ledger, byte for byte; every process Flower started is found and stopped by PID."""
    env = {**flower_env(tmp_path), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port())}
    options = {"seed": 3, "rounds": 2, "local-epochs": 5}
    out = tmp_path / "flwr"
    try:
        result = subprocess.run([str(BIN / "flwr"), "run", ".", "--stream", "--run-config", run_config(out, options)],
                                cwd=PROJECT, env=env, capture_output=True, text=True, timeout=900)
    finally:
        killed = stop_processes_with_home(env["FLWR_HOME"])
    printed = result.stdout + result.stderr
    assert (out / "ledger.csv").exists(), printed[-3000:]
    command = "fedvalue run noisy-clients --out DIR --seed 3 --num-clients 2 --rounds 2 --clients-per-round 1 " \
              "--local-epochs 5"
    assert f"the same ledger as: {command}" in printed
    assert not killed and not processes_with_home(env["FLWR_HOME"])
    same = {**options, "num-clients": 2, "clients-per-round": 1}
    assert (out / "ledger.csv").read_bytes() == fedvalue_run_ledger(tmp_path / "fedvalue", same)
