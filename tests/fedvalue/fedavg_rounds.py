"""Small FedAvg rounds for the linear-scoring tests: a start state, clients' models around
it with unequal weights, and coalition rows over (A_{t−1}, w_1, ..., w_n) as the FedAvg
round game builds them (C[S, i] = n_i / Σ_{j∈S} n_j)."""

from __future__ import annotations

import itertools

import numpy as np
import torch


def model_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def round_around(seed: int, num_clients: int, model: torch.nn.Module, spread: float = 0.3):
    """The model's state as the start, clients at start + spread · N(0, 1), weights in [1, 100)."""
    rng = np.random.default_rng(seed)
    start = model_state(model)
    clients = [
        {k: (v + spread * rng.normal(size=v.shape)).astype(v.dtype) for k, v in start.items()}
        for _ in range(num_clients)
    ]
    weights = rng.integers(1, 100, num_clients).astype(float)
    return start, clients, weights


def all_coalitions(num_clients: int) -> list[tuple[int, ...]]:
    """Every nonempty coalition, by size then lexicographically."""
    return [c for size in range(1, num_clients + 1) for c in itertools.combinations(range(num_clients), size)]


def fedavg_rows(coalitions: list[tuple[int, ...]], weights: np.ndarray) -> np.ndarray:
    """One row per coalition over (A_{t−1}, w_1, ..., w_n)."""
    rows = np.zeros((len(coalitions), len(weights) + 1))
    for r, members in enumerate(coalitions):
        rows[r, [1 + k for k in members]] = weights[list(members)]
    return rows / rows.sum(axis=1, keepdims=True)


def all_coalition_rows(num_clients: int, weights: np.ndarray) -> tuple[list[tuple[int, ...]], np.ndarray]:
    coalitions = all_coalitions(num_clients)
    return coalitions, fedavg_rows(coalitions, weights)
