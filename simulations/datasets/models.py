"""Models of the simulations, initialized deterministically from a seed.

Parameters are drawn with a private ``torch.Generator`` from PyTorch's default
``nn.Linear`` / ``nn.Conv2d`` distribution (weights and biases uniform in ±1/sqrt(fan_in)),
so the global torch RNG is neither used nor changed and the same seed gives the same model.

``make_model(kind, ...)`` builds the simulations' models by name (:data:`MODELS`): ``"mlp"``
or ``"cnn"``. Both take the flattened rows of :class:`simulations.datasets.loaders.Dataset`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from clients.seeding import Seed, torch_generator
from fedvalue._checks import check_integer


def check_hidden(hidden: Sequence[int]) -> tuple[int, ...]:
    """The hidden layer sizes as a tuple of positive ints, else a ValueError naming ``hidden``."""
    if any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1 for h in hidden):
        raise ValueError(f"hidden: expected positive layer sizes; got {list(hidden)}.")
    return tuple(int(h) for h in hidden)


#: Model kinds of :func:`make_model`.
MODELS = ("mlp", "cnn")


@torch.no_grad()
def _init_linear(layer: torch.nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default init (kaiming-uniform with a = √5: bound 1/√fan_in), from ``generator``."""
    fan_in = layer.weight[0].numel()  # in_features, or in_channels / groups × kernel size
    bound = 1.0 / math.sqrt(fan_in)
    layer.weight.uniform_(-bound, bound, generator=generator)
    if layer.bias is not None:
        layer.bias.uniform_(-bound, bound, generator=generator)


def make_mlp(
    input_dim: int,
    num_classes: int,
    *,
    hidden: Sequence[int] = (200, 200),
    seed: Seed,
) -> torch.nn.Sequential:
    """A ReLU MLP ``input_dim -> hidden... -> num_classes`` (logits).

    [ADS] App. C.2 uses ``make_mlp(784, 10, hidden=(200, 200))``. ``hidden=()``
    gives a single linear layer.

    Parameters
    ----------
    input_dim
        Number of input features.
    num_classes
        Number of outputs (classes; 1 for a regression head).
    hidden
        Sizes of the hidden layers.
    seed
        Seed of the initial parameters.
    """
    input_dim = check_integer("input_dim", input_dim)
    num_classes = check_integer("num_classes", num_classes)
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise ValueError(f"hidden: expected a sequence of positive integers; got {hidden!r}.")
    sizes = [input_dim, *check_hidden(hidden), num_classes]
    return torch.nn.Sequential(*_relu_mlp(sizes, torch_generator(seed)))


def _relu_mlp(sizes: Sequence[int], generator: torch.Generator) -> list[torch.nn.Module]:
    """Linear layers ``sizes[0] -> ... -> sizes[-1]`` with ReLUs between, drawn from ``generator``."""
    layers: list[torch.nn.Module] = []
    for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        # Built on the meta device: nn.Linear's own init would draw from the global RNG.
        linear = torch.nn.Linear(fan_in, fan_out, device="meta").to_empty(device="cpu")
        _init_linear(linear, generator)
        layers.append(linear)
        if index < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return layers


def make_linear_model(input_dim: int, output_dim: int, *, seed: Seed) -> torch.nn.Sequential:
    """One linear layer ``input_dim -> output_dim``: logistic regression with
    cross-entropy (``output_dim`` = classes) or linear regression with MSE (1)."""
    return make_mlp(input_dim, output_dim, hidden=(), seed=seed)


def make_cnn(
    input_dim: int,
    num_classes: int,
    *,
    channels: Sequence[int] = (6, 16),
    hidden: Sequence[int] = (120, 84),
    seed: Seed,
) -> torch.nn.Sequential:
    """A LeNet-5-style CNN for square one-channel images given as flattened rows.

    Unflatten to 1 × s × s (s = √input_dim), then per entry of ``channels`` a 5×5
    convolution (padding 2: the side is kept) with ReLU and 2×2 max pooling, then
    Flatten and a ReLU MLP ``hidden`` to ``num_classes`` logits. For 28×28 images:
    conv 1→6, pool to 14×14, conv 6→16, pool to 7×7, 784 → 120 → 84 → 10 (LeCun et al.'s
    LeNet-5 with "same" padding in both convolutions; 107,786 parameters).

    The first parametrized module is the first convolution, after the parameter-free
    Unflatten: :class:`fedvalue.scoring.torch_utilities.TorchModelUtility` scores FedAvg coalitions
    of it with the first layer's outputs computed once per client (:mod:`fedvalue.scoring.linear`).
    """
    input_dim = check_integer("input_dim", input_dim)
    num_classes = check_integer("num_classes", num_classes)
    side = math.isqrt(input_dim)
    if side * side != input_dim:
        raise ValueError(f"input_dim: the CNN takes square images as flattened rows; got {input_dim} features, "
                         "not a square number.")
    channels = check_hidden(channels) if len(channels) else ()
    if not channels:
        raise ValueError("channels: expected at least one convolution's channel count; got none.")
    if side >> len(channels) < 1:
        raise ValueError(f"channels: {len(channels)} convolutions with 2×2 pooling need images of at least "
                         f"{1 << len(channels)} pixels a side; got {side}×{side}.")
    generator = torch_generator(seed)
    layers: list[torch.nn.Module] = [torch.nn.Unflatten(1, (1, side, side))]
    previous = 1
    for count in channels:
        # Built on the meta device: the layers' own init would draw from the global RNG.
        conv = torch.nn.Conv2d(previous, count, 5, padding=2, device="meta").to_empty(device="cpu")
        _init_linear(conv, generator)
        layers += [conv, torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
        previous, side = count, side // 2
    layers.append(torch.nn.Flatten())
    layers += _relu_mlp([previous * side * side, *check_hidden(hidden), num_classes], generator)
    return torch.nn.Sequential(*layers)


def make_model(kind: str, input_dim: int, num_classes: int, *, hidden: Sequence[int] = (200, 200),
               seed: Seed) -> torch.nn.Sequential:
    """The simulations' model ``kind`` (:data:`MODELS`): ``"mlp"`` is :func:`make_mlp` with
    ``hidden``; ``"cnn"`` is :func:`make_cnn` (its own layer sizes; ``hidden`` is the MLP's)."""
    if kind == "mlp":
        return make_mlp(input_dim, num_classes, hidden=hidden, seed=seed)
    if kind == "cnn":
        return make_cnn(input_dim, num_classes, seed=seed)
    raise ValueError(f"model: expected one of {list(MODELS)}; got {kind!r}.")


def num_parameters(kind: str, input_dim: int, num_classes: int, *, hidden: Sequence[int] = (200, 200)) -> int:
    """Parameters of :func:`make_model`'s ``kind`` without building it (counts refuse huge models early)."""
    if kind == "mlp":
        sizes = [input_dim, *check_hidden(hidden), num_classes]
        return sum(a * b + b for a, b in zip(sizes, sizes[1:]))
    with torch.device("meta"):
        return sum(p.numel() for p in make_cnn(input_dim, num_classes, seed=0).parameters())
