"""A small real valued run, as its own process, for the kill-point and two-writer tests.

    python -m tests.hostile.crashes.driver RUN_DIR --key PEM [--resume]

Three clients train a linear model with the real ClientApp and torch behind an in-process
grid (no Ray: a process starts in seconds), two of them sampled per round (the third
answers TracIn's gradient query), for two rounds: FedAdam (its optimizer moments are the
checkpoint's server state), ADS and LOO, TracIn flows and first_order.csv, records, a
signing key. The global generators are seeded from the run's seed as a simulation seeds
them. A test arms a kill point (:mod:`fedvalue.run.kill_points`) through the environment.

Exit status 0 when the run finished; 2 with one ``kill_driver: error:`` line when the run
or resume was refused (ValueError).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdam
from flwr.supercore.task_identity import TaskIdentity

from clients.app import ClientData, make_client_app
from fedvalue.run.seals import Signer
from fedvalue.run.settings import RunSettings
from fedvalue.scoring.torch_utilities import TorchModelUtility
from fedvalue.valuation.settings import ValuationSettings
from simulations.runner.api import seeded_server_generators
from strategies import PartitionSampler, ValuingStrategy
from strategies.arrays import numpy_to_arrays
from strategies.book_settings import BookSettings

ROUNDS, NUM_CLIENTS, FEATURES, SEED = 2, 3, 4, 7
NODE_OF = {pid: 900 + 7 * pid for pid in range(NUM_CLIENTS)}
PID_OF = {node: pid for pid, node in NODE_OF.items()}


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 2))


def load_client(pid: int) -> ClientData:
    rng = np.random.default_rng(60 + pid)
    x = rng.normal(size=(24 + 4 * pid, FEATURES)).astype(np.float32)
    y = (x[:, 0] - 0.5 * x[:, 1] > 0).astype(np.int64)
    half = len(x) // 2
    return ClientData(pid, x[:half], y[:half], x[half:], y[half:])


class ClientAppGrid(Grid):
    """A Flower grid delivering each message to the real ClientApp as node ``dst_node_id``."""

    def __init__(self) -> None:
        self.app = make_client_app(load_client, make_model)
        self._run = None

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def push_messages(self, messages):
        raise NotImplementedError("send_and_receive delivers at once")

    def pull_messages(self, message_ids):
        raise NotImplementedError("send_and_receive delivers at once")

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self):
        return list(NODE_OF.values())

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            node = int(message.metadata.dst_node_id)
            context = Context(run_id=1, node_id=node, node_config={"partition-id": PID_OF[node]}, state=RecordDict(),
                              run_config={})
            replies.append(Message(self.app(message, context).content, reply_to=message))
        return replies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kill_driver")
    parser.add_argument("run_dir")
    parser.add_argument("--key", required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the same float sums in every process that runs it (and safe to fork)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # messages outside a ServerApp
    data = [load_client(pid) for pid in range(NUM_CLIENTS)]
    utility = TorchModelUtility(make_model(), np.concatenate([d.x_infer for d in data]),
                                np.concatenate([d.y_infer for d in data]), metric="neg_loss")
    rng = np.random.default_rng(SEED)
    start = {k: (0.1 * rng.normal(size=v.shape)).astype(np.float32) for k, v in make_model().state_dict().items()}
    try:
        strategy = ValuingStrategy(
            FedAdam(fraction_evaluate=0.0, eta=0.05), utility, run_dir=args.run_dir,
            sampler=PartitionSampler(2, schedule="random", seed=SEED), seed=SEED,
            valuation=ValuationSettings(methods=("ads", "loo")), books=BookSettings(flows=True),
            run=RunSettings(run_config={"experiment": "kill-points", "seed": SEED, "num_rounds": ROUNDS},
                            resume=args.resume, sign_key=Signer.from_file(args.key)),
        )
        with seeded_server_generators(SEED):
            strategy.start(ClientAppGrid(), numpy_to_arrays(start), num_rounds=ROUNDS, timeout=60,
                           train_config=ConfigRecord({"lr": 0.1, "local-epochs": 2, "batch-size": 0, "seed": SEED}))
    except ValueError as error:
        print(f"kill_driver: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
