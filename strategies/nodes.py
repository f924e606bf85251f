"""Which node holds which partition: asked from the nodes once per engine, not once per run.

Node ids are random per engine but fixed while it runs, and the ServerApp never sees
partition ids unless clients reply them (``clients.app``'s query handler does). A
:class:`NodeDirectory` asks every node it has not heard from yet and remembers the
answers, so runs served one after another by the same engine (a study's seeds and
retrains) share one directory and query the nodes once (on 2 cores a query of 30 nodes
costs 0.2–0.3 s once the actors run; a study made eight a seed).
"""

from __future__ import annotations

from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid

from strategies.records import partition_id_of


class QueryTimedOut(RuntimeError):
    """No node answered the partition query within its timeout (the run cannot sample)."""


class NodeDirectory:
    """partition id <-> node id of one engine's nodes.

    Share one between strategies only while they run on the same engine (a new engine
    draws new node ids); a node that did not answer is asked again next time.
    """

    def __init__(self) -> None:
        self.node_to_client: dict[int, int] = {}
        self.client_to_node: dict[int, int] = {}
        #: Query messages sent so far (the cost this directory saves when shared).
        self.queries_sent = 0

    def partition_map(self, grid: Grid, timeout: float) -> dict[int, int]:
        """partition id -> node id (sorted by partition id), querying the nodes not yet known,
        waiting at most ``timeout`` seconds for their replies."""
        node_ids = sorted(int(n) for n in grid.get_node_ids())
        unknown = [n for n in node_ids if n not in self.node_to_client]
        if unknown:
            queries = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in unknown]
            self.queries_sent += len(queries)
            for reply in grid.send_and_receive(queries, timeout=timeout):
                if reply.has_error():
                    continue
                client_id = partition_id_of(reply.content)
                if client_id is not None:
                    node_id = int(reply.metadata.src_node_id)
                    self.node_to_client[node_id] = client_id
                    self.client_to_node[client_id] = node_id
        if not self.client_to_node:
            raise QueryTimedOut(
                f"sampler: no client reported its partition id to the query within query_timeout={timeout:g} s; "
                "the ClientApp needs an @app.query handler replying ConfigRecord 'client' with 'partition-id' "
                "(clients.make_client_app has one). On a loaded machine raise --query-timeout."
            )
        return dict(sorted(self.client_to_node.items()))
