"""An in-process Flower Grid for strategy tests without Ray (as Flower's own strategy
tests build replies by hand): each message goes to a Python handler standing in for
the node's ClientApp."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flwr.app import Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

Handler = Callable[[Message, int], RecordDict | Error]


class InProcessGrid(Grid):
    """Delivers messages to ``handler(message, node_id)`` and returns its replies."""

    def __init__(self, node_ids: Iterable[int], handler: Handler) -> None:
        self.node_ids = list(node_ids)
        self.handler = handler
        self._run = None
        self.sent: list[Message] = []

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages):
        raise NotImplementedError("use send_and_receive")

    def pull_messages(self, message_ids):
        raise NotImplementedError("use send_and_receive")

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            self.sent.append(message)
            answer = self.handler(message, message.metadata.dst_node_id)
            replies.append(Message(answer, reply_to=message))
        return replies


def set_server_identity() -> None:
    """Messages built outside a running ServerApp need the task identity set."""
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1
