"""A deployment that loses a SuperNode mid-run: a SuperLink and three SuperNodes as processes on
loopback, the App under ``flwr run``, one SuperNode SIGKILLed (with what it started) once round 1
committed. The SuperLink answers the lost node's message itself (an error reply signed with its
own node id, after the node missed its heartbeats): the books must show the failure of that one
client with Flower's reason and no other client, the sampler must not choose the lost node
again, and ``fedvalue audit`` must say intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from simulations.experiments.noisy_clients.flower_app import OUT_KEY
from strategies import PartitionSampler
from tests.simulations.experiments.noisy_clients.flower_processes import (
    BIN,
    PROJECT,
    alive,
    descendants,
    flower_processes,
    free_port,
    write_federation,
)

OPTIONS = {"seed": 3, "num-clients": 3, "rounds": 3, "clients-per-round": 2, "schedule": "random",
           "local-epochs": 2, "hidden": "8", "round-timeout": 600.0,
           "query-timeout": 600.0}  # generous: each message starts a ClientApp process (torch imports) on a shared machine


def run_config(out) -> str:
    return " ".join(f"{key}='{value}'" if isinstance(value, str) else f"{key}={value}"
                    for key, value in {OUT_KEY: str(out), **OPTIONS}.items())


def kill_tree(pid: int) -> None:
    for child in descendants(pid) | {pid}:
        if alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.slow
def test_a_supernode_killed_mid_run_books_that_one_clients_failure_and_audits_intact(tmp_path):
    sampler = PartitionSampler(OPTIONS["clients-per-round"], schedule=OPTIONS["schedule"], seed=OPTIONS["seed"])
    lost = sampler.sample(2, range(OPTIONS["num-clients"]))[0]  # a client round 2 samples
    out, port = tmp_path / "deployed", free_port()
    write_federation(tmp_path, "loopback", port)
    with flower_processes(tmp_path) as processes:
        processes.superlink(port, simulation=False)
        nodes = {k: processes.supernode(port, k, OPTIONS["num-clients"]) for k in range(OPTIONS["num-clients"])}
        log = open(processes.logs / "flwr-run.log", "w+", encoding="utf-8")  # noqa: SIM115 (closed below)
        command = subprocess.Popen([str(BIN / "flwr"), "run", ".", "loopback", "--stream", "--run-config",
                                    run_config(out)], cwd=PROJECT, env=processes.env, stdout=log,
                                   stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 900
        killed = False
        while command.poll() is None and time.monotonic() < deadline:
            processes.remember_children()
            rounds = out / "rounds.csv"
            if not killed and rounds.exists() and len(rounds.read_text().splitlines()) >= 2:
                kill_tree(nodes[lost].pid)  # round 1 committed: the node is lost before round 2 ends
                killed = True
            time.sleep(0.5)
        if command.poll() is None:
            command.kill()
        command.wait()
        log.seek(0)
        printed = log.read()
        log.close()
    assert killed, printed[-3000:]
    run_rows = pd.read_csv(out / "rounds.csv")
    assert list(run_rows["round"]) == [1, 2, 3], printed[-3000:]
    ledger = pd.read_csv(out / "ledger.csv")
    booked = {t: sorted(rows["client_id"].astype(str).unique()) for t, rows in ledger.groupby("round")}
    assert not [c for clients in booked.values() for c in clients if c.startswith("node-")]  # no phantom client
    failed = ledger[ledger["status"] == "failed"]
    assert set(failed["client_id"].astype(str)) == {str(lost)} and set(failed["round"]) == {2}
    assert failed["reason"].str.contains("Node Unavailable").all()  # Flower's reason, as the SuperLink sent it
    assert str(lost) not in booked[3]  # the sampler no longer chooses the lost node
    audit = subprocess.run([sys.executable, "-m", "simulations.cli", "audit", str(out)], cwd=PROJECT,
                           capture_output=True, text=True, timeout=600)
    assert audit.returncode == 0 and audit.stdout.rstrip().endswith("intact"), audit.stdout + audit.stderr
