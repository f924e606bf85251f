"""Input checks shared by fedvalue's public functions (errors name the parameter)."""

from __future__ import annotations

import math
import numbers

import numpy as np


def check_positive(name: str, value: object) -> float:
    """``value`` as a float > 0, else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a finite number > 0; got {value!r}.")
    return float(value)


def check_open_unit(name: str, value: object) -> float:
    """``value`` as a float in (0, 1), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 < value < 1.0:
        raise ValueError(f"{name}: expected a number in the open interval (0, 1); got {value!r}.")
    return float(value)


def check_seed(seed: object) -> np.random.Generator:
    """One Generator from ``seed`` (int, Generator, SeedSequence or None)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or isinstance(seed, np.random.SeedSequence) or (
        isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0
    ):
        return np.random.default_rng(seed)
    raise ValueError(
        f"seed: expected a non-negative int, a numpy Generator, a SeedSequence or None; got {seed!r}."
    )


def check_finite_array(name: str, values: object, ndim: int, shape_hint: str) -> np.ndarray:
    """``values`` as a float64 array of ``ndim`` dimensions with finite entries, or a
    ValueError naming ``name``, the expected shape (``shape_hint``) and the first bad entry."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name}: expected a {shape_hint} of real numbers; got {type(values).__name__} "
                         f"({error}).") from None
    if array.ndim != ndim:
        raise ValueError(f"{name}: expected a {shape_hint} of real numbers; got shape {array.shape}.")
    if not np.all(np.isfinite(array)):
        where = tuple(int(a[0]) for a in np.nonzero(~np.isfinite(array)))
        raise ValueError(f"{name}: expected finite numbers; got {array[where]!r} at index {list(where)}.")
    return array
