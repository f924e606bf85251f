"""A round's replies taken in: what each sampled client sent, checked before anything reads it.

In order: curvature (training loss gradient and Fisher diagonal) and inference gradients
(TracIn flows) are taken out of the replies, since the inner strategy must never see them;
each reply becomes a :class:`~strategies.replies.ClientReply` of the client its sender's node
registered (:mod:`strategies.intake.nodes`), every field checked (:mod:`strategies.reply_checks`):
``failed`` when its id, weight, arrays (keys, shapes, dtypes), inference gradient, curvature
or metrics fail their checks, ``rejected`` when its arrays are NaN/inf or too large to
aggregate (booked with the harm they would have done); a second reply under a client id
already seen is failed; record names, metric keys and metric forms that differ from the
round's most common are failed; the claim review caps claimed weights (so the books and the
inner strategy see the same weight); and every sampled client whose reply never came is
booked as failed. Gradients and curvature are those of each client's one weighed reply.
:meth:`RoundIntake.record` then writes the intake down once as the round's
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
from fedvalue.run.settings import RoundSettings
from fedvalue.schema import PROBLEM_STATUSES, WEIGHED_STATUSES, ClientEntry, Status
from strategies.replies import ClientReply, read_reply, reply_node, sent_nodes, take_record
from strategies.protocol import CURVATURE_KEY, GRADIENT_KEY, NUM_EXAMPLES_KEY
from strategies.reply_checks import metric_form, metric_problem, shown, weight_problem


@dataclass
class RoundIntake:
    """The round's replies as the books take them, in reply order (missing replies last);
    ``gradients`` the inference gradients the sampled clients' replies carried."""

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

    def weighed_messages(self) -> dict:
        """client -> the message of its weighed (ok or rejected) reply, for counterfactual aggregations."""
        return {r.client_id: r.message for r in self.records if r.status in WEIGHED_STATUSES}

    def accepted(self, accepted: set) -> list:
        """The ``accepted`` clients among the valid replies, in reply order (the record's)."""
        return [r.client_id for r in self.records if r.status == Status.OK and r.client_id in accepted]

    def entries(self) -> list[ClientEntry]:
        """Every sampled client's outcome as the books take it, in reply order (:func:`entry`)."""
        return [entry(r) for r in self.records]

    def record(self, server_round: int, start_arrays: Mapping[str, np.ndarray], settings: RoundSettings,
               **fields) -> RoundRecord:
        """The round's record, made once from the intake: the books are booked from it and it is
        saved before the round's commit mark (:mod:`fedvalue.run.archive`). ``settings`` are the
        run's; ``fields`` the record's other fields (what replaying the inner strategy's
        aggregation needs, the round's facts, what the hooks note); its accepted clients are
        added once the policy chose."""
        replies: dict = {}
        for r in self.records:  # the first reply under an id (a duplicate is failed)
            if r.status in WEIGHED_STATUSES:
                replies.setdefault(r.client_id, r.arrays)
        return RoundRecord(round=server_round, start_arrays=start_arrays,
                           entries=self.entries(), replies=replies, accepted=[],
                           settings=settings, claims=[f.entry() for f in self.claim_flags],
                           loss_gradients=self.loss_gradients, fisher_diagonals=self.fisher_diagonals, **fields)


def take_in(replies: Iterable[Message], *, weighted_by_key: str, node_to_client: Mapping[int, int],
            start_arrays: Mapping[str, np.ndarray], targets: Sequence[int], claims=None,
            sent: Sequence[Message] = (), model_dtypes: Mapping[str, np.dtype] | None = None) -> RoundIntake:
    """The round's intake (module docstring); ``sent`` the round's instructions (each reply is the
    node's it was sent to), ``model_dtypes`` the model's own dtypes where they differ from the global
    state's (an integer buffer that an aggregation turned into floats)."""
    replies = list(replies)
    # Out of every reply before anything reads it: the inner strategy must never see them.
    extras = [(take_record(m, GRADIENT_KEY), take_record(m, CURVATURE_KEY)) for m in replies]
    sent_to = sent_nodes(sent)
    client_to_node = {c: n for n, c in node_to_client.items()}
    model = start_arrays if not model_dtypes else {  # shapes from the state, dtypes the model's own
        k: np.broadcast_to(np.zeros((), dtype=model_dtypes.get(k, np.asarray(v).dtype)), np.shape(v))
        if np.asarray(v).dtype.kind == "f" and model_dtypes.get(k, np.asarray(v).dtype).kind in "iu" else v
        for k, v in start_arrays.items()}
    records = [read_reply(m, weighted_by_key, node_to_client, node_id=reply_node(m, sent_to), model=model,
                          client_to_node=client_to_node, extras=extra) for m, extra in zip(replies, extras)]
    _mark_duplicate_ids(records)
    _mark_inconsistent(records)
    # Capped claims reach the books and the inner strategy alike, so v_t(I_t) stays U(A_t).
    claim_flags = [] if claims is None else claims.review(records)
    # A sampled client whose reply never came (timeout, lost worker) is booked, not forgotten.
    replied = {r.node_id for r in records}
    records += [
        ClientReply(node_to_client.get(node, f"node-{node}"), node, Status.FAILED,
                    error="no reply within the round's timeout")
        for node in targets if node not in replied
    ]
    # Bound to the sender's one weighed reply (intake fails any later one under its id).
    weighed = [r for r in records if r.status in WEIGHED_STATUSES]
    gradients = {r.client_id: r.gradient for r in weighed if r.gradient is not None}
    curvature = {r.client_id: r.curvature for r in weighed if r.curvature is not None}
    return RoundIntake(records, gradients, claim_flags, {c: v.gradient for c, v in curvature.items()},
                       {c: v.fisher for c, v in curvature.items()})


def entry(record: ClientReply) -> ClientEntry:
    """A reply as the books take it: its example count is its weight when the strategy
    weighs by examples, else what it reported (when that is an example count at all)."""
    if record.status == Status.OK and record.by_examples:
        num_examples = int(record.weight)
    else:
        reported = record.metrics.get(NUM_EXAMPLES_KEY)
        num_examples = reported if weight_problem(reported, whole=True) is None else None
    return ClientEntry(record.client_id, record.status, record.weight, num_examples, reason(record))


def reason(record: ClientReply) -> str:
    """Why a sampled client was not valued (empty for valued clients)."""
    return record.error if record.status in PROBLEM_STATUSES else ""


def _mark_inconsistent(records: list[ClientReply]) -> None:
    """Replies Flower's aggregation would choke on are failed, not fatal: an ArrayRecord or
    MetricRecord named otherwise, metric keys, or a metric's form (a number, a list of some
    length) that differ from the round's most common (its first on ties). Keys, shapes and
    dtypes of the arrays are checked against the global model when each reply is read."""
    candidates = [r for r in records if r.status in WEIGHED_STATUSES]
    forms = [_form(r) for r in candidates]
    if not forms:
        return
    common = max(dict.fromkeys(forms), key=forms.count)
    for record, form in zip(candidates, forms):
        if form != common:
            record.status, record.error = Status.FAILED, _difference(form, common)


def _form(record: ClientReply) -> tuple:
    """What must be equal across the replies one aggregation takes (:func:`_mark_inconsistent`)."""
    content = record.message.content
    return (next(iter(content.array_records)), next(iter(content.metric_records)), tuple(sorted(record.metrics)),
            tuple(metric_form(record.metrics[k]) for k in sorted(record.metrics)))


def _difference(form: tuple, common: tuple) -> str:
    """Where a reply's :func:`_form` differs from the round's most common one, in words."""
    (arrays, metrics, keys, shapes), (common_arrays, common_metrics, common_keys, common_shapes) = form, common
    if arrays != common_arrays:
        return f"ArrayRecord {shown(arrays)}: the round's replies name it {common_arrays!r}"
    if metrics != common_metrics:
        return f"MetricRecord {shown(metrics)}: the round's replies name it {common_metrics!r}"
    if keys != common_keys:
        return f"metric keys {list(keys)} differ from {list(common_keys)}"
    key = next(k for k, a, b in zip(keys, shapes, common_shapes) if a != b)
    return (f"metrics[{key!r}]: {dict(zip(keys, shapes))[key]} where the round's replies hold "
            f"{dict(zip(common_keys, common_shapes))[key]}")


def usable_evaluations(replies: Iterable[Message], weighted_by_key: str) -> list[Message]:
    """The evaluate replies the inner strategy's ``aggregate_evaluate`` can take: error replies,
    and replies with one MetricRecord of finite values whose name, keys and forms are the
    round's most common and, when those keys hold ``weighted_by_key``, whose weight passes its
    check. The others are left out and logged (federated evaluation books nothing; a
    malformed reply must not stop the run)."""
    replies = list(replies)
    forms, dropped = {}, []
    for reply in replies:
        if reply.has_error():
            continue
        records = list(reply.content.metric_records.items())
        metrics = dict(records[0][1]) if len(records) == 1 else {}
        problem = ("expected one MetricRecord" if len(records) != 1
                   else next((p for v in metrics.values() if (p := metric_problem(v))), None))
        if problem is None:
            keys = tuple(sorted(metrics))
            forms[id(reply)] = (records[0][0], keys, tuple(metric_form(metrics[k]) for k in keys))
        else:
            dropped.append((reply, problem))
    seen = list(forms.values())
    common = max(dict.fromkeys(seen), key=seen.count) if seen else None
    for reply in replies:
        if id(reply) in forms and forms[id(reply)] != common:
            dropped.append((reply, "its MetricRecord differs from the round's other replies"))
        elif id(reply) in forms and weighted_by_key in common[1]:
            weight = next(iter(reply.content.metric_records.values()))[weighted_by_key]
            problem = weight_problem(weight, whole=weighted_by_key == NUM_EXAMPLES_KEY)
            if problem is not None:
                dropped.append((reply, f"{weighted_by_key}: {problem}"))
    for reply, problem in dropped:
        log(logging.WARNING, "an evaluate reply from node %s is left out: %s", reply.metadata.src_node_id, problem)
    left_out = {id(reply) for reply, _ in dropped}
    return [reply for reply in replies if id(reply) not in left_out]


def _mark_duplicate_ids(records: list[ClientReply]) -> None:
    """A second reply claiming a client id already seen this round is not counted (the
    round record keeps one reply's arrays per client)."""
    seen = set()
    for record in records:
        if record.status in WEIGHED_STATUSES and record.client_id in seen:
            record.status, record.error = Status.FAILED, f"duplicate reply for client {record.client_id}"
        seen.add(record.client_id)

