"""A node lost mid-run, as a SuperLink reports it (fast; the slow test with real processes is
tests/simulations/experiments/noisy_clients/test_lost_supernode.py): its message of round 2 is
answered by the SuperLink itself, an error reply signed with node id 1, and from round 3 the grid
no longer lists it. The books hold that one client's failure, no phantom ``node-1``; the sampler
chooses from the nodes left and the record says which those were, so the audit's check of the
sampler's choice holds and the run audits intact."""

from __future__ import annotations

import logging

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.serverapp.strategy import FedAvg

from clients import make_client_app
from fedvalue.audit.checks import audit_run
from fedvalue.run.archive import read_round_record, round_record_paths
from fedvalue.analysis.run_summary import load_run
from strategies import PartitionSampler, RunSettings, ValuingStrategy
from strategies.intake.nodes import NodeDirectory
from strategies.arrays import numpy_to_arrays
from tests.strategies.harness.inprocess import InProcessGrid, set_server_identity
from tests.strategies.hooks.test_flow_books import initial_state, load_client, make_model, utility

NODES = {6007 + 5 * pid: pid for pid in range(4)}
UNAVAILABLE = "Error: Node Unavailable — The destination node failed to report a heartbeat within 2 × its expected interval."
SUPERLINK_NODE_ID = 1


class LosingGrid(InProcessGrid):
    """Real ClientApps behind message ids, as a SuperLink keeps them; node ``lost`` stops in round
    ``lost_in``: that round's message to it is answered by the SuperLink, and later rounds do not
    list it."""

    def __init__(self, lost: int, lost_in: int) -> None:
        super().__init__(list(NODES), handler=None)
        self.client_app = make_client_app(load_client, make_model)
        self.lost, self.lost_in, self.round = lost, lost_in, 0

    def get_node_ids(self):
        return [n for n in NODES if not (n == self.lost and self.round > self.lost_in)]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = f"m{len(self.sent)}"
            self.sent.append(message)
            node = int(message.metadata.dst_node_id)
            if node == self.lost and self.round >= self.lost_in:
                reply = Message(error=Error(code=3, reason=UNAVAILABLE), reply_to=message)
                reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID  # the SuperLink signs it
            else:
                reply = self.client_app(message, Context(run_id=1, node_id=node, node_config={"partition-id": NODES[node]},
                                                         state=RecordDict(), run_config={}))
            replies.append(reply)
        return replies


class Rounds(FedAvg):
    """FedAvg that tells the grid which round it configures (the grid's clock)."""

    def __init__(self, grid: LosingGrid) -> None:
        super().__init__(fraction_evaluate=0.0)
        self.grid = grid

    def configure_train(self, server_round, arrays, config, grid):
        self.grid.round = server_round
        return super().configure_train(server_round, arrays, config, grid)


def test_a_lost_node_is_its_clients_failure_then_no_longer_sampled_and_the_run_audits_intact(tmp_path, caplog):
    set_server_identity()
    sampler = PartitionSampler(2, seed=4)
    lost_partition = sampler.sample(2, range(4))[0]
    grid = LosingGrid(next(n for n, p in NODES.items() if p == lost_partition), lost_in=2)
    strategy = ValuingStrategy(Rounds(grid), utility(), run_dir=str(tmp_path / "run"), sampler=sampler, seed=4,
                               run=RunSettings(run_config={"experiment": "lost-node"}, checkpoint=False))
    caplog.set_level(logging.INFO, logger="flwr")
    strategy.start(grid, numpy_to_arrays(initial_state()), num_rounds=4, timeout=10,
                   train_config=ConfigRecord({"lr": 0.05, "local-epochs": 2, "batch-size": 0, "seed": 0}))
    ledger = load_run(tmp_path / "run").ledger
    failed = ledger[ledger["status"] == "failed"]
    assert set(failed["client_id"].astype(int)) == {lost_partition} and set(failed["round"]) == {2}
    assert (failed["reason"] == UNAVAILABLE).all()
    assert not ledger["client_id"].astype(str).str.startswith("node-").any()
    assert lost_partition not in set(ledger.loc[ledger["round"] > 2, "client_id"].astype(int))
    records = {t: read_round_record(path) for t, path in round_record_paths(tmp_path / "run").items()}
    assert records[2].available is None  # round 2 sampled before the node was gone
    assert list(records[3].available) == sorted(set(range(4)) - {lost_partition})
    # The run's sampler, as an audit rebuilds it from the seed, chooses from the partitions listed.
    report = audit_run(tmp_path / "run", utility=utility(),
                       sampled=lambda t, available=None: sampler.sample(t, range(4) if available is None else available))
    assert report.intact, report.verdicts()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fedvalue: round 2:")
             and "sampled clients valued" in r.getMessage()]
    kept = ledger[(ledger["round"] == 2) & (ledger["method"] == "ads") & (ledger["status"] == "ok")]
    (valued, value), = zip(kept["client_id"], kept["value"])
    assert lines == [f"fedvalue: round 2: 1 of 2 sampled clients valued, into {tmp_path / 'run'}; ads {value:.4g} "
                     f"(client {valued})"]  # one client: neither largest nor smallest
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("round 2: 1 of 2 sampled")]
    assert warned == [f"round 2: 1 of 2 sampled clients not valued: client {lost_partition} failed ({UNAVAILABLE})"]


def test_a_partition_whose_node_is_gone_moves_to_the_node_that_reports_it_next():
    """A SuperNode started again registers under a new node id and takes its partition back; a
    node claiming a partition whose node is still listed does not."""
    from flwr.app import ConfigRecord as Record

    def answer(message, node_id):
        return RecordDict({"client": Record({"partition-id": {11: 0, 12: 1, 13: 1, 14: 1}[node_id]})})

    directory, grid = NodeDirectory(), InProcessGrid([11, 12], answer)
    assert directory.partition_map(grid, timeout=1) == {0: 11, 1: 12}
    grid.node_ids = [11, 12, 13]  # 13 claims 1 while 12 is listed: refused
    assert directory.partition_map(grid, timeout=1) == {0: 11, 1: 12}
    grid.node_ids = [11, 14]  # 12 is gone; 14 reports partition 1
    assert directory.partition_map(grid, timeout=1) == {0: 11, 1: 14}
    assert directory.node_to_client == {11: 0, 14: 1}
