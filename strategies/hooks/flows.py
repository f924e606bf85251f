"""The strategy's half of TracIn flows ([RECIP]): gradients of the clients not training,
outflows for a selection rule, and the first-order check of the predicted loss changes.

Sampled clients return their inference gradient g_v at A_{t−1} with their update; every
other client is asked for it by a query carrying A_{t−1}
(:meth:`FlowQueries.idle_gradients`), so it receives inflow too. The flows themselves are
booked by :func:`fedvalue.rounds.booking.book_round` from the round record. Round t's predicted loss
changes Σ_u flow(u → v) are checked in round t + 1 against the losses the clients then
report at A_t (:meth:`FlowQueries.check_first_order`, the table ``first_order.csv``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.logger import log

from fedvalue.flows.round_flows import RoundFlows, fedavg_round_flows
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.schema import FIRST_ORDER_COLUMNS, FIRST_ORDER_FILE
from strategies.nodes import query_message, reply_node, sender_identity, sent_nodes
from strategies.protocol import DATA_KEY, GRADIENT_KEY, GRADIENT_QUERY
from strategies.arrays import arrays_to_numpy
from strategies.replies import ClientReply, InferenceGradient, read_inference_gradient, take_record


def outflows_if_all_aggregated(start_arrays: Mapping[str, np.ndarray], ok: list[ClientReply],
                               gradients: Mapping[object, InferenceGradient]) -> dict:
    """outflow_u of every valid reply, as if all of them made the round's step
    (:func:`fedvalue.flows.round_flows.fedavg_round_flows`; what ``TopK(k, "tracin_outflow")`` ranks)."""
    flows, _ = fedavg_round_flows(start_arrays, {r.client_id: r.arrays for r in ok},
                                  {r.client_id: r.weight for r in ok},
                                  {c: g.gradient for c, g in gradients.items()})
    outflow = dict(zip(flows.clients, flows.outflow.tolist()))
    return {r.client_id: outflow[r.client_id] for r in ok}


class FlowQueries:
    """Gradient queries and the pending first-order check of one run.

    ``pending`` (round t, {client: (loss at A_{t−1}, predicted change)}) is part of the
    server's state: a checkpoint saves it and a resume restores it.
    """

    def __init__(self) -> None:
        self.pending: tuple[int, dict] | None = None
        #: Entries every query's config carries besides the gradient request (a run's data-key).
        self.config: dict = {}

    def carry_data_key(self, train_config: Mapping | None) -> None:
        """Let every query carry the train config's ``data-key`` (when it has one), so that a client
        of an engine serving several runs answers from this run's data."""
        if train_config is not None and DATA_KEY in train_config:
            self.config = {DATA_KEY: train_config[DATA_KEY]}

    def idle_gradients(self, grid: Grid, arrays: ArrayRecord, client_to_node: Mapping[int, int], busy: set[int],
                       timeout: float, query_type: Callable[[int], str] = lambda node: MessageType.QUERY) -> dict:
        """Inference gradients at ``arrays`` of every client whose node is not in ``busy``, each
        the queried node's registered client's, asked with a message of ``query_type(node)``
        (:meth:`strategies.nodes.NodeDirectory.query_type`); a reply claiming another id, or
        whose gradient or loss fails its checks (:func:`strategies.replies.read_inference_gradient`),
        is left out and logged (that client then receives no inflow this round)."""
        queried = {node: client for client, node in client_to_node.items() if node not in busy}
        queries = [
            query_message(RecordDict({"arrays": arrays, "config": ConfigRecord({**self.config, GRADIENT_KEY: True})}),
                          node, query_type(node), GRADIENT_QUERY)
            for node in queried
        ]
        if not queries:
            return {}
        replies = list(grid.send_and_receive(queries, timeout=timeout))
        model, sent_to, gradients = arrays_to_numpy(arrays), sent_nodes(queries), {}
        for reply in replies:
            record, node = take_record(reply, GRADIENT_KEY), reply_node(reply, sent_to)
            client = queried.get(node)
            if record is None or client is None or client in gradients:
                continue
            _, problem = sender_identity(reply.content, node, {node: client}, {})
            read = problem or read_inference_gradient(record, reply.content, model)
            if isinstance(read, str):
                log(logging.WARNING, "client %s's inference gradient is left out: %s", client, read)
                continue
            gradients[client] = InferenceGradient(client, *read)
        return gradients

    def expect(self, server_round: int, flows: RoundFlows, gradients: Mapping[object, InferenceGradient]) -> None:
        """Keep round ``server_round``'s predicted loss changes for the next round's check."""
        predicted = flows.predicted_loss_change()
        self.pending = (server_round, {c: (g.loss, float(predicted[c])) for c, g in gradients.items()})

    def check_first_order(self, gradients: Mapping[object, InferenceGradient], ledger: LedgerWriter | None) -> None:
        """Book last round's predicted loss changes against the losses now reported at A_t."""
        if self.pending is None:
            return
        losses = {c: g.loss for c, g in gradients.items()}
        previous_round, previous = self.pending
        self.pending = None
        rows = [
            {"round": previous_round, "client_id": c, "loss_before": before, "loss_after": losses[c],
             "actual_change": losses[c] - before, "predicted_change": predicted}
            for c, (before, predicted) in previous.items() if c in losses
        ]
        if ledger is not None:
            ledger.append_table(FIRST_ORDER_FILE, FIRST_ORDER_COLUMNS, rows)
