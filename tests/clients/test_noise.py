"""The noisy contributors beyond label flips (clients.noise) and the stale replayer, each against
what its definition says, through the ClientApp's own training call where it trains."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st
from ray import cloudpickle

from clients import ClassPairSwap, ClientData, FeatureNoise, NoisyUpdate, StaleReplayer
from clients.attacks import prepare_round
from clients.app import train_client
from simulations.datasets import make_linear_model

FEATURES, CLASSES = 6, 10
RNG = np.random.default_rng(0)
X = RNG.uniform(size=(400, FEATURES)).astype(np.float32)
Y = RNG.integers(0, CLASSES, size=400).astype(np.int64)


def factory():
    return make_linear_model(FEATURES, CLASSES, seed=0)


def global_arrays(shift: float = 0.0) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() + np.float32(shift) for k, v in factory().state_dict().items()}


def run(behaviour, start, *, server_round=1, state=None, key="run"):
    data = ClientData(0, X, Y, X[:0], Y[:0], behaviour=behaviour)
    prepare_round(behaviour, RecordDict() if state is None else state, key, server_round, start)
    arrays, count, _ = train_client(data, factory, start, learning_rate=0.3, local_epochs=1, batch_size=0, seed=3,
                                    server_round=server_round)
    return arrays, count


# --- structured label noise -------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(p=st.floats(0.0, 1.0), seed=st.integers(0, 2**31))
def test_a_class_pair_swap_moves_labels_only_to_their_partner(p, seed):
    behaviour = ClassPairSwap([(0, 6), (2, 4)], p, seed=seed)
    _, swapped = behaviour.transform_training_data(X, Y, np.random.default_rng(1))
    partner = {0: 6, 6: 0, 2: 4, 4: 2}
    changed = swapped != Y
    assert all(partner.get(int(a)) == int(b) for a, b in zip(Y[changed], swapped[changed]))
    assert not changed[~np.isin(Y, [0, 6, 2, 4])].any()  # classes in no pair are never touched
    _, again = behaviour.transform_training_data(X, Y, np.random.default_rng(2))
    assert np.array_equal(swapped, again)  # a fixed seed: the same noisy dataset every round


def test_at_p_1_every_paired_label_swaps_and_at_p_0_none():
    in_pairs = np.isin(Y, [0, 6, 2, 4])
    _, all_swapped = ClassPairSwap([(0, 6), (2, 4)], 1.0, seed=0).transform_training_data(X, Y, None)
    assert (all_swapped[in_pairs] != Y[in_pairs]).all()
    _, none = ClassPairSwap([(0, 6), (2, 4)], 0.0, seed=0).transform_training_data(X, Y, None)
    assert np.array_equal(none, Y)


def test_the_swap_share_is_p():
    _, swapped = ClassPairSwap([(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)], 0.3, seed=0).transform_training_data(
        np.zeros((20_000, 1)), np.arange(20_000) % 10, None)
    share = float(np.mean(swapped != np.arange(20_000) % 10))
    assert abs(share - 0.3) < 4 * np.sqrt(0.3 * 0.7 / 20_000)


@pytest.mark.parametrize("pairs, match", [([(0, 0)], "disjoint pairs"), ([(0, 1), (1, 2)], "disjoint pairs"),
                                          ([(0, 1, 2)], "pairs of two"), ([], "at least one"),
                                          ([(-1, 2)], "pairs")])
def test_class_pairs_are_checked_where_written(pairs, match):
    with pytest.raises(ValueError, match=match):
        ClassPairSwap(pairs, 1.0)


# --- corrupted inputs --------------------------------------------------------------------------------------


def test_feature_noise_corrupts_a_share_p_of_the_inputs_within_the_clip_and_keeps_the_labels():
    behaviour = FeatureNoise(1.0, 0.5, clip=(0.0, 1.0), seed=7)
    x, y = behaviour.transform_training_data(X, Y, None)
    assert np.array_equal(y, Y) and x.dtype == X.dtype and x.shape == X.shape
    corrupted = (x != X).any(axis=1)
    assert abs(corrupted.mean() - 0.5) < 4 * np.sqrt(0.25 / len(X))
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert np.array_equal(behaviour.transform_training_data(X, Y, None)[0], x)  # fixed per client
    unclipped, _ = FeatureNoise(1.0, 1.0, seed=7).transform_training_data(X, Y, None)
    assert abs(float(np.std(unclipped.astype(np.float64) - X)) - 1.0) < 0.05  # σ as given


def test_feature_noise_at_p_0_is_the_identity_and_bad_settings_are_named():
    x, _ = FeatureNoise(1.0, 0.0, seed=1).transform_training_data(X, Y, None)
    assert np.array_equal(x, X)
    for kwargs, match in (({"std": -1.0}, "std"), ({"p": 1.5}, "p"), ({"clip": (1.0, 0.0)}, "clip")):
        with pytest.raises(ValueError, match=match):
            FeatureNoise(**kwargs)


# --- noisy updates -----------------------------------------------------------------------------------------


def test_a_noisy_update_adds_noise_scaled_to_its_own_update():
    start = {"w": np.zeros(20_000), "b": np.ones(10_000, dtype=np.float32)}
    trained = {"w": RNG.normal(0.0, 0.02, size=20_000), "b": np.float32(1.0) + np.full(10_000, 0.5, dtype=np.float32)}
    reply, count = NoisyUpdate(3.0).transform_reply(start, trained, 9, np.random.default_rng(0))
    assert count == 9
    for key in start:
        update = trained[key].astype(np.float64) - start[key]
        noise = reply[key].astype(np.float64) - trained[key]
        assert noise.std() == pytest.approx(3.0 * np.sqrt(np.mean(update**2)), rel=0.03), key
        assert abs(noise.mean()) < 4 * noise.std() / np.sqrt(noise.size), key


def test_a_noisy_update_through_the_client_s_training_is_seeded_by_the_round():
    start = global_arrays()
    honest, count = run(NoisyUpdate(0.0), start)
    noisy, noisy_count = run(NoisyUpdate(3.0), start)
    assert noisy_count == count == len(X)
    assert all(not np.array_equal(noisy[k], honest[k]) for k in start)
    again, _ = run(NoisyUpdate(3.0), start)
    assert all(np.array_equal(again[k], noisy[k]) for k in start)


def test_a_noisy_update_leaves_integer_buffers_as_trained():
    start = {"w": np.ones(3, dtype=np.float32), "steps": np.array(7, dtype=np.int64)}
    trained = {"w": np.array([1.5, 0.5, 1.0], dtype=np.float32), "steps": np.array(8, dtype=np.int64)}
    reply, _ = NoisyUpdate(2.0).transform_reply(start, trained, 5, np.random.default_rng(0))
    assert reply["steps"] == 8 and reply["w"].dtype == np.float32 and not np.array_equal(reply["w"], trained["w"])


# --- stale replayer ----------------------------------------------------------------------------------------


def test_a_stale_replayer_sends_the_model_it_received_lag_participations_before():
    state = RecordDict()
    models = [global_arrays(0.1 * t) for t in range(4)]
    replies = [run(StaleReplayer(lag=2), models[t], server_round=t + 1, state=state)[0] for t in range(4)]
    for t, reply in enumerate(replies):
        expected = models[t - 2] if t >= 2 else models[t]  # nothing that old yet: a zero update
        assert all(np.array_equal(reply[k], expected[k]) for k in expected), t
    other_run, _ = run(StaleReplayer(lag=2), models[3], server_round=4, state=state, key="another run")
    assert all(np.array_equal(other_run[k], models[3][k]) for k in other_run)  # memories of runs do not mix


def test_new_behaviours_survive_cloudpickle_as_ray_sends_them():
    for behaviour in (ClassPairSwap([(0, 6)], 0.5, seed=1), FeatureNoise(0.5, 0.5, clip=(0, 1), seed=1),
                      NoisyUpdate(2.0), StaleReplayer(3)):
        clone = cloudpickle.loads(cloudpickle.dumps(behaviour))
        assert type(clone) is type(behaviour) and repr(clone) == repr(behaviour)
        assert StaleReplayer(3).history_length == 3
    with pytest.raises(ValueError, match="lag"):
        StaleReplayer(0)
