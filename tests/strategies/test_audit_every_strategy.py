"""Every ``--strategy`` choice, in an honest run with failed, rejected and idle clients,
audits intact with the utility; a changed booked value does not.

Real ClientApps (with the strategy's client mods) train a small torch model in-process;
each round samples 5 of 6 clients (one idle, booked for TracIn inflow; not with
client-side DP, whose mods refuse the inference gradient beside the update), client 1
raises and client 3 sends NaN arrays. The audit books every round again from the run directory:
the FedAvg family by the weighted mean, every other strategy by replaying its own
aggregation from the state its records saved (:mod:`strategies.aggregation.reaggregate`).
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Error, Message, MessageType, RecordDict

from clients.app import make_client_app
from fedvalue.audit.checks import audit_run
from fedvalue.analysis.run_summary import load_run
from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig
from simulations.runner.inner_strategies import STRATEGIES, build_strategy, client_mods
from strategies import PartitionSampler, ValuingStrategy
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from strategies.aggregation.reaggregate import replay_aggregator

from tests.fedvalue.forgery import rechain
from strategies.book_settings import BookSettings

from tests.strategies.harness.inprocess import InProcessGrid, set_server_identity
from tests.strategies.hooks.test_flow_books import initial_state, load_client, make_model, utility
from tests.strategies.test_valuing import NODE_OF, PID_OF

CLIENTS_PER_ROUND, FAILING, NON_FINITE = 5, 1, 3


def faulty_grid(mods) -> InProcessGrid:
    app = make_client_app(load_client, make_model, mods=list(mods))

    def handler(message: Message, node_id: int):
        pid = PID_OF[node_id]
        training = message.metadata.message_type == MessageType.TRAIN
        if training and pid == FAILING:
            return Error(code=0, reason=f"client {pid} crashed")
        context = Context(run_id=1, node_id=node_id, node_config={"partition-id": pid}, state=RecordDict(),
                          run_config={})
        reply = app(message, context)
        if reply.has_error():  # e.g. a client-side DP mod refusing a gradient query: an error reply, as in Ray
            return reply.error
        content = reply.content
        if training and pid == NON_FINITE:
            arrays = arrays_to_numpy(content["arrays"])
            content["arrays"] = numpy_to_arrays({k: np.full_like(v, np.nan) for k, v in arrays.items()})
        return content

    return InProcessGrid(list(NODE_OF.values()), handler)


def strategy_of(name: str):
    # Flower's default clipped-count noise (5/20) is too small for its default noise multiplier at 5 clients.
    adaptive = {"clipped_count_stddev": 1.0} if name.endswith("adaptive") else {}
    config = NoisyClientsConfig(strategy=name, clients_per_round=CLIENTS_PER_ROUND, **adaptive)
    return lambda: build_strategy(config, CLIENTS_PER_ROUND)


@pytest.fixture(scope="module", autouse=True)
def server_identity():
    set_server_identity()


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_an_honest_run_with_failed_rejected_and_idle_clients_audits_intact(name, tmp_path):
    run_dir = tmp_path / name
    build = strategy_of(name)
    # Flower's client-side DP mods refuse a reply holding a second ArrayRecord (the inference gradient).
    flows = not name.startswith("dp-client")
    ValuingStrategy(
        build(), utility(), run_dir=str(run_dir), sampler=PartitionSampler(CLIENTS_PER_ROUND, seed=1), seed=5,
        books=BookSettings(flows=flows)
    ).start(
        faulty_grid(client_mods(name)), numpy_to_arrays(initial_state()), num_rounds=2, timeout=10,
        train_config=ConfigRecord({"lr": 0.1, "local-epochs": 1, "batch-size": 0, "seed": 0}))
    ledger = load_run(run_dir).ledger
    # Seed 1 samples clients 1 and 3 in both rounds and leaves client 2, then 5, idle.
    assert set(ledger.loc[ledger["client_id"] == str(FAILING), "status"]) == {"failed"}
    assert set(ledger.loc[ledger["client_id"] == str(NON_FINITE), "status"]) == {"rejected"}
    assert ("idle" in set(ledger["status"])) == flows
    report = audit_run(run_dir, utility=utility(), replay=replay_aggregator(build))
    assert report.intact, (report.problems, report.unverifiable)
    assert any("recomputed every value of 2 rounds" in check for check in report.checks)
    # A changed value, with the chain rewritten around it, is a different round.
    lines = (run_dir / "ledger.csv").read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.startswith("2,") and ",ads," in line and ",ok," in line)
    cells = lines[index].split(",")
    cells[3] = repr(float(cells[3]) + 1e-3)
    lines[index] = ",".join(cells)
    (run_dir / "ledger.csv").write_text("".join(lines))
    (run_dir / "ledger.parquet").unlink()
    rechain(run_dir)
    assert not audit_run(run_dir, utility=utility(), replay=replay_aggregator(build)).ok
