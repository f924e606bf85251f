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

from fedvalue._checks import check_integer
from clients.seeding import Seed, torch_generator


def check_hidden(hidden: Sequence[int]) -> tuple[int, ...]:
    """The hidden layer sizes as a tuple of positive ints, else a ValueError naming ``hidden``."""
    if any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1 for h in hidden):
        raise ValueError(f"hidden: expected positive layer sizes; got {list(hidden)}.")
    return tuple(int(h) for h in hidden)


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
    input_dim = check_integer("input_dim", input_dim)
    num_classes = check_integer("num_classes", num_classes)
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise ValueError(f"hidden: expected a sequence of positive integers; got {hidden!r}.")
    sizes = [input_dim, *check_hidden(hidden), num_classes]
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
