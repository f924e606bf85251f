"""The strategy's half of TracIn flows ([RECIP]), the hook of :mod:`fedvalue.rounds.kinds.flows`:
gradients of the clients not training, outflows for a selection rule, and the first-order check
of the predicted loss changes.

Sampled clients return their inference gradient g_v at A_{t−1} with their update; every
other client is asked for it by a query carrying A_{t−1}
(:meth:`FlowQueries.idle_gradients`), so it receives inflow too; the round record keeps both
(:meth:`FlowHook.note`), and the flows themselves are booked from it. Round t's predicted loss
changes Σ_u flow(u → v) are checked in round t + 1 against the losses the clients then
report at A_t (:meth:`FlowQueries.check_first_order`, the table ``first_order.csv``); the pending
check is part of the server's state a checkpoint keeps.

With a projection (``BookSettings(flows_projection_dim=k)``) the hook projects the round's
gradients and its valid replies' updates with the round's R_t as the record is made
(:func:`fedvalue.flows.projected_flows.project_round`): the record keeps k numbers a vector, and the
flows, the outflows a selection rule ranks and the predicted loss changes all come from them. The
clients still send their full gradients and the server projects them: a client could sketch its own
(O(p) with the count sketch), but every query would then carry the round's projection and the reply
checks would read a k-vector in place of the model's arrays, a second reply form for the ClientApp,
the valuation mod of one's own app and the server alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.logger import log

from fedvalue.flows.projected_flows import FlowsProjection, project_round, projected_round_flows
from fedvalue.flows.round_flows import RoundFlows, fedavg_round_flows
from fedvalue.rounds.booking import BookedRound
from fedvalue.rounds.kinds.flows import FlowsBook
from fedvalue.run.archive import RoundRecord
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.schema import FIRST_ORDER_COLUMNS, FIRST_ORDER_FILE
from strategies.arrays import arrays_to_numpy
from strategies.round_hook import HookContext, IdleClients, RoundHook, RoundView
from strategies.replies import (ClientReply, InferenceGradient, query_message, read_inference_gradient, reply_node,
                                send_in_batches, sender_identity, sent_nodes, take_record)
from strategies.acceptance_policy import OUTFLOWS
from strategies.protocol import DATA_KEY, GRADIENT_KEY, GRADIENT_QUERY


def outflows_if_all_aggregated(start_arrays: Mapping[str, np.ndarray], ok: list[ClientReply],
                               gradients: Mapping[object, InferenceGradient]) -> dict:
    """outflow_u of every valid reply, as if all of them made the round's step
    (:func:`fedvalue.flows.round_flows.fedavg_round_flows`; what ``TopK(k, "tracin_outflow")`` ranks)."""
    flows, _ = fedavg_round_flows(start_arrays, {r.client_id: r.arrays for r in ok},
                                  {r.client_id: r.weight for r in ok},
                                  {c: g.gradient for c, g in gradients.items()})
    outflow = dict(zip(flows.clients, flows.outflow.tolist()))
    return {r.client_id: outflow[r.client_id] for r in ok}


def projected_outflows_if_all_aggregated(record: RoundRecord, ok: list[ClientReply]) -> dict:
    """:func:`outflows_if_all_aggregated` from the record's projected vectors (the round's R_t)."""
    flows, _ = projected_round_flows({r.client_id: record.projected_updates[r.client_id] for r in ok},
                                     record.projected_gradients, {r.client_id: r.weight for r in ok})
    outflow = dict(zip(flows.clients, flows.outflow.tolist()))
    return {r.client_id: outflow[r.client_id] for r in ok}


class FlowQueries:
    """Gradient queries and the pending first-order check of one run.

    ``pending`` (round t, {client: (loss at A_{t−1}, predicted change)}) is part of the
    server's state: a checkpoint saves it and a resume restores it.
    """

    def __init__(self) -> None:
        self.pending: tuple[int, dict] | None = None

    def idle_gradients(self, grid: Grid, arrays: ArrayRecord, client_to_node: Mapping[int, int], busy: set[int],
                       timeout: float, query_type: Callable[[int], str] = lambda node: MessageType.QUERY,
                       config: Mapping = (), batch: int | None = None) -> dict:
        """Inference gradients at ``arrays`` of every client whose node is not in ``busy``, each
        the queried node's registered client's, asked with a message of ``query_type(node)``
        whose config carries ``config`` too (a run's data-key)
        (:meth:`strategies.intake.nodes.NodeDirectory.query_type`); a reply claiming another id, or
        whose gradient or loss fails its checks (:func:`strategies.replies.read_inference_gradient`),
        is left out and logged (that client then receives no inflow this round). At most ``batch``
        queries are in flight at a time (None: all), within ``timeout`` seconds in all; queries not
        sent by then are left out and counted in the log."""
        queried = {node: client for client, node in client_to_node.items() if node not in busy}
        queries = [
            query_message(RecordDict({"arrays": arrays, "config": ConfigRecord({**dict(config), GRADIENT_KEY: True})}),
                          node, query_type(node), GRADIENT_QUERY)
            for node in queried
        ]
        if not queries:
            return {}
        replies = send_in_batches(grid, queries, timeout, batch, "gradient queries")
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

    def expect(self, server_round: int, flows: RoundFlows, losses: Mapping[object, float]) -> None:
        """Keep round ``server_round``'s predicted loss changes (and the losses at A_{t−1}, by client)
        for the next round's check."""
        predicted = flows.predicted_loss_change()
        self.pending = (server_round, {c: (loss, float(predicted[c])) for c, loss in losses.items()})

    def check_first_order(self, losses: Mapping[object, float], ledger: LedgerWriter | None) -> None:
        """Book last round's predicted loss changes against the ``losses`` now reported at A_t."""
        if self.pending is None:
            return
        previous_round, previous = self.pending
        self.pending = None
        rows = [
            {"round": previous_round, "client_id": c, "loss_before": before, "loss_after": losses[c],
             "actual_change": losses[c] - before, "predicted_change": predicted}
            for c, (before, predicted) in previous.items() if c in losses
        ]
        if ledger is not None:
            ledger.append_table(FIRST_ORDER_FILE, FIRST_ORDER_COLUMNS, rows)


#: The key of the pending first-order check in a checkpoint's server state.
PENDING_FIRST_ORDER = "pending_first_order"


class FlowHook(RoundHook):
    """TracIn flows' hook of one run (module docstring): every round asks the sampled clients
    for their inference gradient and the idle ones by a query; the record keeps them all (with
    ``projection``, projected)."""

    offers = frozenset({OUTFLOWS})

    def __init__(self, *, query_data_key: bool = False, projection: FlowsProjection | None = None) -> None:
        self.queries = FlowQueries()
        self.query_data_key = query_data_key
        self.projection = projection
        #: What every gradient query's config carries besides the request (the run's data-key).
        self.query_config: dict = {}
        self._idle: dict = {}
        #: The round's inference gradients, idle clients' first (client -> InferenceGradient); none
        #: are kept with a projection (the record keeps them projected).
        self.gradients: dict = {}
        #: The round's inference losses at A_{t−1} (client -> summed loss), for the first-order check.
        self.losses: dict = {}

    def settings(self) -> dict:
        return {} if self.projection is None else {"flows_projection": self.projection.as_json()}

    def saved(self) -> dict:
        return {PENDING_FIRST_ORDER: self.queries.pending}

    def restore(self, saved) -> None:
        self.queries.pending = saved.get(PENDING_FIRST_ORDER)

    def train_config(self, config: ConfigRecord) -> ConfigRecord:
        """The train config asking for the inference gradient (and, carrying data-keys, the run's
        data-key kept for the queries)."""
        if self.query_data_key and DATA_KEY in config:
            self.query_config = {DATA_KEY: config[DATA_KEY]}
        return ConfigRecord({**dict(config), GRADIENT_KEY: True})

    def start_round(self, arrays: ArrayRecord, start_arrays, idle: IdleClients | None) -> None:
        self._idle = {} if idle is None else self.query(arrays, idle)

    def query(self, arrays: ArrayRecord, idle: IdleClients) -> dict:
        """Inference gradients at ``arrays`` of every client ``idle`` reaches."""
        return self.queries.idle_gradients(idle.grid, arrays, idle.partitions(), set(idle.busy), idle.timeout,
                                           idle.query_type, self.query_config, idle.batch)

    def note(self, round: RoundView) -> dict:
        gradients, self._idle = {**self._idle, **round.gradients}, {}
        self.losses = {c: g.loss for c, g in gradients.items()}
        if self.projection is None:
            self.gradients = gradients
            return {"gradients": {c: g.gradient for c, g in gradients.items()}, "losses": dict(self.losses)}
        start = round.start_arrays
        size = sum(int(np.asarray(v).size) for v in start.values())
        projected, updates = project_round(self.projection.for_round(size, round.server_round), start,
                                           {c: g.gradient for c, g in gradients.items()},
                                           {r.client_id: r.arrays for r in round.ok})
        return {"projected_gradients": projected, "projected_updates": updates, "losses": dict(self.losses)}

    def offer(self, round: RoundView, inputs) -> dict:
        if self.projection is not None:
            return {OUTFLOWS: lambda: projected_outflows_if_all_aggregated(round.record, list(round.ok))}
        gradients = self.gradients
        return {OUTFLOWS: lambda: outflows_if_all_aggregated(round.start_arrays, list(round.ok), gradients)}

    def before_commit(self, round: RoundView, books: BookedRound, ledger: LedgerWriter | None) -> None:
        """Last round's predicted loss changes meet the losses reported now, at A_{t−1}; this
        round's are kept for the next."""
        self.queries.check_first_order(self.losses, ledger)
        book = books.parts.get("flows")
        if isinstance(book, FlowsBook):
            self.queries.expect(round.server_round, book.flows, self.losses)

    def finish(self, final_arrays: ArrayRecord, idle: IdleClients, ledger: LedgerWriter | None) -> None:
        """One more gradient query at the final state gives the last round's check its actual loss change."""
        if self.queries.pending is not None:
            final = self.query(final_arrays, idle)
            self.queries.check_first_order({c: g.loss for c, g in final.items()}, ledger)


def flow_hook(context: HookContext) -> FlowHook | None:
    if not context.books.flows:
        return None
    return FlowHook(query_data_key=context.query_data_key, projection=context.books.flows_projection(context.seed))
