"""Power-of-Choice client selection: train the candidates with the largest local loss.

[POC] (pow-d): each round the server draws a candidate set of d clients, sends them the global
model A_{t−1}, each answers its local loss F_k(A_{t−1}) on its own training data, and the m
candidates with the largest losses train; aggregation is FedAvg's. Biasing selection towards
high-loss clients speeds convergence on clean federations ([POC] reports up to 3× faster
convergence than uniform selection).

A label-flipping client's loss on its own (wrong) labels is high at any good model, so under
noisy clients the rule prefers exactly the clients that hurt; the noisy-federation benchmark
measures what that costs.

Here the candidates are drawn uniformly without replacement (seeded by the seed and the round)
by partition id: the server learns the clients' data sizes only from their replies, so the
paper's draw with probability ∝ data size is not available before a client first trains. The
loss query travels as a Flower ``query`` message carrying A_{t−1} and the train config plus
``"local-loss": True`` (:mod:`clients.app` answers it with the mean training loss on the data the
client would train on this round); ties are broken by partition id; candidates that do not answer
within ``query_timeout`` are not selected unless too few answered.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedvalue._checks import check_integer, check_positive
from strategies.policies.sampling import ChoosesOwnClients
from strategies.replies import claimed_partition, reply_node, sent_nodes
from strategies.intake.nodes import NodeDirectory
from strategies.protocol import ARRAYS_KEY, CLIENT_RECORD_KEY, CONFIG_KEY, LOCAL_LOSS_KEY, SERVER_ROUND_KEY

#: Entropy tail of the candidate draws (its own stream beside other seeded draws of the run).
CANDIDATE_STREAM = 0x90C


class PowerOfChoice(FedAvg, ChoosesOwnClients):
    """FedAvg whose clients are the ``clients_per_round`` highest-loss of ``candidates`` queried ones.

    Parameters
    ----------
    clients_per_round
        m, the clients trained per round.
    candidates
        d ≥ m, the clients queried for their local loss per round.
    seed
        Seed of the candidate draws (round t draws from ``[seed, t]``).
    nodes
        Which node holds which partition (:class:`strategies.intake.nodes.NodeDirectory`); share the
        valuing strategy's (``IntakeSettings(nodes=...)``) so each node is asked once.
    query_timeout
        Seconds to wait for the candidates' losses.
    **fedavg
        FedAvg's own keywords (``fraction_evaluate=0.0``, ...).

    Attributes
    ----------
    losses
        Round -> {partition id: local loss} of the candidates that answered (the rule's input).
    """

    def __init__(self, clients_per_round: int, candidates: int, *, seed: int = 0, nodes: NodeDirectory | None = None,
                 query_timeout: float = 120.0, **fedavg) -> None:
        super().__init__(**fedavg)
        self.clients_per_round = check_integer("clients_per_round", clients_per_round)
        self.candidates = check_integer("candidates", candidates)
        if self.candidates < self.clients_per_round:
            raise ValueError(f"candidates: expected d >= clients_per_round={self.clients_per_round} (the m trained "
                             f"are chosen among the d queried); got {self.candidates}.")
        self.seed = int(seed)
        self.nodes = NodeDirectory() if nodes is None else nodes
        self.query_timeout = check_positive("query_timeout", query_timeout)
        self.losses: dict[int, dict[int, float]] = {}

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the losses seen (node ids are the engine's: never restored)."""
        return {"losses": {str(t): {str(c): v for c, v in by_client.items()} for t, by_client in self.losses.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.losses = {int(t): {int(c): float(v) for c, v in by_client.items()}
                       for t, by_client in dict(state.get("losses", {})).items()}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Query d candidates for their loss at A_{t−1}; train message to the m highest."""
        if self.fraction_train == 0.0:
            return []
        partition_to_node = self.nodes.partition_map(grid, self.query_timeout)
        ids = sorted(partition_to_node)
        if self.candidates > len(ids):
            raise ValueError(f"candidates: expected at most the {len(ids)} connected clients; got {self.candidates}.")
        rng = np.random.default_rng([self.seed, server_round, CANDIDATE_STREAM])
        drawn = sorted(int(c) for c in rng.choice(ids, size=self.candidates, replace=False))
        train_config = ConfigRecord({**dict(config), SERVER_ROUND_KEY: server_round})
        losses = self._query_losses(grid, arrays, train_config, {c: partition_to_node[c] for c in drawn})
        self.losses[server_round] = losses
        ranked = sorted(losses, key=lambda c: (-losses[c], c))
        ranked += [c for c in drawn if c not in losses]  # too few answered: the silent ones fill the round
        chosen = sorted(ranked[:self.clients_per_round])
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: train_config})
        return self._construct_messages(record, [partition_to_node[c] for c in chosen], MessageType.TRAIN)

    def _query_losses(self, grid: Grid, arrays: ArrayRecord, config: ConfigRecord,
                      candidates: dict[int, int]) -> dict[int, float]:
        """{partition id: local loss} of the candidates that answered with a finite loss."""
        query_config = ConfigRecord({**dict(config), LOCAL_LOSS_KEY: True})
        messages = [Message(RecordDict({ARRAYS_KEY: arrays, CONFIG_KEY: query_config}), dst_node_id=node,
                            message_type=MessageType.QUERY) for node in candidates.values()]
        sent_to = {node: client for client, node in candidates.items()}
        losses = {}
        replies = list(grid.send_and_receive(messages, timeout=self.query_timeout))
        message_nodes = sent_nodes(messages)
        for reply in replies:
            if reply.has_error():
                continue
            client, _ = claimed_partition(reply.content)
            loss = reply.content.config_records.get(CLIENT_RECORD_KEY, {}).get(LOCAL_LOSS_KEY)
            node = reply_node(reply, message_nodes)
            # Keyed by the node the query was sent to: a reply cannot speak for another client.
            if sent_to.get(node) != client or isinstance(loss, bool) or not isinstance(loss, (int, float)):
                continue
            if math.isfinite(loss):
                losses[client] = float(loss)
        return losses

    def __repr__(self) -> str:
        return f"PowerOfChoice(clients_per_round={self.clients_per_round}, candidates={self.candidates})"
