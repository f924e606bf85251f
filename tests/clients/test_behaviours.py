"""The manipulating behaviours on their own and through ``train_client`` (real local training).

References are computed independently: the honest client's reply from the same call with
an honest behaviour, and the attacks' formulas (A + λ(w − A), claimed counts) in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ray import cloudpickle

from clients import (
    BoostedUpdate,
    ClientData,
    FreeRider,
    HonestClient,
    InflatedExampleCount,
    Replicator,
    ScaledUpdate,
    SignFlip,
    get_model_arrays,
)
from clients.app import train_client

FEATURES, CLASSES = 4, 3


class WithCounter(torch.nn.Module):
    """A model with an integer buffer, as BatchNorm has: behaviours must leave it as trained."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.linear = torch.nn.Linear(FEATURES, CLASSES)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(self.linear.weight.shape, generator=generator))
            self.linear.bias.zero_()
        self.register_buffer("steps", torch.tensor(7, dtype=torch.int64))

    def forward(self, x):
        return self.linear(x)


def data(pid: int, behaviour=None) -> ClientData:
    rng = np.random.default_rng(pid)
    y = rng.integers(0, CLASSES, size=24 + 6 * pid)
    x = (2 * np.eye(CLASSES, FEATURES)[y] + rng.normal(size=(len(y), FEATURES))).astype(np.float32)
    return ClientData(pid, x, y, x[:0], y[:0], behaviour=behaviour or HonestClient())


def start_arrays() -> dict[str, np.ndarray]:
    return get_model_arrays(WithCounter())


def train(pid: int, behaviour=None, *, seed: int = 0, server_round: int = 1, batch_size: int = 0):
    """(arrays, claimed count) the client replies in a round."""
    arrays, claimed, _ = train_client(data(pid, behaviour), WithCounter, start_arrays(), learning_rate=0.2,
                                      local_epochs=3, batch_size=batch_size, seed=seed, server_round=server_round)
    return arrays, claimed


def float64(arrays):
    return {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}


# --- free-riders --------------------------------------------------------------------------------------------


def test_a_free_rider_replies_a_copy_of_the_global_model_and_its_own_count():
    arrays, claimed = train(1, FreeRider())
    start = start_arrays()
    assert claimed == len(data(1).x_train)
    for key in start:
        assert arrays[key].dtype == start[key].dtype and arrays[key].tobytes() == start[key].tobytes()
    given = {k: v.copy() for k, v in start.items()}
    reply, _ = FreeRider().transform_reply(given, start, 5, np.random.default_rng(0))
    reply["linear.bias"] += 1.0
    assert np.array_equal(given["linear.bias"], start["linear.bias"])  # a copy, not the server's arrays


def test_a_perturbed_free_rider_adds_seeded_gaussian_noise_to_float_entries_only():
    rider = FreeRider(noise_std=0.01)
    start = {"w": np.zeros((200, 100), dtype=np.float32), "count": np.array(3, dtype=np.int64)}
    reply, claimed = rider.transform_reply(start, start, 17, np.random.default_rng(5))
    noise = reply["w"].astype(np.float64)
    assert claimed == 17 and reply["w"].dtype == np.float32 and reply["count"] == 3
    assert noise.std() == pytest.approx(0.01, rel=0.03) and abs(noise.mean()) < 0.01 * 4 / np.sqrt(noise.size)
    again, _ = rider.transform_reply(start, start, 17, np.random.default_rng(5))
    other, _ = rider.transform_reply(start, start, 17, np.random.default_rng(6))
    assert again["w"].tobytes() == reply["w"].tobytes() and other["w"].tobytes() != reply["w"].tobytes()


def test_the_run_seed_fixes_a_perturbed_free_riders_noise_per_round():
    rider = FreeRider(noise_std=1e-3)
    first, again = train(2, rider, seed=4), train(2, rider, seed=4)
    later = train(2, rider, seed=4, server_round=2)
    key = "linear.weight"
    assert first[0][key].tobytes() == again[0][key].tobytes() != later[0][key].tobytes()
    gap = first[0][key].astype(np.float64) - start_arrays()[key]
    assert 0 < np.abs(gap).max() < 1e-2  # a tiny update, not a trained one
    assert first[0]["steps"] == start_arrays()["steps"]


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf"), True, "0.1"])
def test_free_rider_noise_must_be_a_finite_non_negative_number(value):
    with pytest.raises(ValueError, match=rf"noise_std: expected a finite number ≥ 0; got {value!r}"):
        FreeRider(noise_std=value)


def test_free_rider_repr_shows_its_noise():
    assert repr(FreeRider()) == "FreeRider()" and repr(FreeRider(0.5)) == "FreeRider(noise_std=0.5)"


# --- inflated counts -------------------------------------------------------------------------------------------


def test_an_inflater_trains_honestly_and_claims_a_multiple_or_a_fixed_count():
    honest_arrays, honest_count = train(1)
    for behaviour, expected in ((InflatedExampleCount(2.5), round(2.5 * honest_count)),
                                (InflatedExampleCount(claimed=10_000), 10_000)):
        arrays, claimed = train(1, behaviour)
        assert claimed == expected and type(claimed) is int
        assert all(arrays[k].tobytes() == honest_arrays[k].tobytes() for k in arrays)


@pytest.mark.parametrize("kwargs, message", [
    ({}, "factor, claimed: expected exactly one of them"),
    ({"factor": 2.0, "claimed": 100}, "got factor=2.0, claimed=100"),
    ({"factor": 1.0}, "factor: expected a finite number > 1 (an inflation); got 1.0"),
    ({"factor": float("inf")}, "factor: expected a finite number > 1 (an inflation); got inf"),
    ({"claimed": 0}, "claimed: expected a positive integer; got 0"),
    ({"claimed": 12.5}, "claimed: expected a positive integer; got 12.5"),
])
def test_inflater_options_are_checked_where_written(kwargs, message):
    with pytest.raises(ValueError) as error:
        InflatedExampleCount(**kwargs)
    assert message in str(error.value)


# --- replicators --------------------------------------------------------------------------------------------------


def test_a_replicator_submits_the_sources_update_bit_for_bit_and_claims_its_count():
    source = data(1)
    copier = Replicator(source.x_train, source.y_train, source_id=1)
    copied, copied_count = train(3, copier)
    original, original_count = train(1)
    assert copied_count == original_count == len(source.x_train)
    assert all(copied[k].tobytes() == original[k].tobytes() for k in original)
    own, _ = train(3)
    assert any(own[k].tobytes() != original[k].tobytes() for k in original)
    assert repr(copier) == "Replicator(source_id=1)"


def test_replicator_data_is_checked():
    with pytest.raises(ValueError, match=r"x_source, y_source: expected N x d inputs and N labels with N >= 1; "
                                         r"got shapes \(5,\) and \(5,\)"):
        Replicator(np.zeros(5), np.zeros(5, dtype=np.int64))
    with pytest.raises(ValueError, match=r"got shapes \(5, 4\) and \(4,\)"):
        Replicator(np.zeros((5, 4)), np.zeros(4, dtype=np.int64))
    wrong_width = Replicator(np.zeros((5, FEATURES + 1), dtype=np.float32), np.zeros(5, dtype=np.int64))
    with pytest.raises(ValueError, match=r"x_source: expected inputs shaped like the client's own \(4,\) per example; "
                                         r"got \(5,\)"):
        train(0, wrong_width)


# --- sign flips and boosts ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("behaviour, scale", [(SignFlip(), -1.0), (BoostedUpdate(8.0), 8.0), (ScaledUpdate(0.25), 0.25)])
def test_scaled_updates_reply_the_start_plus_a_multiple_of_the_honest_update(behaviour, scale):
    honest_arrays, honest_count = train(2)
    arrays, claimed = train(2, behaviour)
    start = float64(start_arrays())
    assert claimed == honest_count
    for key in ("linear.weight", "linear.bias"):
        expected = start[key] + scale * (honest_arrays[key].astype(np.float64) - start[key])
        np.testing.assert_allclose(arrays[key], expected, rtol=1e-6, atol=1e-6)
        assert arrays[key].dtype == np.float32
    assert arrays["steps"] == honest_arrays["steps"] and arrays["steps"].dtype == np.int64


def test_a_sign_flip_mirrors_the_honest_reply_through_the_start():
    honest_arrays, _ = train(2)
    flipped, _ = train(2, SignFlip())
    start = float64(start_arrays())
    for key in ("linear.weight", "linear.bias"):
        np.testing.assert_allclose((flipped[key] + honest_arrays[key].astype(np.float64)) / 2, start[key], atol=1e-6)
    assert repr(SignFlip()) == "SignFlip()" and repr(BoostedUpdate(3)) == "BoostedUpdate(scale=3.0)"


@pytest.mark.parametrize("make, message", [
    (lambda: BoostedUpdate(1.0), "scale: expected a number > 1 (a boost); got 1.0"),
    (lambda: BoostedUpdate(-2), "scale: expected a number > 1 (a boost); got -2"),
    (lambda: ScaledUpdate(float("nan")), "scale: expected a finite number (λ in A + λ(w − A)); got nan"),
    (lambda: ScaledUpdate(None), "scale: expected a finite number (λ in A + λ(w − A)); got None"),
])
def test_scales_are_checked_where_written(make, message):
    with pytest.raises(ValueError) as error:
        make()
    assert message in str(error.value)


def test_every_behaviour_survives_cloudpickle_as_ray_sends_it():
    source = data(1)
    behaviours = [FreeRider(1e-3), InflatedExampleCount(4), Replicator(source.x_train, source.y_train, source_id=1),
                  SignFlip(), BoostedUpdate(3.0)]
    for behaviour in behaviours:
        clone = cloudpickle.loads(cloudpickle.dumps(behaviour))
        assert type(clone) is type(behaviour) and repr(clone) == repr(behaviour)
        expected, got = train(2, behaviour, seed=1), train(2, clone, seed=1)
        assert got[1] == expected[1] and all(got[0][k].tobytes() == expected[0][k].tobytes() for k in got[0])
