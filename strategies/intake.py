"""A round's replies taken in: what each sampled client sent, checked before anything reads it.

In order: inference gradients (TracIn flows) are taken out of the replies, since the inner
strategy must never see them; each reply becomes a :class:`~strategies.records.ClientReply`
(``failed`` when Flower's aggregation would choke on it, ``rejected`` for NaN/inf arrays); a
second reply under a client id already seen is failed; arrays whose keys or shapes differ
from the global model's, and metric keys that differ from the round's most common set, are
failed; the claim review caps claimed weights (so the books and the inner strategy see the
same weight); and every sampled client whose reply never came is booked as failed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Message
from flwr.supercore.logger import log

from fedvalue.schema import PROBLEM_STATUSES, WEIGHED_STATUSES, Status
from strategies.records import ClientReply, InferenceGradient, read_reply, take_inference_gradient


@dataclass
class RoundIntake:
    """The round's replies as the books take them, in reply order (missing replies last)."""

    records: list[ClientReply]
    gradients: dict = field(default_factory=dict)
    claim_flags: list = field(default_factory=list)


def take_in(replies: Iterable[Message], *, weighted_by_key: str, node_to_client: Mapping[int, int],
            start_arrays: Mapping[str, np.ndarray], targets: Sequence[int], claims=None,
            gradients: Mapping[object, InferenceGradient] = ()) -> RoundIntake:
    """The round's intake (module docstring); ``gradients`` are those idle clients already sent."""
    replies = list(replies)
    gradients = dict(gradients)
    for message in replies:  # out before anything reads the reply: the inner strategy must not see it
        gradient = take_inference_gradient(message)
        if gradient is not None:
            gradients[gradient.client_id] = gradient
    records = [read_reply(m, weighted_by_key, node_to_client) for m in replies]
    _mark_duplicate_ids(records)
    _mark_inconsistent(records, start_arrays)
    # Capped claims reach the books and the inner strategy alike, so v_t(I_t) stays U(A_t).
    claim_flags = [] if claims is None else claims.review(records, weighted_by_key)
    # A sampled client whose reply never came (timeout, lost worker) is booked, not forgotten.
    replied = {r.node_id for r in records}
    records += [
        ClientReply(node_to_client.get(node, f"node-{node}"), node, Status.FAILED,
                    error="no reply within the round's timeout")
        for node in targets if node not in replied
    ]
    return RoundIntake(records, gradients, claim_flags)


def reason(record: ClientReply) -> str:
    """Why a sampled client was not valued (empty for valued clients)."""
    return record.error if record.status in PROBLEM_STATUSES else ""


def log_problems(server_round: int, records: list[ClientReply]) -> None:
    """One log line per round naming every failed or rejected client and why."""
    problems = [f"{r.client_id} {r.status} ({r.error})" for r in records if r.status in PROBLEM_STATUSES]
    if problems:
        log(logging.WARNING, "round %s: %d of %d sampled clients not valued: %s", server_round, len(problems),
            len(records), "; ".join(problems))


def _mark_inconsistent(records: list[ClientReply], start: Mapping[str, np.ndarray]) -> None:
    """Replies Flower's aggregation would choke on are failed, not fatal: arrays whose keys or
    shapes differ from the global model's, or metric keys that differ from the most common set."""
    shapes = {k: np.shape(v) for k, v in start.items()}
    for record in records:
        if record.status in WEIGHED_STATUSES and {k: np.shape(v) for k, v in record.arrays.items()} != shapes:
            record.status, record.error = Status.FAILED, "arrays do not match the global model's keys and shapes"
    candidates = [r for r in records if r.status in WEIGHED_STATUSES]
    key_sets = [tuple(sorted(r.metrics)) for r in candidates]
    if key_sets:
        common = max(dict.fromkeys(key_sets), key=key_sets.count)  # most common; first seen on ties
        for record, keys in zip(candidates, key_sets):
            if keys != common:
                record.status, record.error = Status.FAILED, f"metric keys {list(keys)} differ from {list(common)}"


def _mark_duplicate_ids(records: list[ClientReply]) -> None:
    """A second reply claiming a client id already seen this round is not counted (the
    round record keeps one reply's arrays per client)."""
    seen = set()
    for record in records:
        if record.status in WEIGHED_STATUSES and record.client_id in seen:
            record.status, record.error = Status.FAILED, f"duplicate reply for client {record.client_id}"
        seen.add(record.client_id)

