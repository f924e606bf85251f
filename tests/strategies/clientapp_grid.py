"""An in-process Flower Grid whose nodes run a real ClientApp (no Ray, no SuperLink).

Each node is one partition: a message to node ``n`` is handed to ``client_app(message,
context)`` with ``context.node_config["partition-id"]`` set as the simulation engine sets
it, so the ClientApp's handlers, its mods and its local torch training run for real.
"""

from __future__ import annotations

from collections.abc import Mapping

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid


class ClientAppGrid(Grid):
    """Delivers each message to ``client_app`` as node ``node_id`` of partition ``partitions[node_id]``."""

    def __init__(self, client_app: ClientApp, partitions: Mapping[int, int]) -> None:
        self.client_app = client_app
        self.partitions = dict(partitions)
        self.contexts = {
            node: Context(run_id=1, node_id=node, node_config={"partition-id": pid}, state=RecordDict(),
                          run_config={})
            for node, pid in self.partitions.items()
        }
        self._run = None
        self.sent: list[Message] = []

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self):
        return list(self.partitions)

    def push_messages(self, messages):
        raise NotImplementedError("use send_and_receive")

    def pull_messages(self, message_ids):
        raise NotImplementedError("use send_and_receive")

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            self.sent.append(message)
            node = int(message.metadata.dst_node_id)
            replies.append(self.client_app(message, self.contexts[node]))
        return replies
