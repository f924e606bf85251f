"""What the books do about manipulating clients (scripted attacks and the claim review).

Every attack is a scripted behaviour of the real ClientApp (clients/behaviours.py)
behind the in-process grid; ValuingStrategy books exact within-round ADS, LOO and
TracIn flows. Where an attacker's reply is a known function of an honest reply, the
reference is the same run with that client honest (same seed, same A_0, so round 1 of
both runs starts from the same state and the same inference gradients).
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from clients.app import ClientData, make_client_app
from clients.behaviours import (
    BoostedUpdate,
    ClientBehaviour,
    FreeRider,
    HonestClient,
    InflatedExampleCount,
    Replicator,
    SignFlip,
)
from fedvalue.audit.checks import audit_run
from fedvalue.analysis.run_summary import load_run
from fedvalue.valuation.round_game import weighted_mean
from fedvalue.valuation.settings import ValuationSettings
from fedvalue.scoring.torch_utilities import TorchModelUtility
from strategies import ClaimReview, PartitionSampler, ValuingStrategy
from fedvalue.rounds.booking import claim_rows
from fedvalue.schema import LedgerRow, Method, Status
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from strategies.replies import ClientReply, read_reply
from strategies.book_settings import BookSettings
from strategies.valuing_settings import IntakeSettings

from tests.strategies.harness.inprocess import InProcessGrid, set_server_identity

NUM_CLIENTS, FEATURES, CLASSES = 6, 5, 3
NODE_OF = {pid: 700 + 11 * pid for pid in range(NUM_CLIENTS)}
PID_OF = {node: pid for pid, node in NODE_OF.items()}
TRAIN_CONFIG = {"lr": 0.1, "local-epochs": 5, "batch-size": 0, "seed": 3}
ATTACKER = 0


def make_model() -> torch.nn.Module:
    model = torch.nn.Linear(FEATURES, CLASSES)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    return model


def blobs(rng: np.random.Generator, n: int, classes: int = CLASSES) -> tuple[np.ndarray, np.ndarray]:
    centers = 1.5 * np.eye(CLASSES, FEATURES)
    y = rng.integers(0, classes, size=n)
    return (centers[y] + rng.normal(size=(n, FEATURES))).astype(np.float32), y.astype(np.int64)


def own_data(pid: int, unique: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Client ``pid``'s train and inference halves; with ``unique``, only that client holds class 2."""
    classes = CLASSES if unique is None or pid == unique else CLASSES - 1
    x, y = blobs(np.random.default_rng(60 + pid), 2 * (20 + 4 * pid), classes)  # unequal sizes, unequal weights
    half = len(x) // 2
    return x[:half], y[:half], x[half:], y[half:]


def load_client(pid: int, behaviours: dict | None = None, unique: int | None = None) -> ClientData:
    x, y, x_infer, y_infer = own_data(pid, unique)
    behaviour = (behaviours or {}).get(pid, HonestClient())
    return ClientData(pid, x, y, x_infer, y_infer, behaviour=behaviour)


def utility() -> TorchModelUtility:
    x, y = blobs(np.random.default_rng(999), 400)
    return TorchModelUtility(make_model(), x, y, metric="neg_loss")


def initial_state() -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in make_model().state_dict().items()}


def client_app_grid(behaviours_of_round, unique: int | None = None) -> InProcessGrid:
    """The real ClientApp per node; ``behaviours_of_round(t)`` says who misbehaves in round t."""

    def handler(message: Message, node_id: int) -> RecordDict:
        config = message.content.config_records.get("config", {})
        behaviours = behaviours_of_round(config.get("server-round", 0))
        app = make_client_app(functools.partial(load_client, behaviours=behaviours, unique=unique), make_model)
        context = Context(run_id=1, node_id=node_id, node_config={"partition-id": PID_OF[node_id]},
                          state=RecordDict(), run_config={})
        return app(message, context).content

    return InProcessGrid(list(NODE_OF.values()), handler)


def run(tmp_path, behaviours: dict[int, ClientBehaviour] | None = None, *, rounds: int = 2,
        claims: ClaimReview | None = None, behaviours_of_round=None, unique: int | None = None):
    """Every client in every round; exact ADS and LOO, TracIn flows. Returns (strategy, result, run, grid)."""
    grid = client_app_grid(behaviours_of_round or (lambda t: behaviours or {}), unique)
    strategy = ValuingStrategy(
        FedAvg(fraction_evaluate=0.0), utility(), run_dir=str(tmp_path),
        sampler=PartitionSampler(NUM_CLIENTS, seed=0), valuation=ValuationSettings(methods=("ads", "loo")),
        books=BookSettings(flows=True), intake=IntakeSettings(claims=claims)
    )
    result = strategy.start(grid, numpy_to_arrays(initial_state()), num_rounds=rounds, timeout=60,
                            train_config=ConfigRecord(TRAIN_CONFIG))
    return strategy, result, load_run(tmp_path), grid


@pytest.fixture(scope="module")
def honest_run(tmp_path_factory):
    """The reference run: every client honest, 2 rounds (round 1 of any attacked run starts from the same A_0)."""
    set_server_identity()
    return run(tmp_path_factory.mktemp("honest"), {})


def books(ledger, method: str):
    """round x client table of one method's booked values (client ids as ints)."""
    rows = ledger[(ledger["method"] == method) & (ledger["status"] == "ok")]
    table = rows.pivot(index="round", columns="client_id", values="value")
    table.columns = [int(c) for c in table.columns]
    return table.sort_index(axis=1)


def honest_mean(table, exclude=(ATTACKER,)):
    return table.drop(columns=list(exclude)).mean(axis=1)


def replayed_replies(grid: InProcessGrid, server_round: int, behaviours: dict | None = None) -> dict:
    """Each client's reply to the round's train message, recomputed by a fresh ClientApp."""
    replies = {}
    for message in grid.sent:
        if message.metadata.message_type != "train" or message.content["config"]["server-round"] != server_round:
            continue
        pid = PID_OF[message.metadata.dst_node_id]
        app = make_client_app(functools.partial(load_client, behaviours=behaviours), make_model)
        context = Context(run_id=1, node_id=0, node_config={"partition-id": pid}, state=RecordDict(), run_config={})
        content = app(message, context).content
        replies[pid] = (arrays_to_numpy(content["arrays"]), content["metrics"]["num-examples"])
    start = arrays_to_numpy(next(m for m in grid.sent if m.metadata.message_type == "train"
                                 and m.content["config"]["server-round"] == server_round).content["arrays"])
    return start, dict(sorted(replies.items()))


def shapley_of(player, players, value) -> float:
    """Brute-force subset form of within-round ADS for one player ([ADS] Remark 4.1, Prop. 4.1)."""
    others = [p for p in players if p != player]
    n = len(players)
    total = 0.0
    for size in range(n):
        for coalition in itertools.combinations(others, size):
            total += (value(coalition + (player,)) - value(coalition)) / math.comb(n - 1, size)
    return total / n


# --- free-riders ---------------------------------------------------------------------------------------


def test_a_free_rider_has_zero_outflow_receives_inflow_and_pays_for_its_dilution(tmp_path):
    _, _, booked, grid = run(tmp_path, {ATTACKER: FreeRider()})
    ads, loo = books(booked.ledger, "ads"), books(booked.ledger, "loo")
    outflow, inflow = books(booked.ledger, "tracin_outflow"), books(booked.ledger, "tracin_inflow")
    # A zero update moves no one's loss; the honest clients' steps lower its loss.
    assert (outflow[ATTACKER] == 0.0).all() and (books(booked.ledger, "tracin_self")[ATTACKER] == 0.0).all()
    assert (inflow[ATTACKER] > 0).all() and (honest_mean(outflow) > 0).all()
    # It only dilutes helpful steps: negative ADS and LOO, below every honest client.
    assert (ads[ATTACKER] < 0).all() and (loo[ATTACKER] < 0).all()
    assert (ads[ATTACKER] < ads.drop(columns=ATTACKER).min(axis=1)).all()

    # Reference for round 1, from replayed replies: v(S ∪ {rider}) = U(A + n_S/(n_S + n_rider) D_S).
    start, replies = replayed_replies(grid, 1, {ATTACKER: FreeRider()})
    assert all(np.array_equal(replies[ATTACKER][0][k], start[k]) for k in start)
    score = utility()

    def value(coalition):
        members = sorted(coalition)
        if not members:
            return score(start)
        return score(weighted_mean([replies[p][0] for p in members], [replies[p][1] for p in members]))

    players = tuple(range(NUM_CLIENTS))
    assert ads.loc[1, ATTACKER] == pytest.approx(shapley_of(ATTACKER, players, value), rel=1e-6, abs=1e-9)
    assert value((ATTACKER,)) == value(())  # alone, its reply is the state it received
    honest_only = tuple(p for p in players if p != ATTACKER)
    assert loo.loc[1, ATTACKER] == pytest.approx(value(players) - value(honest_only), rel=1e-6, abs=1e-9)


def test_a_perturbed_free_rider_books_like_the_exact_one(tmp_path):
    _, _, exact, _ = run(tmp_path / "exact", {ATTACKER: FreeRider()}, rounds=1)
    _, _, noisy, grid = run(tmp_path / "noisy", {ATTACKER: FreeRider(noise_std=1e-4)}, rounds=1)
    start, replies = replayed_replies(grid, 1, {ATTACKER: FreeRider(noise_std=1e-4)})
    assert not all(np.array_equal(replies[ATTACKER][0][k], start[k]) for k in start)  # not an exact copy
    outflow = books(noisy.ledger, "tracin_outflow").loc[1]
    assert outflow[ATTACKER] != 0.0
    assert abs(outflow[ATTACKER]) < 1e-2 * outflow.drop(ATTACKER).abs().mean()
    for method in ("ads", "loo"):
        a, b = books(exact.ledger, method).loc[1, ATTACKER], books(noisy.ledger, method).loc[1, ATTACKER]
        assert b == pytest.approx(a, rel=1e-2)


# --- inflated example counts ------------------------------------------------------------------------------


def test_an_inflated_count_dominates_fedavg_and_tracin_pays_it_without_a_review(tmp_path, honest_run):
    inflater = {ATTACKER: InflatedExampleCount(50)}
    _, result, booked, grid = run(tmp_path, inflater, rounds=1)
    honest = honest_run[2]
    start, replies = replayed_replies(grid, 1, inflater)
    claims = {p: n for p, (_, n) in replies.items()}
    assert claims[ATTACKER] == 50 * len(own_data(ATTACKER)[0])
    assert claims[ATTACKER] / sum(claims.values()) > 0.85
    realized = arrays_to_numpy(result.arrays)
    expected = weighted_mean([a for a, _ in replies.values()], list(claims.values()))
    for key in realized:
        np.testing.assert_allclose(realized[key], expected[key], rtol=1e-6)
        # The global model is essentially the attacker's own.
        assert np.abs(realized[key] - replies[ATTACKER][0][key]).max() < 0.2 * np.abs(expected[key] - start[key]).max()
    assert not booked.ledger["method"].isin([Method.CLAIM_CAPPED, Method.CLAIM_JUMPED]).any()

    # TracIn outflow −(p_u Δ_u)·(G − g_u) is linear in the claimed weight: from the same A_0 (same Δ_u and
    # gradients as the honest run) each client's outflow scales by p_u(inflated) / p_u(honest).
    honest_claims = {p: len(own_data(p)[0]) for p in claims}
    ratio = {p: (claims[p] / sum(claims.values())) / (honest_claims[p] / sum(honest_claims.values())) for p in claims}
    outflow = books(booked.ledger, "tracin_outflow").loc[1]
    honest_outflow = books(honest.ledger, "tracin_outflow").loc[1]
    for p in claims:
        assert outflow[p] == pytest.approx(ratio[p] * honest_outflow[p], rel=1e-4)
    assert outflow[ATTACKER] > outflow.drop(ATTACKER).sum()
    # ADS does not pay for weight alone here: any single client's update nearly reaches v(I_t) (IID data),
    # so the inflater's share stays among the honest ones; LOO finds the others all but irrelevant.
    ads, loo = books(booked.ledger, "ads").loc[1], books(booked.ledger, "loo").loc[1]
    honest_loo = books(honest.ledger, "loo").loc[1]
    assert ads[ATTACKER] < ads.drop(ATTACKER).max()
    assert loo.drop(ATTACKER).abs().max() < 0.5 * honest_loo.drop(ATTACKER).abs().max()


def test_registered_sizes_cap_the_claim_flag_it_and_undo_the_attack(tmp_path, honest_run):
    sizes = {pid: len(own_data(pid)[0]) for pid in range(NUM_CLIENTS)}
    review = ClaimReview(registered=sizes)
    _, capped_result, capped, grid = run(tmp_path, {ATTACKER: InflatedExampleCount(50)}, claims=review)
    _, honest_result, honest, _ = honest_run
    ledger = capped.ledger
    flags = ledger[ledger["method"] == Method.CLAIM_CAPPED]
    assert list(flags["round"]) == [1, 2] and set(flags["client_id"]) == {str(ATTACKER)}
    assert set(ledger["method"]) <= set(Method) and set(ledger["status"]) <= set(Status)  # the named vocabulary
    assert (flags["value"] == 50 * sizes[ATTACKER]).all() and (flags["num_examples"] == sizes[ATTACKER]).all()
    # Capped to its true size, the attacker's reply IS its honest reply: every book equals the honest run's.
    for method in ("ads", "loo", "tracin_outflow", "tracin_inflow", "tracin_self"):
        np.testing.assert_allclose(books(ledger, method).to_numpy(), books(honest.ledger, method).to_numpy(),
                                   rtol=1e-9, atol=1e-12, err_msg=method)
    ads_rows = ledger[(ledger["method"] == "ads") & (ledger["client_id"] == str(ATTACKER))]
    assert (ads_rows["num_examples"] == sizes[ATTACKER]).all()
    # The inner FedAvg aggregated the capped weight too: v_t(I_t) is the realized state.
    assert (capped.rounds["utility_after"] == capped.rounds["utility_realized"]).all()
    for key, value in arrays_to_numpy(capped_result.arrays).items():
        np.testing.assert_array_equal(value, arrays_to_numpy(honest_result.arrays)[key])
    assert audit_run(tmp_path).ok


def test_the_median_cap_bounds_an_unregistered_inflater_and_the_inner_strategy_uses_it(tmp_path):
    inflater = {ATTACKER: InflatedExampleCount(50)}
    _, result, booked, grid = run(tmp_path, inflater, rounds=1, claims=ClaimReview(median_multiple=2.0))
    start, replies = replayed_replies(grid, 1, inflater)
    claims = {p: n for p, (_, n) in replies.items()}
    cap = math.floor(2.0 * float(np.median(list(claims.values()))))
    flag = booked.ledger[booked.ledger["method"] == Method.CLAIM_CAPPED].iloc[0]
    assert (flag["client_id"], flag["value"], flag["num_examples"]) == (str(ATTACKER), claims[ATTACKER], cap)
    used = {**claims, ATTACKER: cap}
    expected = weighted_mean([a for a, _ in replies.values()], list(used.values()))
    for key, value in arrays_to_numpy(result.arrays).items():
        np.testing.assert_allclose(value, expected[key], rtol=1e-6)
    assert (booked.rounds["utility_after"] == booked.rounds["utility_realized"]).all()
    assert cap / sum(used.values()) < 0.35  # from > 0.85 uncapped


def test_a_claim_that_jumps_between_rounds_is_flagged_not_capped(tmp_path):
    def behaviours_of_round(server_round):
        return {ATTACKER: InflatedExampleCount(4)} if server_round >= 2 else {}

    review = ClaimReview(jump_factor=3.0)
    _, _, booked, _ = run(tmp_path, rounds=3, claims=review, behaviours_of_round=behaviours_of_round)
    flags = booked.ledger[booked.ledger["method"].isin([Method.CLAIM_CAPPED, Method.CLAIM_JUMPED])]
    size = len(own_data(ATTACKER)[0])
    # Round 2 jumps from its true size to 4x; round 3 repeats 4x, no jump against round 2.
    assert flags[["round", "client_id", "method", "value", "num_examples"]].values.tolist() == [
        [2, str(ATTACKER), Method.CLAIM_JUMPED, 4.0 * size, 4 * size]]
    assert audit_run(tmp_path).ok


# --- replicators ----------------------------------------------------------------------------------------------


def test_twins_split_the_value_and_each_is_the_others_substitute(tmp_path):
    # Client 1 alone holds class 2 (the held-out set has it): a valuable client to copy.
    source, copier = 1, 5
    x, y, _, _ = own_data(source, unique=source)
    replicator = {copier: Replicator(x, y, source_id=source)}
    _, _, booked, grid = run(tmp_path / "twins", replicator, unique=source)
    _, _, honest, _ = run(tmp_path / "honest", {}, unique=source)
    start, replies = replayed_replies(grid, 1, replicator)
    assert all(np.array_equal(replies[copier][0][k], replies[source][0][k]) for k in start)
    assert replies[copier][1] == replies[source][1]
    ads, loo = books(booked.ledger, "ads"), books(booked.ledger, "loo")
    # Symmetric players of the round game: equal ADS and equal LOO in every round.
    np.testing.assert_allclose(ads[copier], ads[source], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(loo[copier], loo[source], rtol=1e-6, atol=1e-12)
    # The same step p·Δ: their total TracIn effect −pΔ·G (outflow + self) is the same.
    total = books(booked.ledger, "tracin_outflow") + books(booked.ledger, "tracin_self")
    np.testing.assert_allclose(total[copier], total[source], rtol=1e-6)

    # Round 1 starts from A_0 in both runs. The copy takes part of the source's ADS and earns more
    # than client 5's own data did; as substitutes, LOO loses much more than ADS (each twin covers the other).
    honest_ads, honest_loo = books(honest.ledger, "ads").loc[1], books(honest.ledger, "loo").loc[1]
    assert ads.loc[1, source] < honest_ads[source] and ads.loc[1, copier] > honest_ads[copier]
    assert 0 < loo.loc[1, source] < honest_loo[source]
    ads_kept, loo_kept = ads.loc[1, source] / honest_ads[source], loo.loc[1, source] / honest_loo[source]
    assert loo_kept < 0.75 * ads_kept


# --- sign flips and boosts -----------------------------------------------------------------------------------


def test_a_sign_flipper_gets_negative_ads_loo_and_outflow(tmp_path, honest_run):
    _, _, flipped, _ = run(tmp_path, {ATTACKER: SignFlip()})
    honest = honest_run[2]
    ads, loo, outflow = (books(flipped.ledger, m) for m in ("ads", "loo", "tracin_outflow"))
    for table in (ads, loo, outflow):
        assert (table[ATTACKER] < 0).all() and (honest_mean(table) > 0).all()
    # Round 1 starts from the same A_0 in both runs: the flipped step −p Δ gives exactly minus the outflow.
    honest_outflow = books(honest.ledger, "tracin_outflow").loc[1, ATTACKER]
    assert outflow.loc[1, ATTACKER] == pytest.approx(-honest_outflow, rel=1e-4)
    assert flipped.rounds["utility_realized"].iloc[-1] < honest.rounds["utility_realized"].iloc[-1]


@pytest.mark.parametrize("scale, overshoots", [(5.0, False), (300.0, True)])
def test_tracin_pays_a_boost_linearly_while_ads_and_loo_pay_what_it_did_to_the_model(tmp_path, honest_run, scale,
                                                                                    overshoots):
    _, _, boosted, _ = run(tmp_path, {ATTACKER: BoostedUpdate(scale)}, rounds=1)
    honest = honest_run[2]
    outflow = books(boosted.ledger, "tracin_outflow").loc[1]
    honest_outflow = books(honest.ledger, "tracin_outflow").loc[1]
    # First order is linear in the step: λ times the honest outflow, above every honest client.
    assert outflow[ATTACKER] == pytest.approx(scale * honest_outflow[ATTACKER], rel=1e-4)
    assert outflow[ATTACKER] > outflow.drop(ATTACKER).max()
    ads, loo = books(boosted.ledger, "ads").loc[1], books(boosted.ledger, "loo").loc[1]
    realized, honest_realized = boosted.rounds.loc[0, "utility_realized"], honest.rounds.loc[0, "utility_realized"]
    if overshoots:
        # The step overshoots: the round ends below where it started, and ADS and LOO say so.
        assert realized < boosted.rounds.loc[0, "utility_before"]
        assert ads[ATTACKER] < 0 and loo[ATTACKER] < 0
    else:
        # A small model under-trained by one round: the boost acts as a larger server step and
        # helps; ADS and LOO pay it for that, as they pay any update by the realized utility.
        assert realized > honest_realized
        assert ads[ATTACKER] > ads.drop(ATTACKER).max() and loo[ATTACKER] > 0


# --- the claim rule on its own ---------------------------------------------------------------------------------


def reply(pid: int, claimed, status: str = "ok") -> ClientReply:
    """A ClientReply read from a real reply Message (so capping rewrites the Message too)."""
    arrays = numpy_to_arrays(initial_state())
    instruction = Message(RecordDict({"arrays": arrays}), dst_node_id=NODE_OF[pid], message_type="train")
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": claimed, "train-loss": 0.5}),
                          "client": ConfigRecord({"partition-id": pid})})
    message = Message(content, reply_to=instruction)
    record = read_reply(message, "num-examples", {})
    record.status = status
    return record


def test_claim_review_caps_books_and_rewrites_the_message_alike():
    records = [reply(0, 1000), reply(1, 30), reply(2, 34), reply(3, 38)]
    flags = ClaimReview(registered={0: 20, 1: 30}).review(records)
    assert [(f.client_id, f.method, f.claimed, f.used, f.limit) for f in flags] == [
        (0, Method.CLAIM_CAPPED, 1000.0, 20.0, 20.0)]
    assert records[0].weight == 20.0 and records[0].metrics["num-examples"] == 20
    metric = records[0].message.content["metrics"]["num-examples"]
    assert metric == 20 and type(metric) is int  # Flower's int metric stays an int
    assert [r.weight for r in records[1:]] == [30.0, 34.0, 38.0]  # at or under their registered size, or unknown
    (row,) = claim_rows(4, [f.entry() for f in flags])
    assert row == LedgerRow(round=4, client_id=0, method=Method.CLAIM_CAPPED, value=1000.0, stderr=0.0, num_examples=20,
                            status="ok", noisy=None, reason=None)


def test_the_median_cap_uses_claims_after_the_registry_and_needs_three_claims():
    review = ClaimReview(registered={1: 40}, median_multiple=1.5)
    records = [reply(0, 100), reply(1, 400), reply(2, 20), reply(3, 30)]
    flags = review.review(records)
    # After the registry: 100, 40, 20, 30 -> median 35, cap 52.5 -> 52 examples.
    assert [(f.client_id, f.used, f.limit) for f in flags] == [(0, 52.0, 52.5), (1, 40.0, 40.0)]
    two = [reply(0, 1000), reply(1, 10)]
    assert ClaimReview(median_multiple=1.0).review(two) == [] and two[0].weight == 1000.0
    # Failed replies carry no claim; rejected (non-finite) ones are capped, as their harm is scored with it.
    mixed = [reply(0, 500, "rejected"), reply(1, 10), reply(2, 10), reply(3, 10, "failed")]
    flags = ClaimReview(median_multiple=2.0).review(mixed)
    assert [(f.client_id, f.used, f.status) for f in flags] == [(0, 20.0, "rejected")]
    assert mixed[3].weight == 10.0


def test_a_float_weight_under_another_key_is_capped_as_a_float():
    record = reply(0, 1.0)
    record.metrics["quality"] = 9.5
    record.message.content["metrics"]["quality"] = 9.5
    record.weight, record.weight_key = 9.5, "quality"
    others = [reply(1, 1.0), reply(2, 1.0)]
    for other in others:
        other.metrics["quality"], other.weight, other.weight_key = 1.0, 1.0, "quality"
        other.message.content["metrics"]["quality"] = 1.0
    (flag,) = ClaimReview(median_multiple=2.5).review([record, *others])
    assert flag.used == 2.5 and record.message.content["metrics"]["quality"] == 2.5
    assert record.message.content["metrics"]["num-examples"] == 1.0  # other keys untouched


def test_jumps_compare_with_the_clients_own_last_claim():
    review = ClaimReview(jump_factor=2.0)
    assert review.review([reply(0, 30), reply(1, 30)]) == []
    assert review.review([reply(1, 60)]) == []  # exactly 2x is no jump
    flags = review.review([reply(0, 61), reply(1, 121)])
    assert [(f.client_id, f.method, f.limit) for f in flags] == [(0, Method.CLAIM_JUMPED, 60.0), (1, Method.CLAIM_JUMPED, 120.0)]
    assert review.previous_claims == {0: 61.0, 1: 121.0}


@pytest.mark.parametrize("kwargs, names", [
    ({}, "registered, median_multiple, jump_factor: expected at least one rule"),
    ({"registered": [30, 40]}, "registered: expected a mapping"),
    ({"registered": {0: 0}}, "registered[0]: expected a positive integer size; got 0"),
    ({"registered": {0: 3.5}}, "registered[0]: expected a positive integer size; got 3.5"),
    ({"median_multiple": 0.5}, "median_multiple: expected a finite number ≥ 1; got 0.5"),
    ({"median_multiple": float("nan")}, "median_multiple: expected a finite number ≥ 1; got nan"),
    ({"jump_factor": 1.0}, "jump_factor: expected a finite number > 1; got 1.0"),
    ({"jump_factor": True}, "jump_factor: expected a finite number > 1; got True"),
    ({"median_multiple": 2.0, "min_claims": 2}, "min_claims: expected an integer ≥ 3"),
])
def test_claim_review_errors_name_the_parameter_the_expectation_and_the_value(kwargs, names):
    with pytest.raises((ValueError, TypeError)) as error:
        ClaimReview(**kwargs)
    assert names in str(error.value)


def test_valuing_strategy_rejects_a_claims_object_without_review():
    with pytest.raises(TypeError, match="claims: expected a strategies.intake.claims.ClaimReview .or None.; got dict"):
        ValuingStrategy(FedAvg(), utility(), intake=IntakeSettings(claims={"median_multiple": 2}))
