"""Models: architecture, seeded deterministic init, the global torch RNG left alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from simulations.datasets.models import make_linear_model, make_mlp


def states_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_mlp_of_seed_004_has_two_hidden_relu_layers_of_200():
    model = make_mlp(784, 10, seed=0)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(784, 200), (200, 200), (200, 10)]
    assert sum(isinstance(m, torch.nn.ReLU) for m in model) == 2
    assert model(torch.zeros(3, 784)).shape == (3, 10)


def test_same_seed_same_parameters_other_seed_other_parameters():
    assert states_equal(make_mlp(64, 10, seed=5), make_mlp(64, 10, seed=5))
    assert states_equal(make_mlp(64, 10, seed=[5, 1]), make_mlp(64, 10, seed=[5, 1]))
    assert not states_equal(make_mlp(64, 10, seed=5), make_mlp(64, 10, seed=6))


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_init_neither_reads_nor_changes_the_global_torch_rng(kind):
    from simulations.datasets.models import make_model

    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first = make_model(kind, 784, 10, seed=0)
    assert torch.equal(torch.rand(3), expected_next)
    torch.manual_seed(999)
    assert states_equal(first, make_model(kind, 784, 10, seed=0))


def test_parameters_follow_torch_default_linear_bounds():
    model = make_mlp(100, 7, hidden=(50,), seed=1)
    for layer in (m for m in model if isinstance(m, torch.nn.Linear)):
        bound = 1 / math.sqrt(layer.in_features)
        for tensor in (layer.weight, layer.bias):
            assert tensor.abs().max() <= bound
            assert tensor.abs().max() > 0.8 * bound  # actually spread, not all zeros
            assert tensor.dtype == torch.float32 and tensor.device.type == "cpu"


def test_linear_model_is_one_layer():
    model = make_linear_model(10, 1, seed=np.random.default_rng(0))
    assert len(model) == 1 and isinstance(model[0], torch.nn.Linear)
    assert model(torch.zeros(4, 10)).shape == (4, 1)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(input_dim=0, num_classes=2), "input_dim"),
        (dict(input_dim=3, num_classes=2.0), "num_classes"),
        (dict(input_dim=3, num_classes=2, hidden=(10, 0)), "hidden"),
        (dict(input_dim=3, num_classes=2, hidden=10), "hidden"),
        (dict(input_dim=3, num_classes=2, seed=-1), "seed"),
    ],
)
def test_bad_arguments_are_named(kwargs, name):
    kwargs.setdefault("seed", 0)
    with pytest.raises(ValueError, match=f"{name}: expected"):
        make_mlp(**kwargs)


# --- the LeNet-style CNN -----------------------------------------------------------------------


def test_cnn_is_lenet_shaped_for_28x28_and_small_images():
    from simulations.datasets.models import make_cnn, num_parameters

    model = make_cnn(784, 10, seed=0)
    convs = [m for m in model if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == \
        [(1, 6, (5, 5), (2, 2)), (6, 16, (5, 5), (2, 2))]
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(784, 120), (120, 84), (84, 10)]
    assert num_parameters("cnn", 784, 10) == sum(p.numel() for p in model.parameters()) == 107_786
    assert model(torch.zeros(3, 784)).shape == (3, 10)
    assert make_cnn(64, 10, seed=0)(torch.zeros(2, 64)).shape == (2, 10)  # digits: 8 -> 4 -> 2


def test_cnn_init_is_seeded_and_follows_default_bounds():
    from simulations.datasets.models import make_cnn

    model = make_cnn(784, 10, seed=3)
    assert states_equal(model, make_cnn(784, 10, seed=3)) and not states_equal(model, make_cnn(784, 10, seed=4))
    for layer in (m for m in model if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))):
        bound = 1 / math.sqrt(layer.weight[0].numel())  # fan-in: in_channels × 5 × 5, or in_features
        assert 0.8 * bound < layer.weight.abs().max() <= bound and layer.bias.abs().max() <= bound


def test_make_model_by_name_and_bad_cnn_input_named():
    from simulations.datasets.models import make_cnn, make_model

    assert states_equal(make_model("mlp", 64, 10, hidden=(8,), seed=1), make_mlp(64, 10, hidden=(8,), seed=1))
    assert states_equal(make_model("cnn", 64, 10, seed=1), make_cnn(64, 10, seed=1))
    with pytest.raises(ValueError, match="model: expected one of"):
        make_model("resnet", 64, 10, seed=0)
    with pytest.raises(ValueError, match="input_dim: the CNN takes square images"):
        make_cnn(30, 10, seed=0)
    with pytest.raises(ValueError, match="channels: 3 convolutions"):
        make_cnn(16, 10, channels=(2, 2, 2), seed=0)
