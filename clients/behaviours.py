"""Scripted client behaviours: what a simulated client does to its data and its reply.

A behaviour is applied by the ClientApp (:mod:`clients.app`) around honest local
training::

    x, y = behaviour.transform_training_data(x_train, y_train, rng)
    ... train the received global model on (x, y) ...
    arrays, num_examples = behaviour.transform_reply(global_arrays, trained_arrays, len(x), rng)

Behaviours travel to the Ray workers with the client's data, so they must be
picklable (plain classes with plain attributes).

:func:`flip_labels` is the label noise of seed 004 App. C.2 ("Noisy contributors"):
each label is independently flipped with probability p to a uniformly chosen class in
{0, ..., K-1} \\ {y_true}; input features are left unchanged.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from clients.seeding import Seed, as_generator


def flip_labels(labels: np.ndarray, p: float, num_classes: int, *, seed: Seed) -> np.ndarray:
    """Flip each label with probability ``p`` to a uniformly chosen OTHER class.

    Parameters
    ----------
    labels
        1-D integer labels in ``[0, num_classes)``.
    p
        Flip probability in [0, 1] (seed 004 App. C.2 uses p = 0.7).
    num_classes
        K >= 2.
    seed
        Seed of the flips (see :func:`clients.seeding.as_generator`).

    Returns
    -------
    np.ndarray
        A new array of the same dtype; a flipped label never equals its original, and
        given a flip, each of the K-1 other classes is equally likely.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"labels: expected a 1-D integer array; got dtype {labels.dtype} with shape {labels.shape}."
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
        raise ValueError(f"num_classes: expected an int >= 2 (a flip needs another class); got {num_classes!r}.")
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not (0.0 <= p <= 1.0) or math.isnan(p):
        raise ValueError(f"p: expected a probability in [0, 1]; got {p!r}.")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"labels: expected values in [0, {num_classes}); got values in "
            f"[{labels.min()}, {labels.max()}]."
        )
    rng = as_generator(seed)
    flipped = rng.random(labels.size) < p
    # An offset uniform in {1, ..., K-1} taken mod K lands uniformly on the other classes.
    offsets = rng.integers(1, num_classes, size=labels.size)
    noisy = labels.copy()
    noisy[flipped] = (labels[flipped] + offsets[flipped]) % num_classes
    return noisy


class ClientBehaviour:
    """A client's script; the defaults are honest (identity) transforms."""

    def transform_training_data(
        self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The (x, y) the client trains on this round (default: its own data)."""
        return x, y

    def transform_reply(
        self,
        global_arrays: dict[str, np.ndarray],
        trained_arrays: dict[str, np.ndarray],
        num_examples: int,
        rng: np.random.Generator,
    ) -> tuple[dict[str, np.ndarray], int]:
        """The arrays and example count the client sends back (default: what it trained)."""
        return trained_arrays, num_examples

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class HonestClient(ClientBehaviour):
    """Trains on its own data and replies what it trained."""


class LabelNoise(ClientBehaviour):
    """A noisy contributor: each training label flipped with probability ``p``.

    Parameters
    ----------
    p
        Flip probability (seed 004 App. C.2: 0.7).
    num_classes
        Number of classes K; flips go to one of the other K-1 uniformly.
    seed
        ``None``: flips are drawn from the round's generator the ClientApp passes in
        (fresh noise every round). Otherwise the client's noisy labels are fixed once
        by this seed and are the same in every round, as a contributor whose dataset
        is noisy (the paper's reading); e.g. ``seed=[run_seed, partition_id]``.
        A numpy Generator is read once, here.
    """

    def __init__(self, p: float, num_classes: int, *, seed: Seed = None) -> None:
        # Validate now, not in the Ray worker, so a bad config fails where it was written.
        flip_labels(np.zeros(0, dtype=np.int64), p, num_classes, seed=0)
        self.p = float(p)
        self.num_classes = int(num_classes)
        self._entropy = None if seed is None else int(as_generator(seed).integers(2**63))

    def transform_training_data(
        self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        source = rng if self._entropy is None else self._entropy
        return x, flip_labels(y, self.p, self.num_classes, seed=source)


class FreeRider(ClientBehaviour):
    """Sends the global model back unchanged while claiming its example count.

    Its update is zero, so under FedAvg it only dilutes the others' updates.
    """

    def transform_reply(
        self,
        global_arrays: dict[str, np.ndarray],
        trained_arrays: dict[str, np.ndarray],
        num_examples: int,
        rng: np.random.Generator,
    ) -> tuple[dict[str, np.ndarray], int]:
        return {key: np.array(value, copy=True) for key, value in global_arrays.items()}, num_examples
