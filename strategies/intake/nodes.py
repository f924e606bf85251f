"""Which node holds which partition, and so who sent a reply: asked from the nodes once per engine.

Node ids are random per engine but fixed while it runs, and the ServerApp never sees
partition ids unless clients reply them (``clients.app``'s query handler does). A
:class:`NodeDirectory` asks every node it has not heard from yet and remembers the
answers, so runs served one after another by the same engine (a study's seeds and
retrains) share one directory and query the nodes once (on 2 cores a query of 30 nodes
costs 0.2–0.3 s once the actors run; a study made eight a seed).

Identity comes from the sender, not from what a reply claims. A reply answers the message
the server sent to one node (:func:`strategies.replies.reply_node`: the node its ``reply_to_message_id`` names;
a SuperLink answering for a lost node signs its error reply with its own node id), and its
client is the partition that node registered (:func:`strategies.replies.sender_identity`). A reply that claims
another id, or an id that is not an integer, is failed; it can never take another client's
place in the books. A node is not registered (and is logged) when its query reply's id is not
an integer, names a partition another node holds, or names one that another node reports in
the same query: a partition two nodes claim is no one's.

A node is asked with a ``query`` message; one that answers it with an error (a ClientApp
with no ``@app.query`` handler, as Flower's app template makes) is asked again with an
``evaluate`` message carrying the marker ``"fedvalue-query"``, which ``clients.valuation_mod``
answers before the app's evaluate handler; later queries to that node (TracIn's) go the same
way. The partitions offered to a sampler are those of the nodes the grid lists now: a node
that is gone (a SuperNode that stopped; the SuperLink no longer lists it) is not chosen, and
a node that joins later may take over the partition of a node that is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from flwr.app import MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.logger import log

from fedvalue.run.rundir import printable
from strategies.replies import claimed_partition, query_message, reply_node, send_in_batches, sent_nodes
from strategies.protocol import DIRECTORY_QUERY, PARTITION_ID_KEY


class QueryTimedOut(RuntimeError):
    """No node reported its partition id to the server's query (the run cannot sample): the nodes
    refused it (each answered with an error), answered without an id, or did not answer within
    the query timeout. The message says which, with the first error, and what to change.

    ``str(error)`` names the knob of an own ServerApp (``IntakeSettings(query_timeout=...)``);
    :meth:`said_with` names another (a simulation's ``query_timeout``, ``--query-timeout`` on the
    command line)."""

    def __init__(self, nodes: int, refused: Mapping[str, tuple[int, str]], unnamed: int, silent: int,
                 timeout: float) -> None:
        self.nodes, self.refused, self.unnamed, self.silent, self.timeout = nodes, dict(refused), unnamed, silent, timeout
        super().__init__(self.said_with("IntakeSettings(query_timeout=…)"))

    def __reduce__(self):
        return type(self), (self.nodes, self.refused, self.unnamed, self.silent, self.timeout)

    def said_with(self, knob: str) -> str:
        """The message, naming ``knob`` as the setting that gives the nodes longer to answer."""
        what = []
        asked = {MessageType.QUERY: "refused it", MessageType.EVALUATE: "refused it again as an evaluate message"}
        for kind, (count, first) in self.refused.items():
            what.append(f"{count} of {self.nodes} nodes {asked.get(kind, 'refused it')} (first error: {first})")
        if self.unnamed:
            what.append(f"{self.unnamed} of {self.nodes} nodes answered without a partition id the server "
                        f"could register (a ConfigRecord 'client' holding '{PARTITION_ID_KEY}')")
        if self.silent:
            what.append(f"{self.silent} of {self.nodes} nodes did not answer within {self.timeout:g} s")
        if not what:
            what.append("the grid lists no node")
        fixes = []
        if self.refused or self.unnamed:
            fixes.append("the ClientApp must answer it: give it clients.valuation_mod (ClientApp(mods=[valuation_mod()]) "
                         "and app.query()(valuation_query)), or an @app.query handler replying ConfigRecord 'client' "
                         f"with '{PARTITION_ID_KEY}' (clients.make_client_app has one)")
        if self.silent:
            fixes.append(f"nodes that are slow to start (a loaded machine) need longer: raise {knob}")
        advice = "; ".join(fixes)
        return (f"sampler: no node reported its partition id to the server's query: {'; '.join(what)}. "
                f"{advice[:1].upper()}{advice[1:]}.")


class NodeDirectory:
    """partition id <-> node id of one engine's nodes.

    Share one between strategies only while they run on the same engine (a new engine
    draws new node ids); a node that did not answer, or answered with an id that is not
    one, is asked again next time.
    """

    def __init__(self) -> None:
        self.node_to_client: dict[int, int] = {}
        self.client_to_node: dict[int, int] = {}
        #: The message type each registered node answers the server's queries with.
        self.query_types: dict[int, str] = {}
        #: Query messages sent so far (the cost this directory saves when shared).
        self.queries_sent = 0

    def partition_map(self, grid: Grid, timeout: float, batch: int | None = None) -> dict[int, int]:
        """partition id -> node id of the nodes the grid lists now (sorted by partition id),
        querying the nodes not yet known, ``batch`` at a time (None: all at once;
        :func:`strategies.replies.send_in_batches`), waiting at most ``timeout`` seconds for their replies."""
        live = sorted(int(n) for n in grid.get_node_ids())
        unknown = [n for n in live if n not in self.node_to_client]
        refusals: dict[str, tuple[int, str]] = {}
        answers: dict[int, tuple[RecordDict, str]] = {}
        if unknown:
            answers, refused = self._ask(grid, unknown, MessageType.QUERY, timeout, batch)
            if refused:  # no query handler: ask as evaluate, which clients.valuation_mod answers
                refusals[MessageType.QUERY] = (len(refused), refused[0][1])
                again, refused = self._ask(grid, [node for node, _ in refused], MessageType.EVALUATE, timeout,
                                          batch)
                answers.update(again)
                if refused:
                    refusals[MessageType.EVALUATE] = (len(refused), refused[0][1])
            self._register(answers, set(live))
        if not self.client_to_node:
            refused_nodes = refusals.get(MessageType.EVALUATE, refusals.get(MessageType.QUERY, (0, "")))[0]
            raise QueryTimedOut(len(live), refusals, unnamed=len(answers),
                                silent=max(0, len(unknown) - len(answers) - refused_nodes), timeout=timeout)
        return {client: node for client, node in sorted(self.client_to_node.items()) if node in set(live)}

    def query_type(self, node_id: int) -> str:
        """The message type the server's queries to ``node_id`` go as (``query`` unless it
        answered only the ``evaluate`` form)."""
        return self.query_types.get(node_id, MessageType.QUERY)

    def _ask(self, grid: Grid, nodes: list[int], message_type: str, timeout: float, batch: int | None = None
             ) -> tuple[dict[int, tuple[RecordDict, str]], list[tuple[int, str]]]:
        """The directory query to ``nodes`` as ``message_type``: (node -> (answer, type)) for
        the nodes that answered, and (node, error) for those that answered with an error, by node."""
        queries = [query_message(RecordDict(), n, message_type, DIRECTORY_QUERY) for n in nodes]
        self.queries_sent += len(queries)
        replies = send_in_batches(grid, queries, timeout, batch, "directory queries")
        sent_to = sent_nodes(queries)
        answers = {reply_node(r, sent_to): (r.content, message_type) for r in replies if not r.has_error()}
        refused: dict[int, str] = {}
        for reply in replies:
            node = reply_node(reply, sent_to)
            if reply.has_error() and node in nodes and node not in answers:
                refused.setdefault(node, _error_text(reply))
        return answers, sorted(refused.items())

    def _register(self, answers: Mapping[int, tuple[RecordDict, str]], live: set[int]) -> None:
        """Register the partition each answering node reports, unless the report is not an id,
        another node that is still listed holds that partition, or several nodes report it now:
        a partition two nodes claim is no one's (both logged and left unknown, so neither can
        take the other's place). A partition whose node is gone goes to the node reporting it."""
        claims = {n: claimed_partition(content) for n, (content, _) in answers.items()}
        reported = [client for client, problem in claims.values() if problem is None and client is not None]
        for node_id, (client_id, problem) in claims.items():
            holder = self.client_to_node.get(client_id)
            if problem is None and holder is not None and holder != node_id and holder in live:
                problem = f"{PARTITION_ID_KEY}: partition {client_id} is node {holder}'s"
            elif problem is None and reported.count(client_id) > 1:
                problem = f"{PARTITION_ID_KEY}: {reported.count(client_id)} nodes report partition {client_id}"
            if problem is not None:
                log(logging.WARNING, "node %s is not registered: its query reply's %s", node_id, problem)
            elif client_id is not None:
                if holder is not None and holder != node_id:  # its old node is gone
                    log(logging.WARNING, "partition %s moves from node %s, which is gone, to node %s", client_id,
                        holder, node_id)
                    del self.node_to_client[holder]
                self.node_to_client[node_id] = client_id
                self.client_to_node[client_id] = node_id
                self.query_types[node_id] = answers[node_id][1]


def _error_text(reply) -> str:
    """An error reply's reason in one line (Flower's reasons may hold a traceback)."""
    reason = " ".join(str(reply.error.reason or "").split())
    return printable(reason[:300] + ("..." if len(reason) > 300 else "")) if reason else f"code {reply.error.code}"
