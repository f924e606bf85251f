"""Top-k selection strategies on hand-built replies through an in-process grid (no Ray)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from flwr.app import ConfigRecord, MessageType
from flwr.serverapp.strategy import FedAvg

from fedvalue.analysis.flagging import FlaggingRule
from fedvalue.analysis.run_summary import load_run
from fedvalue.valuation.round_game import weighted_mean
from fedvalue.valuation.settings import ValuationSettings
from fedvalue.analysis.top_k_selection import retrain_plan, top_k
from fedvalue.schema import FLOW_METHODS, LedgerRow, Method, Status
from strategies import PartitionSampler, Replay, ReplaySampler, TopK, ValuingStrategy, ValueWeightedSampler
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from strategies.book_settings import BookSettings

from tests.strategies.harness.inprocess import InProcessGrid
from tests.strategies.test_valuing import NODE_OF, PID_OF, initial_arrays, local_training, make_handler, utility as _utility_fixture

utility = _utility_fixture


def test_top_k_keeps_the_highest_and_breaks_ties_by_reply_order():
    assert top_k({"a": 0.1, "b": 0.3, "c": 0.2}, 2) == ["b", "c"]
    assert top_k({"a": 0.2, "b": 0.2, "c": 0.1}, 1, order=["b", "a", "c"]) == ["b"]
    assert top_k({"a": 1.0}, 5) == ["a"]
    with pytest.raises(ValueError, match="k: expected a positive integer"):
        top_k({"a": 1.0}, 0)
    with pytest.raises(ValueError, match="scores: expected finite"):
        top_k({"a": float("nan")}, 1)


def test_in_round_acceptance_aggregates_exactly_the_top_k_updates(tmp_path, utility):
    grid = InProcessGrid(NODE_OF.values(), make_handler())
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, acceptance=TopK(2, "ads"),
                               run_dir=str(tmp_path), sampler=PartitionSampler(4, seed=3))
    result = strategy.start(grid, initial_arrays(), num_rounds=3, timeout=10)
    ledger = load_run(tmp_path).ledger
    train = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    last = train[-4:]
    start = arrays_to_numpy(last[0].content["arrays"])
    replies = {PID_OF[m.metadata.dst_node_id]: local_training(start, PID_OF[m.metadata.dst_node_id]) for m in last}
    round3 = ledger[ledger["round"] == 3]
    ads = round3[round3["method"] == "ads"].set_index("client_id")["value"]
    selected = round3[round3["method"] == "selected"].set_index("client_id")["value"]
    best_two = sorted(ads.sort_values(ascending=False, kind="mergesort").index[:2], key=int)
    assert sorted(selected[selected == 1.0].index, key=int) == best_two
    assert (selected == 0.0).sum() == 2
    # The realized state is FedAvg of the two accepted updates and nothing else.
    chosen = [int(c) for c in best_two]
    expected = weighted_mean([replies[c][0] for c in chosen], [replies[c][1] for c in chosen])
    realized = arrays_to_numpy(result.arrays)
    for key, value in expected.items():
        np.testing.assert_allclose(realized[key], value, rtol=1e-6, atol=1e-7)
    # And its utility is the cached value of the accepted coalition.
    game = strategy.last_valuation.game
    assert strategy.rounds[-1].utility_realized == pytest.approx(game.value(game.mask_of(chosen)), abs=1e-6)


def test_retrain_protocol_with_k_equal_to_the_round_reproduces_the_scored_run(tmp_path, utility):
    scored_dir, retrain_dir = tmp_path / "scored", tmp_path / "retrain"
    ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(scored_dir),
                    sampler=PartitionSampler(3, seed=8)).start(
        InProcessGrid(NODE_OF.values(), make_handler()), initial_arrays(), num_rounds=3, timeout=10)
    scored = load_run(scored_dir)
    sampled, accepted = retrain_plan(scored.ledger, "ads", k=3)
    ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, acceptance=Replay(accepted), run_dir=str(retrain_dir),
                    sampler=ReplaySampler(sampled)).start(
        InProcessGrid(NODE_OF.values(), make_handler()), initial_arrays(), num_rounds=3, timeout=10)
    retrained = load_run(retrain_dir)
    books = retrained.ledger[retrained.ledger["method"] != "selected"].reset_index(drop=True)
    pd.testing.assert_frame_equal(books, scored.ledger)
    assert (retrained.ledger.loc[retrained.ledger["method"] == "selected", "value"] == 1.0).all()
    pd.testing.assert_series_equal(retrained.rounds["utility_realized"], scored.rounds["utility_realized"])


def test_retrain_with_top_1_moves_with_that_client_only(tmp_path, utility):
    scored_dir = tmp_path / "scored"
    ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(scored_dir),
                    sampler=PartitionSampler(3, seed=8)).start(
        InProcessGrid(NODE_OF.values(), make_handler()), initial_arrays(), num_rounds=1, timeout=10)
    sampled, accepted = retrain_plan(load_run(scored_dir).ledger, "loo", k=1)
    grid = InProcessGrid(NODE_OF.values(), make_handler())
    result = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, acceptance=Replay(accepted),
                             sampler=ReplaySampler(sampled)).start(grid, initial_arrays(), num_rounds=1, timeout=10)
    only = int(accepted[1][0])
    trained, _, _ = local_training(arrays_to_numpy(initial_arrays()), only)
    for key, value in arrays_to_numpy(result.arrays).items():
        np.testing.assert_allclose(value, trained[key], rtol=1e-6, atol=1e-7)


def test_selection_inputs_are_checked(utility):
    with pytest.raises(ValueError, match="k: expected at most the 2 clients sampled per round; got 3"):
        ValuingStrategy(FedAvg(), utility, acceptance=TopK(3), sampler=PartitionSampler(2))
    with pytest.raises(ValueError, match="score: expected one of"):
        TopK(1, score="shapley")
    with pytest.raises(ValueError, match="needs methods to include it"):
        ValuingStrategy(
            FedAvg(), utility, acceptance=TopK(1, "loo"), valuation=ValuationSettings(methods=("ads",))
        )
    with pytest.raises(ValueError, match="needs flows=True"):
        ValuingStrategy(FedAvg(), utility, acceptance=TopK(1, "tracin_outflow"))
    with pytest.raises(ValueError, match="method: expected one of the ledger's methods"):
        retrain_plan(pd.DataFrame({"round": [1], "client_id": ["0"], "method": ["ads"], "value": [0.1],
                                   "status": ["ok"]}), "loo", 1)


def test_value_weighted_sampling_prefers_valuable_clients_and_skips_excluded():
    sampler = ValueWeightedSampler(2, temperature=0.01, seed=1)
    sampler.observe([
        LedgerRow(1, "0", "ads", 0.30, 0.0, 10, "ok"),
        LedgerRow(1, "1", "ads", -0.20, 0.0, 10, "ok"),
        LedgerRow(1, "2", "ads", 0.25, 0.0, 10, "ok"),
        LedgerRow(1, "1", "loo", 9.0, 0.0, 10, "ok"),  # another method: ignored
        LedgerRow(1, "3", "ads", None, None, None, "failed", reason="crashed"),
    ])
    assert sampler.totals == {0: 0.30, 1: -0.20, 2: 0.25}
    draws = [sampler.sample(t, range(4)) for t in range(1, 200)]
    counts = np.bincount(np.concatenate(draws), minlength=4)
    assert counts[1] == 0  # 0.5 below the best at temperature 0.01: weight e^-50
    assert counts[3] > 0  # never scored: optimistic, tried like the best
    assert draws == [sampler.sample(t, range(4)) for t in range(1, 200)]  # deterministic
    flagged = ValueWeightedSampler(2, temperature=10.0, exclude=lambda: {0}, seed=1)
    assert all(0 not in flagged.sample(t, range(4)) for t in range(1, 50))
    with pytest.raises(ValueError, match="temperature: expected a finite number > 0"):
        ValueWeightedSampler(2, temperature=0)


def test_value_weighted_sampler_stops_sampling_clients_its_flagging_rule_flags():
    rule = FlaggingRule("ads", kind="threshold", threshold=0.0, patience=1)
    sampler = ValueWeightedSampler(2, temperature=100.0, flagging=rule, seed=4)  # near uniform
    assert any(1 in sampler.sample(t, range(4)) for t in range(1, 30))  # before any books: sampled
    sampler.observe([LedgerRow(1, str(c), "ads", v, 0.0, 10, "ok") for c, v in {0: 0.2, 1: -0.1, 2: 0.1}.items()])
    assert rule.flagged == {"1"}
    assert all(1 not in sampler.sample(t, range(4)) for t in range(2, 60))
    # never starves a round: with only the flagged client left besides one, everyone is eligible
    assert sorted(ValueWeightedSampler(2, flagging=rule).sample(1, [1, 2])) == [1, 2]
    with pytest.raises(TypeError, match="flagging: expected a fedvalue.analysis.flagging.FlaggingRule"):
        ValueWeightedSampler(2, flagging=lambda: {1})


def test_the_wrapper_feeds_its_books_to_a_value_weighted_sampler(tmp_path, utility):
    sampler = ValueWeightedSampler(3, temperature=0.05, seed=2)
    ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(tmp_path), sampler=sampler).start(
        InProcessGrid(NODE_OF.values(), make_handler()), initial_arrays(), num_rounds=4, timeout=10)
    ledger = load_run(tmp_path).ledger
    totals = ledger[ledger["method"] == "ads"].groupby("client_id")["value"].sum()
    assert sampler.totals == pytest.approx({int(c): v for c, v in totals.items()})


def test_in_round_selection_by_tracin_outflow_keeps_the_largest_outflow_if_all_were_aggregated(tmp_path):
    from clients.app import train_client

    from tests.strategies.hooks import test_flow_books as fb

    grid = fb.client_app_grid(fb.load_client)
    strategy = ValuingStrategy(
        FedAvg(fraction_evaluate=0.0), fb.utility(), acceptance=TopK(2, "tracin_outflow"), run_dir=str(tmp_path),
        sampler=PartitionSampler(4, seed=5), valuation=ValuationSettings(methods=("ads",)),
        books=BookSettings(flows=True)
    )
    train_config = ConfigRecord({"lr": 0.05, "local-epochs": 2, "batch-size": 0, "seed": 0})
    strategy.start(grid, numpy_to_arrays(fb.initial_state()), num_rounds=2, timeout=60, train_config=train_config)
    ledger = load_run(tmp_path).ledger
    assert set(ledger["method"]) == {"ads", "selected", *FLOW_METHODS} and set(ledger["method"]) <= set(Method)
    assert set(ledger["status"]) <= set(Status)  # the ledger's named vocabulary
    train = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    for server_round in (1, 2):
        sent = [m for m in train if m.content["config"]["server-round"] == server_round]
        start = arrays_to_numpy(sent[0].content["arrays"])
        # Reference: every sampled client's update and every client's inference gradient at
        # A_{t-1}; outflow_u = Σ_{v≠u} −(p_u Δ_u)·g_v with p over ALL sampled replies.
        replies = {}
        for message in sent:
            pid = fb.PID_OF[message.metadata.dst_node_id]
            arrays, n, _ = train_client(fb.load_client(pid), fb.make_model, start, learning_rate=0.05,
                                        local_epochs=2, batch_size=0, seed=0, server_round=server_round)
            replies[pid] = (fb.flat(arrays) - fb.flat(start), n)
        total = sum(n for _, n in replies.values())
        grads = {v: fb.inference_gradient(v, start, fb.load_client)[1] for v in range(fb.NUM_CLIENTS)}
        outflow = {u: sum(-float((n / total) * delta @ g) for v, g in grads.items() if v != u)
                   for u, (delta, n) in replies.items()}
        best = sorted(sorted(outflow, key=outflow.get, reverse=True)[:2])
        rows = ledger[(ledger["round"] == server_round) & (ledger["method"] == "selected")]
        assert sorted(int(c) for c in rows.loc[rows["value"] == 1.0, "client_id"]) == best
        assert len(rows) == 4
