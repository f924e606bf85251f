"""Models of the simulations, initialized deterministically from a seed.

Parameters are drawn with a private ``torch.Generator`` from PyTorch's default
``nn.Linear`` distribution (weights and biases uniform in ±1/sqrt(fan_in)), so the
global torch RNG is neither used nor changed and the same seed gives the same model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from clients.seeding import Seed, torch_generator


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive integer; got {value!r}.")
    return int(value)


@torch.no_grad()
def _init_linear(layer: torch.nn.Linear, generator: torch.Generator) -> None:
    bound = 1.0 / math.sqrt(layer.in_features)
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
    input_dim = _positive_int("input_dim", input_dim)
    num_classes = _positive_int("num_classes", num_classes)
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise ValueError(f"hidden: expected a sequence of positive integers; got {hidden!r}.")
    sizes = [input_dim] + [_positive_int("hidden", size) for size in hidden] + [num_classes]
    generator = torch_generator(seed)
    layers: list[torch.nn.Module] = []
    for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        # Built on the meta device: nn.Linear's own init would draw from the global RNG.
        linear = torch.nn.Linear(fan_in, fan_out, device="meta").to_empty(device="cpu")
        _init_linear(linear, generator)
        layers.append(linear)
        if index < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def make_linear_model(input_dim: int, output_dim: int, *, seed: Seed) -> torch.nn.Sequential:
    """One linear layer ``input_dim -> output_dim``: logistic regression with
    cross-entropy (``output_dim`` = classes) or linear regression with MSE (1)."""
    return make_mlp(input_dim, output_dim, hidden=(), seed=seed)
