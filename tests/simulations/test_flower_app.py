"""The Flower App (``flwr run .``): every option a run-config key, settings reaching server and
clients, refusals; ``flwr run`` on a local SuperLink (simulation runtime) and on a deployed
federation (SuperLink and SuperNodes as processes) against ``fedvalue run``'s ledger."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
from flwr.app import Context, RecordDict

from simulations.flower_app import (
    ENGINE_OPTIONS,
    OUT_KEY,
    check_federation_size,
    client_app_for,
    config_from_run_config,
    run_config_key,
)
from simulations.noisy_clients import NoisyClientsConfig
from tests.simulations.flower_processes import (
    PROJECT,
    flower_processes,
    flwr_run,
    free_port,
    write_federation,
)

PYPROJECT_CONFIG = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_every_noisy_clients_option_is_a_run_config_key_with_its_default():
    fields = {run_config_key(f.name) for f in dataclasses.fields(NoisyClientsConfig)}
    assert set(PYPROJECT_CONFIG) == fields | {OUT_KEY}
    config, out = config_from_run_config(PYPROJECT_CONFIG)
    assert config == NoisyClientsConfig() and out.endswith("fedvalue-runs/flwr-run") and "~" not in out


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
    """The one grid method the size check calls, answering a fixed federation."""

    def __init__(self, count: int) -> None:
        self.count = count

    def get_node_ids(self):
        return list(range(100, 100 + self.count))


def test_federation_size_is_checked_loudly():
    check_federation_size(NodeIds(4), 4, wait_s=0.1)
    with pytest.raises(ValueError, match="num-clients: the run config asks for 30 clients .* the federation has 2 "
                                         "SuperNodes after 0s.*options.num-supernodes = 30"):
        check_federation_size(NodeIds(2), 30, wait_s=0.1)
    with pytest.raises(ValueError, match="asks for 3 clients .* has 4 SuperNodes\\. .*num-clients=4"):
        check_federation_size(NodeIds(4), 3, wait_s=60)  # too many: no wait


def test_client_app_checks_its_partition_against_the_run_config():
    def context(partition_id, num_partitions):
        return Context(run_id=1, node_id=1, node_config={"partition-id": partition_id,
                                                          "num-partitions": num_partitions},
                       state=RecordDict(), run_config={"num-clients": 3, "rounds": 1, "clients-per-round": 1})

    with pytest.raises(ValueError, match="num-clients: the run config asks for 3 partitions; this SuperNode holds "
                                         "partition-id=3 of num-partitions=4"):
        client_app_for(context(3, 4))
    assert client_app_for(context(2, 3)) is client_app_for(context(0, 3))  # one app per run config


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
