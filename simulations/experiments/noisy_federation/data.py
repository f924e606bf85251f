"""One seed's federation of the noisy-federation benchmark: Fashion-MNIST split three ways, the
clients' partitions and which clients are bad.

From Fashion-MNIST's 60,000 training images a class-balanced validation split of
``validation_examples`` is drawn for the server (its utility values on it; no client holds any
of it); the rest is partitioned among ``num_clients`` clients by Flower Datasets'
``DirichletPartitioner`` (label skew, α = ``dirichlet_alpha``) or IID. Accuracy is reported on the
10,000 test images (or a class-balanced ``test_examples`` of them), never used to value or decide.
A share ``noisy_fraction`` of the clients are of the ``bad_kind`` (:func:`bad_behaviour`; by
default they flip each of their labels with probability p to a uniformly chosen other class,
symmetric noise fixed per client as a noisy dataset's); a share ``extra_bad_fraction`` of the
others are of the ``extra_bad_kind``. With ``mavericks`` = m, m classes are each given whole to one
honest client (every example of the class moves to its partition): the sole holder of a class,
whom an elimination rule must not write off. The clean federation (the targets' reference) and
the oracle are the same data with every client honest, resp. with only the honest ones sampled.

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

from clients import (
    BoostedUpdate,
    ClassPairSwap,
    ClientBehaviour,
    ClientData,
    FeatureNoise,
    FreeRider,
    HonestClient,
    LabelNoise,
    NoisyUpdate,
    SignFlip,
    StaleReplayer,
)
from simulations.datasets import Dataset, load_dataset, make_model, partition, sample_per_class

#: The settings that make a federation (the rest of the config is how it is trained).
DATA_FIELDS = ("seed", "num_clients", "partition", "dirichlet_alpha", "validation_examples", "test_examples",
               "noisy_fraction", "bad_kind", "extra_bad_kind", "extra_bad_fraction", "mavericks")
NUM_CLASSES, INPUT_DIM = 10, 784
#: Fashion-MNIST's easily confused classes, paired for the class-swap kind (chosen before results):
#: T-shirt/top-shirt, pullover-coat, sandal-sneaker, trouser-dress, bag-ankle boot.
CONFUSED_PAIRS = ((0, 6), (2, 4), (5, 7), (1, 3), (8, 9))
#: The bad kinds' settings, chosen before results: the input noise's σ on pixels in [0, 1], the
#: noisy free-rider's σ, the stale model's age, the boost λ and the update noise over the update's rms.
FEATURE_NOISE_STD, FREE_RIDER_NOISE_STD, STALE_LAG, BOOST, UPDATE_NOISE = 1.0, 0.01, 1, 5.0, 3.0
#: Bad kinds whose clients remember the global models they received (:mod:`clients.attacks.memory`).
REMEMBERING_KINDS = ("stale-replayer",)


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
    bad_kind: str = "label-flip"
    extra_bad_kind: str = "none"
    #: class -> the honest client that alone holds it
    mavericks: tuple[tuple[int, int], ...] = ()

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
    draws = [np.random.default_rng(child) for child in np.random.SeedSequence([s["seed"], 0xFED]).spawn(6)]
    validation_rows = sample_per_class(train.y, s["validation_examples"], seed=draws[0], name="validation_examples")
    pool = train.subset(np.setdiff1d(np.arange(len(train.y)), validation_rows))
    if s["test_examples"]:
        test = test.subset(sample_per_class(test.y, s["test_examples"], seed=draws[1], name="test_examples"))
    partitions = partition(pool.y, s["num_clients"], scheme=s["partition"], seed=draws[2], alpha=s["dirichlet_alpha"])
    clients = np.arange(s["num_clients"])
    bad_kind = s["bad_kind"]
    noisy = draws[3].choice(clients, round(s["noisy_fraction"] * s["num_clients"]), replace=False)
    if bad_kind == "none":
        noisy = noisy[:0]
    others = np.setdiff1d(clients, noisy)
    extra = draws[4].choice(others, round(s["extra_bad_fraction"] * s["num_clients"]), replace=False)
    mavericks = ()
    if s["mavericks"]:
        honest = np.setdiff1d(others, extra)
        partitions, mavericks = give_classes_whole(pool.y, list(partitions), s["mavericks"], honest, seed=draws[5])
    return Federation(pool, train.subset(validation_rows), test, tuple(partitions),
                      frozenset(int(c) for c in noisy), frozenset(int(c) for c in extra), bad_kind,
                      s["extra_bad_kind"], mavericks)


def give_classes_whole(labels: np.ndarray, partitions: list[np.ndarray], count: int, honest: np.ndarray, *,
                       seed: np.random.Generator) -> tuple[list[np.ndarray], tuple[tuple[int, int], ...]]:
    """``count`` classes drawn at random, each moved whole (every example, from every partition)
    into the partition of one client drawn from ``honest``: (the new partitions, ((class, client),
    ...) sorted by class). ValueError when there are fewer honest clients than classes, or when a
    client would be left with no example."""
    if len(honest) < count:
        raise ValueError(f"mavericks: expected at most the {len(honest)} honest clients; got {count}.")
    classes = np.sort(seed.choice(np.unique(labels), count, replace=False))
    holders = seed.choice(honest, count, replace=False)
    moved = np.isin(labels, classes)
    kept = [rows[~moved[rows]] for rows in partitions]
    for cls, client in zip(classes, holders):
        kept[client] = np.sort(np.concatenate([kept[client], np.flatnonzero(labels == cls)]))
    empty = [c for c, rows in enumerate(kept) if len(rows) == 0]
    if empty:
        raise ValueError(f"mavericks: moving classes {classes.tolist()} whole would leave clients {empty} with no "
                         "example; use fewer mavericks, a larger dirichlet_alpha or the iid partition.")
    return kept, tuple(sorted((int(cls), int(client)) for cls, client in zip(classes, holders)))


def data_key(seed: int, flip_probability: float, *, clean: bool = False, run: str | None = None) -> str:
    """Which federation a message's client loads: the seed's, with flip probability p (``clean``:
    every client honest). ``run`` names the run too, where bad clients remember the models they
    received (:data:`REMEMBERING_KINDS`): a client's memory is kept per data key, and the runs of
    one federation must not share it."""
    key = {"seed": int(seed), "flip_probability": float(flip_probability), "clean": bool(clean)}
    if run is not None:
        key["run"] = str(run)
    return json.dumps(key, sort_keys=True)


def behaviour_of(client: int, fed: Federation, key: dict) -> ClientBehaviour:
    """Client ``client``'s script in the federation ``key`` names."""
    if key["clean"]:
        return HonestClient()
    if client in fed.noisy:
        return bad_behaviour(fed.bad_kind, key["flip_probability"], seed=[key["seed"], client])
    if client in fed.extra_bad:
        return bad_behaviour(fed.extra_bad_kind, 1.0, seed=[key["seed"], client])
    return HonestClient()


def bad_behaviour(kind: str, p: float, *, seed: list[int]) -> ClientBehaviour:
    """The public client behaviour of a bad kind (:data:`.config.BAD_KINDS`) at strength ``p`` (the
    label kinds' flip probability, the share of corrupted examples), its noise fixed by ``seed``."""
    if kind == "label-flip":
        return LabelNoise(p, NUM_CLASSES, seed=seed)
    if kind == "class-swap":
        return ClassPairSwap(CONFUSED_PAIRS, p, seed=seed)
    if kind == "feature-noise":
        return FeatureNoise(FEATURE_NOISE_STD, p, clip=(0.0, 1.0), seed=seed)
    built = {"free-rider": FreeRider, "noisy-free-rider": lambda: FreeRider(FREE_RIDER_NOISE_STD),
             "stale-replayer": lambda: StaleReplayer(STALE_LAG), "sign-flip": SignFlip,
             "boosted-update": lambda: BoostedUpdate(BOOST), "noisy-update": lambda: NoisyUpdate(UPDATE_NOISE)}
    if kind not in built:
        raise ValueError(f"bad_kind: expected a kind of bad client; got {kind!r}.")
    return built[kind]()


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
