"""A round's replies taken in: what each sampled client sent, checked before anything reads it.

In order: curvature (training loss gradient and Fisher diagonal) and inference gradients
(TracIn flows) are taken out of the replies, since the inner strategy must never see them;
each reply becomes a :class:`~strategies.records.ClientReply`
(``failed`` when Flower's aggregation would choke on it, ``rejected`` for NaN/inf arrays); a
second reply under a client id already seen is failed; arrays whose keys or shapes differ
from the global model's, and metric keys that differ from the round's most common set, are
failed; the claim review caps claimed weights (so the books and the inner strategy see the
same weight); and every sampled client whose reply never came is booked as failed.
:func:`round_record` then writes the intake down once as the round's
:class:`fedvalue.run.archive.RoundRecord`, the single input of the books.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Message
from flwr.supercore.logger import log

from fedvalue.run.archive import RoundRecord
from fedvalue.schema import PROBLEM_STATUSES, WEIGHED_STATUSES, ClientEntry, Status
from strategies.protocol import NUM_EXAMPLES_KEY
from strategies.records import ClientReply, InferenceGradient, read_reply, take_curvature, take_inference_gradient


@dataclass
class RoundIntake:
    """The round's replies as the books take them, in reply order (missing replies last)."""

    records: list[ClientReply]
    gradients: dict = field(default_factory=dict)
    claim_flags: list = field(default_factory=list)
    #: Training loss gradients G_u and Fisher diagonals d_u, the first weighed reply's per client.
    loss_gradients: dict = field(default_factory=dict)
    fisher_diagonals: dict = field(default_factory=dict)

    @property
    def ok(self) -> list[ClientReply]:
        """The valid replies, in reply order."""
        return [r for r in self.records if r.status == Status.OK]

    def passed(self, accepted: set, reject_non_finite: bool) -> list[int]:
        """Positions of the entries whose messages the inner strategy aggregates: the accepted
        valid replies and the error replies (malformed ones would make it raise), and, unless
        ``reject_non_finite``, the NaN/inf ones."""
        passed = [k for k, r in enumerate(self.records) if (r.status == Status.OK and r.client_id in accepted)
                  or (r.message is not None and r.message.has_error())]
        if not reject_non_finite:
            passed += [k for k, r in enumerate(self.records) if r.status == Status.REJECTED]
        return passed


def take_in(replies: Iterable[Message], *, weighted_by_key: str, node_to_client: Mapping[int, int],
            start_arrays: Mapping[str, np.ndarray], targets: Sequence[int], claims=None,
            gradients: Mapping[object, InferenceGradient] = ()) -> RoundIntake:
    """The round's intake (module docstring); ``gradients`` are those idle clients already sent."""
    replies = list(replies)
    # Bound to the very reply that carried it: a client can only give curvature for the id it is booked under.
    curvature_sent = {id(message): take_curvature(message) for message in replies}
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
    curvature = {}  # the first weighed reply per client (intake fails the later ones)
    for r in records:
        if r.status in WEIGHED_STATUSES and curvature_sent.get(id(r.message)) is not None:
            curvature.setdefault(r.client_id, curvature_sent[id(r.message)])
    return RoundIntake(records, gradients, claim_flags, {c: v.gradient for c, v in curvature.items()},
                       {c: v.fisher for c, v in curvature.items()})


def entry(record: ClientReply, weighted_by_key: str) -> ClientEntry:
    """A reply as the books take it: its example count is its weight when the strategy
    weighs by examples, else what it reported."""
    ok = record.status == Status.OK
    num_examples = (int(record.weight) if ok and weighted_by_key == NUM_EXAMPLES_KEY
                    else record.metrics.get(NUM_EXAMPLES_KEY))
    return ClientEntry(record.client_id, record.status, record.weight, num_examples, reason(record))


def round_record(server_round: int, intake: RoundIntake, *, start_arrays: Mapping[str, np.ndarray],
                 accepted: set, weighted_by_key: str, flows: bool, meta: dict,
                 replay: tuple | None) -> RoundRecord:
    """The round's record, built once from the intake: the books are booked from it and it
    is saved before the round's commit mark (:mod:`fedvalue.run.archive`). ``replay`` is what
    replaying the inner strategy's aggregation needs (None: not saved; ``meta`` then says why
    when it could not be)."""
    replies: dict = {}
    for r in intake.records:  # the first reply under an id (a duplicate is failed)
        if r.status in WEIGHED_STATUSES:
            replies.setdefault(r.client_id, r.arrays)
    return RoundRecord(
        round=server_round,
        start_arrays=start_arrays,
        entries=[entry(r, weighted_by_key) for r in intake.records],
        replies=replies,
        accepted=[r.client_id for r in intake.records if r.status == Status.OK and r.client_id in accepted],
        gradients={c: g.gradient for c, g in intake.gradients.items()} if flows else {},
        losses={c: g.loss for c, g in intake.gradients.items()} if flows else {},
        meta=meta,
        claims=[f.entry() for f in intake.claim_flags],
        replay=replay,
        loss_gradients=intake.loss_gradients,
        fisher_diagonals=intake.fisher_diagonals,
    )


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

