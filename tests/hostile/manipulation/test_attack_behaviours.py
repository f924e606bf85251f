"""Each attack of clients.attacks does what its docstring says, on a real torch model trained by
the client code (no Flower): checked against references worked out by hand."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from flwr.app import RecordDict

from clients.app import ClientData, train_client
from clients.attacks import (
    ColludingFreeRider,
    CraftedUpdate,
    DeltaWeightsFreeRider,
    DynamicFreeRider,
    SybilReplica,
    SybilShard,
    prepare_round,
    shard_indices,
)
from clients.behaviours import HonestClient
from fedvalue.rounds.defences.free_riders import off_line_share
from simulations.datasets import make_linear_model

FACTORY = functools.partial(make_linear_model, 6, 3, seed=0)
RNG = np.random.default_rng(0)
X = RNG.normal(size=(40, 6)).astype(np.float32)
Y = RNG.integers(0, 3, size=40).astype(np.int64)
A1 = {k: v.detach().numpy() for k, v in FACTORY().state_dict().items()}
A2 = {k: v + np.float32(0.05) * np.arange(v.size, dtype=np.float32).reshape(v.shape) / v.size for k, v in A1.items()}


def reply(behaviour, global_arrays, *, partition=0, server_round=1, state=None, key="run"):
    """A client's reply in a round, with the memory a Flower node keeps (``state``)."""
    data = ClientData(partition, X, Y, X[:4], Y[:4], behaviour=behaviour)
    prepare_round(behaviour, RecordDict() if state is None else state, key, server_round, global_arrays)
    arrays, count, _ = train_client(data, FACTORY, global_arrays, learning_rate=0.5, local_epochs=3, batch_size=0,
                                    seed=0, server_round=server_round)
    return arrays, count


def flat(arrays, start):
    return np.concatenate([(arrays[k].astype(np.float64) - start[k].astype(np.float64)).ravel() for k in start])


def test_sybil_shards_partition_the_participants_data():
    rows = [shard_indices(40, j, 3, seed=5) for j in range(3)]
    assert sorted(np.concatenate(rows).tolist()) == list(range(40)) and [len(r) for r in rows] == [14, 13, 13]
    counts = [reply(SybilShard(j, 3, seed=5), A1, partition=j + 1)[1] for j in range(3)]
    assert counts == [14, 13, 13]  # the claims sum to the participant's 40 examples
    with pytest.raises(ValueError, match="shard: expected an identity in"):
        SybilShard(3, 3, seed=0)


def test_replicas_are_one_update_under_several_identities():
    honest, count = reply(HonestClient(), A1)
    copies = [reply(SybilReplica(), A1, partition=p) for p in (3, 4)]
    for arrays, claimed in copies:
        assert claimed == count and all(np.array_equal(arrays[k], honest[k]) for k in honest)
    noisy = [flat(reply(SybilReplica(1e-4), A1, partition=p)[0], A1) for p in (3, 4)]
    exact = flat(honest, A1)
    assert 0 < np.linalg.norm(noisy[0] - noisy[1]) < 0.05 * np.linalg.norm(exact)


def test_the_delta_weights_free_rider_replays_the_last_step():
    state = RecordDict()
    first, _ = reply(DeltaWeightsFreeRider(), A1, state=state, server_round=1)
    assert all(np.array_equal(first[k], A1[k]) for k in A1)  # no earlier model: the global model back
    second, _ = reply(DeltaWeightsFreeRider(), A2, state=state, server_round=2)
    for k in A1:
        np.testing.assert_array_equal(second[k], (A2[k].astype(np.float64) * 2 - A1[k]).astype(np.float32))
    other_run, _ = reply(DeltaWeightsFreeRider(), A2, state=state, server_round=2, key="another run")
    assert all(np.array_equal(other_run[k], A2[k]) for k in A2)  # runs served by one engine do not mix
    assert len(state.array_records) == 2  # round 1 of "run" is dropped: its next round asks for round 2 only


def test_the_dynamic_free_rider_is_honest_first():
    state = RecordDict()
    honest, _ = reply(HonestClient(), A1)
    first, _ = reply(DynamicFreeRider(honest_rounds=1), A1, state=state, server_round=1)
    assert all(np.array_equal(first[k], honest[k]) for k in A1)
    second, _ = reply(DynamicFreeRider(honest_rounds=1), A2, state=state, server_round=2)
    np.testing.assert_allclose(flat(second, A2), flat(A2, A1), rtol=0, atol=1e-7)


def test_colluders_cancel_in_their_weighted_mean_and_each_passes_alone():
    counts = (10, 20, 30)
    updates = []
    for member in range(3):
        state = RecordDict()
        reply(ColludingFreeRider(member, counts, spread=0.3, secret=7), A1, state=state, server_round=1)
        arrays, claimed = reply(ColludingFreeRider(member, counts, spread=0.3, secret=7), A2, state=state,
                                server_round=2)
        assert claimed == counts[member]
        updates.append(flat(arrays, A2))
    step = flat(A2, A1)
    mean = sum(n * u for n, u in zip(counts, updates)) / sum(counts)
    np.testing.assert_allclose(mean, step, atol=1e-6)
    assert all(off_line_share(u, step) > 0.1 for u in updates)  # each alone: not a replay
    assert min(np.linalg.norm(a - b) for a in updates for b in updates if a is not b) > 0.05 * np.linalg.norm(step)


def test_the_crafted_update_stays_in_its_budget_and_raises_its_surrogate_value():
    attacker = CraftedUpdate(FACTORY, others=3, budget=0.5, steps=30)
    state = RecordDict()
    reply(CraftedUpdate(FACTORY, others=3, budget=0.5, steps=30), A1, state=state, server_round=1)
    crafted, count = reply(attacker, A2, state=state, server_round=2)
    honest, honest_count = reply(HonestClient(), A2)
    assert count == honest_count
    d_crafted, d_honest = flat(crafted, A2), flat(honest, A2)
    assert np.linalg.norm(d_crafted - d_honest) <= 0.5 * np.linalg.norm(d_honest) * (1 + 1e-5)
    assert np.linalg.norm(d_crafted - d_honest) > 0.05 * np.linalg.norm(d_honest)
    import torch

    def surrogate(update):
        start = {k: torch.as_tensor(A2[k]) for k in A2}
        delta = {k: torch.as_tensor(update[k] - A2[k]) for k in A2}
        others = {k: torch.as_tensor(A2[k] - A1[k]) for k in A2}
        return float(attacker.surrogate(FACTORY(), start, delta, others))
    assert surrogate(crafted) > surrogate(honest)
    again, _ = reply(CraftedUpdate(FACTORY, others=3, budget=0.5, steps=30), A2,
                     state=_state_after_round_one(), server_round=2)
    assert all(np.array_equal(again[k], crafted[k]) for k in crafted)  # deterministic


def _state_after_round_one() -> RecordDict:
    state = RecordDict()
    reply(CraftedUpdate(FACTORY, others=3, budget=0.5, steps=30), A1, state=state, server_round=1)
    return state
