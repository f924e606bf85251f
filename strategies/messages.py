"""The server's own messages to nodes and which node a reply answers: a query message marked as the
server's (:func:`query_message`), and each reply tied to the node its instruction was sent to
(:func:`sent_nodes`, :func:`reply_node`), never to what the reply says of itself."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from flwr.app import ConfigRecord, Message, RecordDict

from strategies.protocol import CONFIG_KEY, QUERY_KEY


def sent_nodes(messages: Iterable[Message]) -> dict[str, int]:
    """message id -> the node it was sent to, for the messages the grid gave ids (it sets them
    when it pushes the messages); empty when ids are missing or repeat (an in-process grid)."""
    pairs = [(str(m.metadata.message_id), int(m.metadata.dst_node_id)) for m in messages]
    ids = [i for i, _ in pairs]
    if not ids or "" in ids or len(set(ids)) != len(ids):
        return {}
    return dict(pairs)


def reply_node(reply: Message, sent_to: Mapping[str, int]) -> int:
    """The node ``reply`` answers for: the one its instruction was sent to, else its sender."""
    node = sent_to.get(str(reply.metadata.reply_to_message_id))
    return int(reply.metadata.src_node_id) if node is None else node


def query_message(content: RecordDict, node_id: int, message_type: str, query: str) -> Message:
    """The server's own query ``query`` to ``node_id`` as a message of ``message_type``: its
    ``"config"`` carries the marker ``"fedvalue-query"`` (``content`` is not changed)."""
    records = dict(content.items())
    config = dict(records.get(CONFIG_KEY, {}))
    records[CONFIG_KEY] = ConfigRecord({**config, QUERY_KEY: query})
    return Message(RecordDict(records), dst_node_id=node_id, message_type=message_type)
