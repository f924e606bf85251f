"""Local SGD: it learns, it is deterministic, and model state <-> numpy round-trips."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from clients.training import evaluate_model, get_model_arrays, set_model_arrays, train_locally


def linear(input_dim: int, output_dim: int, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(input_dim, output_dim)
    with torch.no_grad():
        model.weight.copy_(torch.randn(model.weight.shape, generator=generator) * 0.1)
        model.bias.zero_()
    return model


def separable_problem(num_examples: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_examples, 2)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    return x, y


def test_full_batch_sgd_reduces_cross_entropy_and_reports_last_epoch_loss():
    x, y = separable_problem()
    model = linear(2, 2)
    before = evaluate_model(model, x, y)["loss"]
    reference = copy.deepcopy(model)
    last = train_locally(model, x, y, epochs=30, learning_rate=0.5, seed=0)
    after = evaluate_model(model, x, y)
    assert after["loss"] < 0.5 * before and after["accuracy"] > 0.9
    # Full batch: the reported loss is the loss before the 30th (last) step.
    train_locally(reference, x, y, epochs=29, learning_rate=0.5, seed=0)
    assert last == pytest.approx(evaluate_model(reference, x, y)["loss"], rel=1e-6)


def test_mse_regression_with_a_column_head_learns():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)
    model = linear(3, 1)
    before = evaluate_model(model, x, y, loss="mse")["loss"]
    train_locally(model, x, y, epochs=200, learning_rate=0.1, loss="mse", seed=0)
    assert evaluate_model(model, x, y, loss="mse")["loss"] < 1e-3 * before


def test_minibatch_training_is_bitwise_deterministic_by_seed():
    x, y = separable_problem(70)
    runs = []
    for seed in (3, 3, 4):
        model = linear(2, 2)
        loss = train_locally(model, x, y, epochs=3, learning_rate=0.1, batch_size=8, seed=seed)
        runs.append((loss, get_model_arrays(model)))
    (loss_a, arrays_a), (loss_b, arrays_b), (_, arrays_c) = runs
    assert loss_a == loss_b
    for key in arrays_a:
        assert arrays_a[key].tobytes() == arrays_b[key].tobytes()
    assert any(not np.array_equal(arrays_a[k], arrays_c[k]) for k in arrays_a)


def test_training_leaves_the_global_torch_rng_alone():
    x, y = separable_problem()
    model = linear(2, 2)  # nn.Linear's own init draws from the global RNG: build it first
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    train_locally(model, x, y, epochs=2, learning_rate=0.1, batch_size=5, seed=1)
    assert torch.equal(torch.rand(2), expected)


def test_batch_size_at_least_n_is_full_batch():
    x, y = separable_problem(20)
    a, b = linear(2, 2), linear(2, 2)
    train_locally(a, x, y, epochs=4, learning_rate=0.1, batch_size=None, seed=0)
    train_locally(b, x, y, epochs=4, learning_rate=0.1, batch_size=20, seed=99)
    for key, value in get_model_arrays(a).items():
        np.testing.assert_array_equal(value, get_model_arrays(b)[key])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(epochs=0), "epochs: expected a positive integer"),
        (dict(learning_rate=0.0), "learning_rate: expected a finite number > 0"),
        (dict(learning_rate=float("nan")), "learning_rate"),
        (dict(batch_size=0), "batch_size: expected a positive integer"),
        (dict(loss="hinge"), "loss: expected one of"),
    ],
)
def test_bad_training_arguments_are_named(kwargs, message):
    x, y = separable_problem(10)
    arguments = dict(epochs=1, learning_rate=0.1, seed=0) | kwargs
    with pytest.raises(ValueError, match=message):
        train_locally(linear(2, 2), x, y, **arguments)


def test_bad_training_data_is_named():
    x, y = separable_problem(10)
    with pytest.raises(ValueError, match="x: expected at least one training example"):
        train_locally(linear(2, 2), x[:0], y[:0], epochs=1, learning_rate=0.1, seed=0)
    with pytest.raises(ValueError, match="x, y: expected the same number of examples"):
        train_locally(linear(2, 2), x, y[:5], epochs=1, learning_rate=0.1, seed=0)
    with pytest.raises(ValueError, match="y: expected integer class labels"):
        train_locally(linear(2, 2), x, y.astype(np.float32), epochs=1, learning_rate=0.1, seed=0)


def test_read_only_inputs_are_accepted_without_warnings(recwarn):
    x, y = separable_problem(10)
    x.flags.writeable = False
    train_locally(linear(2, 2), x, y, epochs=1, learning_rate=0.1, seed=0)
    assert not [w for w in recwarn if "not writable" in str(w.message)]


def test_model_arrays_round_trip_in_state_dict_order_and_cast_dtype():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    arrays = get_model_arrays(model)
    assert list(arrays) == list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    arrays["0.bias"][:] = 7.0  # a copy: the model is untouched
    assert not torch.any(model[0].bias == 7.0)
    other = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    set_model_arrays(other, {k: v.astype(np.float64) for k, v in arrays.items()})
    assert other[0].bias.dtype == torch.float32 and torch.all(other[0].bias == 7.0)


def test_set_model_arrays_rejects_other_keys_and_shapes():
    model = torch.nn.Linear(3, 2)
    arrays = get_model_arrays(model)
    with pytest.raises(ValueError, match=r"arrays: expected exactly the model's state keys .*missing \['bias'\]"):
        set_model_arrays(model, {"weight": arrays["weight"]})
    with pytest.raises(ValueError, match=r"arrays: expected shape \(2,\) for 'bias'; got \(3,\)"):
        set_model_arrays(model, {"weight": arrays["weight"], "bias": np.zeros(3, np.float32)})
