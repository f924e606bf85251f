"""Flower's ArrayRecord <-> numpy on the server side: the one place that converts a model's arrays."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord


def arrays_to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord as ``{key: ndarray}`` in the record's key order."""
    return {key: array.numpy() for key, array in record.items()}


def numpy_to_arrays(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({key: Array(np.asarray(value)) for key, value in arrays.items()})


def initial_arrays(model) -> ArrayRecord:
    """A torch model's state as the run's A_0 (brought to the CPU first)."""
    return numpy_to_arrays({key: value.detach().cpu().numpy() for key, value in model.state_dict().items()})
