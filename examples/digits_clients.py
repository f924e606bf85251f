"""The user's side of the examples: a torch model and the clients' data (scikit-learn's
digits, embedded, nothing downloaded)."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits

from clients import ClientData, HonestClient, LabelNoise


def make_model() -> torch.nn.Module:
    """The global model: 64 pixels -> 32 hidden units -> 10 digits."""
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits as float32 in [0, 1], shuffled, 80% for the clients and 20% held out."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = (x[order] / 16.0).astype(np.float32), y[order].astype(np.int64)
    cut = int(0.8 * len(y))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def noisy_clients(num_clients: int, num_noisy: int, seed: int) -> frozenset[int]:
    """Which clients train on noisy labels (drawn from ``seed``)."""
    return frozenset(int(c) for c in np.random.default_rng([seed, 1]).choice(num_clients, num_noisy, replace=False))


def load_client(partition_id: int, *, num_clients: int, seed: int, num_noisy: int = 0) -> ClientData:
    """Client ``partition_id``'s share of the training pool: 80% to train on, 20% to infer on;
    the ``num_noisy`` noisy clients flip each training label with probability 0.7.

    Ray calls it in the worker that runs the client, so it must be picklable: a module-level
    function (bound with functools.partial), loading the data itself rather than closing over it.
    """
    x, y, _, _ = digits(seed)
    share = np.array_split(np.arange(len(y)), num_clients)[partition_id]
    cut = int(0.8 * len(share))
    train, infer = share[:cut], share[cut:]
    noisy = partition_id in noisy_clients(num_clients, num_noisy, seed)
    return ClientData(
        partition_id=partition_id,
        x_train=x[train], y_train=y[train],      # what the client trains on
        x_infer=x[infer], y_infer=y[infer],      # its inference split (TracIn flows; may be empty without flows)
        behaviour=LabelNoise(0.7, 10, seed=[seed, partition_id]) if noisy else HonestClient(),
    )
