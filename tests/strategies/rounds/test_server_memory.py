"""The server keeps one round in memory at a time: over many rounds, what the valuing strategy holds
grows only by the rounds' rows, never by a round's replies, record, game or coalition cache.

The run goes through an in-process grid that keeps nothing it delivers (no Ray), with a run
directory, so that records, ledger rows, seals and checkpoints are written as in a real run. The
Python heap is traced (:mod:`tracemalloc`) after each round commits; its growth per round from
round 5 to round 20 is compared with the size of one reply's arrays, which any per-round retention
of a reply, a record or a game would exceed.
"""

from __future__ import annotations

import gc
import logging
import tracemalloc

import numpy as np
import torch
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedvalue.scoring.torch_utilities import TorchModelUtility
from strategies import PartitionSampler, ValuingStrategy
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from tests.strategies.harness.inprocess import InProcessGrid

NUM_FEATURES, NUM_CLASSES = 100, 30
NODE_OF = {pid: 500 + pid for pid in range(12)}
PID_OF = {node: pid for pid, node in NODE_OF.items()}
CLIENTS_PER_ROUND = 6
#: Rounds between which the heap's growth is measured: the first rounds warm caches up (imports, torch's dispatch).
FIRST_MEASURED_ROUND, LAST_MEASURED_ROUND = 5, 20
#: One reply's arrays: a weight matrix and a bias of float32.
REPLY_BYTES = 4 * (NUM_FEATURES + 1) * NUM_CLASSES


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(NUM_FEATURES, NUM_CLASSES)


def perturbed_reply(message: Message, node_id: int) -> RecordDict:
    """A client's reply: its partition id to a query; to a train message, the arrays it was sent moved by
    noise of its own (no training: the server's memory is measured, not the clients')."""
    pid = PID_OF[node_id]
    if message.metadata.message_type == MessageType.QUERY:
        return RecordDict({"client": ConfigRecord({"partition-id": pid})})
    start = arrays_to_numpy(message.content["arrays"])
    noise = np.random.default_rng(pid)
    moved = {key: (value + noise.normal(scale=0.1, size=value.shape)).astype(value.dtype) for key, value in start.items()}
    return RecordDict({"arrays": numpy_to_arrays(moved), "metrics": MetricRecord({"num-examples": 10 + pid}),
                       "client": ConfigRecord({"partition-id": pid})})


class ForgetfulGrid(InProcessGrid):
    """The in-process grid without its list of sent messages, which would itself grow every round."""

    def send_and_receive(self, messages, *, timeout=None):
        return [Message(self.handler(m, m.metadata.dst_node_id), reply_to=m) for m in messages]


def heap_after_each_round(run_dir: str, num_rounds: int) -> dict[int, int]:
    """Traced Python heap bytes once each round of a valued FedAvg run has committed (collected first)."""
    rng = np.random.default_rng(7)
    utility = TorchModelUtility(make_model(), rng.normal(size=(100, NUM_FEATURES)).astype(np.float32),
                                rng.integers(0, NUM_CLASSES, 100))
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=run_dir, seed=0,
                               sampler=PartitionSampler(CLIENTS_PER_ROUND, schedule="random", seed=1))
    heap: dict[int, int] = {}

    def measure(row) -> None:
        gc.collect()
        heap[row.round] = tracemalloc.get_traced_memory()[0]

    strategy.on_round = measure
    initial = numpy_to_arrays({k: v.detach().numpy() for k, v in make_model().state_dict().items()})
    started_here = not tracemalloc.is_tracing()
    if started_here:
        tracemalloc.start()
    try:
        strategy.start(ForgetfulGrid(NODE_OF.values(), perturbed_reply), initial, num_rounds=num_rounds, timeout=10)
    finally:
        if started_here:
            tracemalloc.stop()
    assert len(strategy.rounds) == num_rounds
    return heap


def test_the_server_heap_does_not_grow_by_a_reply_a_round(tmp_path, monkeypatch):
    # pytest keeps every log record it captures (Flower logs each round): the log still reaches Flower's console.
    monkeypatch.setattr(logging.getLogger("flwr"), "propagate", False)
    heap = heap_after_each_round(str(tmp_path / "run"), LAST_MEASURED_ROUND)
    rounds = LAST_MEASURED_ROUND - FIRST_MEASURED_ROUND
    growth_per_round = (heap[LAST_MEASURED_ROUND] - heap[FIRST_MEASURED_ROUND]) / rounds
    # Measured: 2.0 KiB a round (the committed rounds' rows, Flower's per-round metrics, small objects of torch and
    # numpy); with every round's record kept, 91 KiB a round. One reply's arrays kept a round would add 11.8 KiB.
    assert growth_per_round < REPLY_BYTES / 2, (
        f"the server's traced heap grew by {growth_per_round / 1024:.1f} KiB a round from round {FIRST_MEASURED_ROUND} "
        f"to {LAST_MEASURED_ROUND}; one reply's arrays are {REPLY_BYTES / 1024:.1f} KiB: something keeps every round")
