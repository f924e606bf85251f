"""An in-process Flower Grid whose nodes run a real ClientApp (no Ray, no SuperLink).

Each node is one partition: a message to node ``n`` is handed to ``client_app(message,
context)`` with ``context.node_config["partition-id"]`` set as the simulation engine sets
it, so the ClientApp's handlers, its mods and its local torch training run for real.
"""

from __future__ import annotations

from collections.abc import Mapping

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from tests.strategies.harness.inprocess import InProcessGrid


class ClientAppGrid(InProcessGrid):
    """Delivers each message to ``client_app`` as node ``node_id`` of partition ``partitions[node_id]``."""

    def __init__(self, client_app: ClientApp, partitions: Mapping[int, int]) -> None:
        super().__init__(partitions, handler=None)
        self.client_app = client_app
        self.contexts = {
            node: Context(run_id=1, node_id=node, node_config={"partition-id": pid}, state=RecordDict(),
                          run_config={})
            for node, pid in partitions.items()
        }

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            self.sent.append(message)
            replies.append(self.client_app(message, self.contexts[int(message.metadata.dst_node_id)]))
        return replies


class EngineLikeGrid(ClientAppGrid):
    """:class:`ClientAppGrid` whose nodes also hold ``num-partitions`` and whose ClientApp's
    exceptions come back as error replies, as the simulation engine and a SuperNode send them
    (a ClientApp with no handler for a message type raises); ``run_config`` reaches every node."""

    def __init__(self, client_app: ClientApp, partitions: Mapping[int, int], run_config: Mapping | None = None) -> None:
        super().__init__(client_app, partitions)
        #: (message type, error) of every exception a ClientApp raised: each is an ERROR traceback
        #: in the engine's log (and, on a SuperNode, an exit code).
        self.errors: list[tuple[str, str]] = []
        for context in self.contexts.values():
            context.node_config["num-partitions"] = len(partitions)
            context.run_config.update(run_config or {})

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            self.sent.append(message)
            try:
                replies.append(self.client_app(message, self.contexts[int(message.metadata.dst_node_id)]))
            except Exception as error:  # noqa: BLE001 - the engine turns it into an error reply
                self.errors.append((str(message.metadata.message_type), f"{type(error).__name__}: {error}"))
                replies.append(Message(error=Error(code=0, reason=f"{type(error).__name__}: {error}"),
                                       reply_to=message))
        return replies
