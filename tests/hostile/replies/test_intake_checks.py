"""The intake's checks on hand-built reply Messages (no engine): each field's rule, identity
from the node a message was sent to, and the node directory's query path."""

from __future__ import annotations

from collections.abc import Callable
from uuid import uuid4

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from strategies.intake.round_intake import entry, take_in
from strategies.intake.nodes import NodeDirectory
from strategies.arrays import numpy_to_arrays
from strategies.replies import ClientReply, read_reply
from strategies.reply_checks import MAX_WEIGHT, array_problems, id_problem, loss_problem, weight_problem
from strategies.hooks.flows import FlowQueries

MODEL = {"w": np.zeros((3, 2), dtype=np.float32), "b": np.zeros(2, dtype=np.float32),
         "count": np.zeros((), dtype=np.int64)}
NODES = {101: 0, 102: 1, 103: 2}  # node -> registered partition


@pytest.fixture(autouse=True)
def server_identity():
    """Messages built outside a running ServerApp need the task identity set."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def sent(node: int) -> Message:
    """A train instruction to ``node``, with the id a grid gives it when it sends it."""
    message = Message(RecordDict({"arrays": numpy_to_arrays(MODEL)}), dst_node_id=node, message_type=MessageType.TRAIN)
    message.metadata.__dict__["_message_id"] = str(uuid4())
    return message


def content(claim=None, *, fill: float = 0.5, examples=10, gradient: dict | None = None, loss=1.5) -> RecordDict:
    arrays = {k: np.full_like(v, fill) if v.dtype.kind == "f" else v for k, v in MODEL.items()}
    client = ConfigRecord({} if claim is None else {"partition-id": claim})
    records = RecordDict({"arrays": numpy_to_arrays(arrays),
                          "metrics": MetricRecord({"num-examples": examples, "train-loss": 0.1}), "client": client})
    if gradient is not None:
        records["inference-gradient"] = numpy_to_arrays(gradient)
        client["inference-loss"] = loss
    return records


def gradient_of(value: float) -> dict:
    return {k: np.full(v.shape, value, dtype=np.float32) for k, v in MODEL.items()}


def answer(instruction: Message, records: RecordDict | Error, *, signed_by: int | None = None) -> Message:
    """The reply to ``instruction``; ``signed_by``: another sender id (a SuperLink answers for a lost node)."""
    reply = Message(records, reply_to=instruction)
    if signed_by is not None:
        reply.metadata.__dict__["_src_node_id"] = signed_by
    return reply


def intake(replies, instructions, node_to_client=NODES):
    return take_in(replies, weighted_by_key="num-examples", node_to_client=node_to_client, start_arrays=MODEL,
                   targets=[int(m.metadata.dst_node_id) for m in instructions], sent=instructions)


# -- identity from the sender ----------------------------------------------------------------------------


def test_a_reply_claiming_another_id_is_failed_under_its_senders_id_and_cannot_take_the_victims_place():
    instructions = [sent(node) for node in NODES]
    # The spoofer (node 102, partition 1) replies first, claiming partition 0 with its own gradient.
    replies = [answer(instructions[1], content(0, fill=9.0, gradient=gradient_of(7.0), loss=99.0)),
               answer(instructions[0], content(0, gradient=gradient_of(1.0))),
               answer(instructions[2], content(2, gradient=gradient_of(2.0), loss=2.5))]
    taken = intake(replies, instructions)
    by_id = {r.client_id: r for r in taken.records}
    assert by_id[1].status == "failed" and by_id[1].error.startswith(
        "partition-id: the reply claims client 0; its node 102 registered partition 1")
    assert by_id[0].status == "ok" and float(by_id[0].arrays["w"].flat[0]) == 0.5
    assert list(taken.gradients) == [0, 2]  # each the sender's own, in reply order
    assert float(taken.gradients[0].gradient["w"].flat[0]) == 1.0 and taken.gradients[0].loss == 1.5
    assert all("inference-gradient" not in m.content.array_records for m in replies)  # out of every reply


@pytest.mark.parametrize("claim", ["zero", [0, 1], 0.7, True, b"2", "٣", -1, 10**18, 2.0])
def test_a_claim_that_is_not_its_nodes_integer_id_fails_the_reply(claim):
    instruction = sent(101)
    (record,) = intake([answer(instruction, content(claim))], [instruction]).records
    assert (record.client_id, record.status) == (0, "failed") and record.error.startswith("partition-id: ")


def test_an_error_reply_signed_by_the_superlink_is_booked_under_the_node_it_answers_for():
    instructions = [sent(node) for node in NODES]
    replies = [answer(instructions[0], content(0)), answer(instructions[1], Error(code=0, reason="node lost"),
                                                           signed_by=1), answer(instructions[2], content(2))]
    taken = intake(replies, instructions)
    assert [(r.client_id, r.status, r.error) for r in taken.records] == [
        (0, "ok", ""), (1, "failed", "node lost"), (2, "ok", "")]  # not "node-1", and not "no reply" as well


def test_without_a_directory_a_claim_is_used_once_and_only_when_it_is_an_integer():
    instructions = [sent(node) for node in (201, 202, 203)]
    replies = [answer(instructions[0], content(5)), answer(instructions[1], content(5)),
               answer(instructions[2], content("five"))]
    taken = intake(replies, instructions, node_to_client={})
    assert [(r.client_id, r.status) for r in taken.records] == [(5, "ok"), (5, "failed"), ("node-203", "failed")]
    assert taken.records[1].error == "duplicate reply for client 5"


# -- each field's rule -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value, why", [
    ("zero", "expected an integer; got 'zero' (str)"), (True, "expected an integer; got True (bool)"),
    (0.7, "expected an integer; got 0.7 (float)"), (b"2", "expected an integer; got b'2' (bytes)"),
    ([0, 1], "expected an integer; got [0, 1] (list)"), (-1, "expected an integer >= 0; got -1"), (0, None),
    (10**18, None)])
def test_ids(value, why):
    assert id_problem(value) == why


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0, -1, 2**60, MAX_WEIGHT + 1, 2.5, True, "3", [3],
                                   None])
def test_example_counts_that_are_not_ones(value):
    assert weight_problem(value, whole=True).startswith("expected a whole number")


@pytest.mark.parametrize("value", [1, 30, 30.0, MAX_WEIGHT])
def test_example_counts(value):
    assert weight_problem(value, whole=True) is None


def test_other_weights_may_be_fractions_but_not_past_two_to_the_53():
    assert weight_problem(0.25, whole=False) is None
    assert weight_problem(2.0**60, whole=False) == "expected a number in (0, 2**53]; got 1.152921504606847e+18"


@pytest.mark.parametrize("value, ok", [(1.5, True), (-3, True), (float("nan"), False), (1e200, False),
                                       ("low", False), (True, False), (None, False)])
def test_losses(value, ok):
    assert (loss_problem(value) is None) is ok


def arrays_like(change: Callable[[np.ndarray], np.ndarray]) -> dict:
    return {k: change(v) if k == "w" else v for k, v in MODEL.items()}


@pytest.mark.parametrize("change, fatal, numeric", [
    (lambda v: v.astype(np.complex64), "arrays['w']: expected real floating point; got complex64", None),
    (lambda v: np.full(v.shape, "x"), "arrays['w']: expected real floating point; got <U1", None),
    (lambda v: v.astype(np.int32), "arrays['w']: expected real floating point; got int32", None),
    (lambda v: v[:1], "arrays['w']: shape (1, 2) differs from the global model's (3, 2)", None),
    (lambda v: v.astype(np.float64), None, None),  # a server optimizer's float64 is real floating point
    (lambda v: np.full_like(v, np.nan), None, "non-finite values (NaN or inf) in ['w']"),
    (lambda v: np.full_like(v, 5e18), None, None),  # 6 x 2.5e37: the float32 sum of squares still holds
    (lambda v: np.full_like(v, 3e38), None, "arrays['w']: too large to aggregate (the sum of squares overflows "
                                            "float32; largest |value| 3e+38)"),
])
def test_arrays(change, fatal, numeric):
    assert array_problems(arrays_like(change), MODEL, "arrays") == (fatal, numeric)


def test_array_keys_and_the_models_own_integer_dtype():
    assert array_problems({"w": MODEL["w"]}, MODEL, "arrays")[0].startswith("arrays: keys differ from the global")
    assert array_problems({**MODEL, "count": np.ones((), dtype=np.int32)}, MODEL, "arrays")[0] == (
        "arrays['count']: expected real floating point (or the global model's int64); got int32")


def test_a_float16_model_is_judged_in_float32():
    half = {"w": np.full(1000, 100.0, dtype=np.float16)}  # sum of squares 1e7: past float16, within float32
    assert array_problems(half, half, "arrays") == (None, None)


def test_a_failed_reply_books_no_example_count_it_made_up():
    instruction = sent(101)
    record = read_reply(answer(instruction, content(0, examples=float("inf"))), "num-examples", NODES)
    assert record.status == "failed" and record.error.startswith("num-examples: expected a whole number")
    assert entry(record).num_examples is None
    assert entry(ClientReply(0, 101, "failed", metrics={"num-examples": 12})).num_examples == 12


# -- the query path --------------------------------------------------------------------------------------


class QueryGrid(Grid):
    """Answers each query with ``answers[node](message)``; gives each message an id as a grid does."""

    def __init__(self, answers: dict[int, Callable[[Message], RecordDict]]) -> None:
        self.answers = answers

    def get_node_ids(self):
        return list(self.answers)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid4())
            replies.append(Message(self.answers[int(message.metadata.dst_node_id)](message), reply_to=message))
        return replies

    def create_message(self, *args, **kwargs):
        raise NotImplementedError

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def set_run(self, run):
        pass

    @property
    def run(self):
        return None


def claiming(value) -> Callable[[Message], RecordDict]:
    return lambda message: RecordDict({"client": ConfigRecord({"partition-id": value})})


def test_the_directory_registers_only_integer_ids_that_one_node_alone_claims():
    answers = {301: claiming(0), 302: claiming("zero"), 303: claiming([0, 1]), 304: claiming(0.7),
               305: claiming(True), 306: claiming(b"2"), 307: claiming("٣"), 308: claiming(1), 309: claiming(1)}
    nodes = NodeDirectory()
    assert nodes.partition_map(QueryGrid(answers), timeout=5) == {0: 301}
    # A node claiming a registered partition later is not registered either.
    answers[310] = claiming(0)
    assert nodes.partition_map(QueryGrid(answers), timeout=5) == {0: 301}


def test_an_idle_clients_gradient_is_its_registered_nodes_and_well_formed():
    def gradient_reply(claim, value, loss=1.0) -> Callable[[Message], RecordDict]:
        return lambda message: RecordDict({
            "client": ConfigRecord({"partition-id": claim, "inference-loss": loss}),
            "inference-gradient": ArrayRecord({k: Array(v) for k, v in gradient_of(value).items()})})

    answers = {101: gradient_reply(0, 1.0), 102: gradient_reply(0, 9.0), 103: gradient_reply(2, np.nan)}
    gradients = FlowQueries().idle_gradients(QueryGrid(answers), numpy_to_arrays(MODEL), {0: 101, 1: 102, 2: 103},
                                             busy=set(), timeout=5)
    assert list(gradients) == [0]  # node 102 claimed 0 (left out), node 103's gradient is NaN (left out)
    assert float(gradients[0].gradient["w"].flat[0]) == 1.0


# -- federated evaluation --------------------------------------------------------------------------------


def test_malformed_evaluate_replies_are_left_out_and_the_others_averaged():
    from flwr.serverapp.strategy import FedAvg

    from strategies import ValuingStrategy

    def evaluation(node: int, metrics: dict) -> Message:
        instruction = Message(RecordDict(), dst_node_id=node, message_type=MessageType.EVALUATE)
        return answer(instruction, RecordDict({"metrics": MetricRecord(metrics)}))

    honest = [evaluation(101, {"num-examples": 10, "eval-loss": 1.0}), evaluation(102, {"num-examples": 30,
                                                                                       "eval-loss": 2.0})]
    hostile = [evaluation(103, {"num-examples": 10, "eval-loss": [1.0, 2.0]}),
               evaluation(104, {"num-examples": float("inf"), "eval-loss": 1.0}),
               evaluation(105, {"num-examples": 10, "eval-loss": float("nan")}),
               evaluation(106, {"num-examples": 10, "other": 1.0})]
    wrapped = ValuingStrategy(FedAvg(), lambda arrays: 0.0)
    assert wrapped.aggregate_evaluate(1, honest + hostile) == FedAvg().aggregate_evaluate(1, honest)
