"""One seed's federation of the noisy-federation benchmark: Fashion-MNIST split three ways, the
clients' partitions and which clients are bad.

From Fashion-MNIST's 60,000 training images a class-balanced validation split of
``validation_examples`` is drawn for the server (its utility values on it; no client holds any
of it); the rest is partitioned among ``num_clients`` clients by Flower Datasets'
``DirichletPartitioner`` (label skew, α = ``dirichlet_alpha``) or IID. Accuracy is reported on the
10,000 test images (or a class-balanced ``test_examples`` of them), never used to value or decide.
A share ``noisy_fraction`` of the clients flip each of their labels with probability p to a
uniformly chosen other class (symmetric noise; the flips are fixed per client, as a noisy
dataset's); a share ``extra_bad_fraction`` of the others are free-riders
(:class:`clients.behaviours.FreeRider`). The clean federation (the targets' reference) and the
oracle are the same data with every client honest, resp. with only the honest ones sampled.

One engine serves every (seed, p, policy) run: each train and query message names its federation
by a ``data-key`` (:func:`data_key`), and a client loads that federation's data (cached per
process, so a Ray worker prepares a seed once).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from clients import ClientBehaviour, ClientData, FreeRider, HonestClient, LabelNoise
from simulations.datasets import Dataset, load_dataset, make_model, partition, sample_per_class

#: The settings that make a federation (the rest of the config is how it is trained).
DATA_FIELDS = ("seed", "num_clients", "partition", "dirichlet_alpha", "validation_examples", "test_examples",
               "noisy_fraction", "extra_bad_kind", "extra_bad_fraction")
NUM_CLASSES, INPUT_DIM = 10, 784


@dataclass(frozen=True)
class Federation:
    """One seed's data: the clients' pool and partitions, the server's validation split, the
    test images, the label flippers (``noisy``) and the clients of the extra bad kind."""

    pool: Dataset
    validation: Dataset
    test: Dataset
    partitions: tuple[np.ndarray, ...]
    noisy: frozenset
    extra_bad: frozenset

    @property
    def bad(self) -> frozenset:
        """Every client that is not honest."""
        return self.noisy | self.extra_bad

    @property
    def clean(self) -> list[int]:
        return [c for c in range(len(self.partitions)) if c not in self.bad]


@functools.lru_cache(maxsize=1)
def _fashion_mnist() -> tuple[Dataset, Dataset]:
    """Fashion-MNIST's training and test images, as Debian's dataset-fashion-mnist installs them."""
    return load_dataset("fashion-mnist", split="train"), load_dataset("fashion-mnist", split="test")


def data_settings(config) -> str:
    """The settings of ``config`` that make its seed's federation, as a cache key."""
    return json.dumps({name: getattr(config, name) for name in DATA_FIELDS}, sort_keys=True)


@functools.lru_cache(maxsize=4)
def federation(settings: str) -> Federation:
    """The federation :func:`data_settings` names (seeded; cached per process)."""
    s = json.loads(settings)
    train, test = _fashion_mnist()
    draws = [np.random.default_rng(child) for child in np.random.SeedSequence([s["seed"], 0xFED]).spawn(5)]
    validation_rows = sample_per_class(train.y, s["validation_examples"], seed=draws[0], name="validation_examples")
    pool = train.subset(np.setdiff1d(np.arange(len(train.y)), validation_rows))
    if s["test_examples"]:
        test = test.subset(sample_per_class(test.y, s["test_examples"], seed=draws[1], name="test_examples"))
    partitions = partition(pool.y, s["num_clients"], scheme=s["partition"], seed=draws[2], alpha=s["dirichlet_alpha"])
    clients = np.arange(s["num_clients"])
    noisy = draws[3].choice(clients, round(s["noisy_fraction"] * s["num_clients"]), replace=False)
    others = np.setdiff1d(clients, noisy)
    extra = draws[4].choice(others, round(s["extra_bad_fraction"] * s["num_clients"]), replace=False)
    return Federation(pool, train.subset(validation_rows), test, tuple(partitions),
                      frozenset(int(c) for c in noisy), frozenset(int(c) for c in extra))


def data_key(seed: int, flip_probability: float, *, clean: bool = False) -> str:
    """Which federation a message's client loads: the seed's, with flip probability p (``clean``:
    every client honest)."""
    return json.dumps({"seed": int(seed), "flip_probability": float(flip_probability), "clean": bool(clean)},
                      sort_keys=True)


def behaviour_of(client: int, fed: Federation, key: dict) -> ClientBehaviour:
    """Client ``client``'s script in the federation ``key`` names."""
    if key["clean"]:
        return HonestClient()
    if client in fed.noisy:
        return LabelNoise(key["flip_probability"], NUM_CLASSES, seed=[key["seed"], client])
    if client in fed.extra_bad:
        return FreeRider()
    return HonestClient()


def client_data(partition_id: int, data_key: str | None = None, *, settings: str) -> ClientData:
    """Client ``partition_id``'s data and behaviour in the federation ``data_key`` names."""
    if data_key is None:
        raise ValueError("data_key: expected the federation a message names (the benchmark's clients serve several); "
                         "got none.")
    try:
        key = json.loads(data_key)
        base = {**json.loads(settings), "seed": int(key["seed"])}
        flip, clean = float(key["flip_probability"]), key["clean"]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise ValueError(f"data_key: expected a JSON object with seed, flip_probability and clean; got "
                         f"{data_key!r}.") from None
    if not isinstance(clean, bool) or not 0 < flip <= 1:
        raise ValueError(f"data_key: expected clean true or false and flip_probability in (0, 1]; got {data_key!r}.")
    fed = federation(json.dumps(base, sort_keys=True))
    rows = fed.partitions[partition_id]
    x, y = fed.pool.x[rows], fed.pool.y[rows]
    return ClientData(partition_id=partition_id, x_train=x, y_train=y, x_infer=x[:0], y_infer=y[:0],
                      behaviour=behaviour_of(partition_id, fed, key))


def model_factory(model: str, hidden: tuple[int, ...], seed: int) -> Callable[[], torch.nn.Module]:
    """The seed's initial model of kind ``model`` (the MLP with ``hidden`` layers, or the CNN)."""
    return functools.partial(make_model, model, INPUT_DIM, NUM_CLASSES, hidden=tuple(hidden), seed=seed)
