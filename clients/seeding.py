"""Seeds -> generators, shared by clients/ and simulations/ (simulations imports clients,
never the reverse, so the one implementation lives here)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch

T = TypeVar("T")

#: What every ``seed`` keyword of this project accepts.
Seed = int | Sequence[int] | np.random.SeedSequence | np.random.Generator | None


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def as_generator(seed: Seed, *, name: str = "seed") -> np.random.Generator:
    """One numpy Generator from ``seed``.

    Parameters
    ----------
    seed
        A non-negative int, a sequence of non-negative ints (entropy for a
        ``SeedSequence``, e.g. ``[run_seed, partition_id]``), a ``SeedSequence``, a
        ``Generator`` (returned as is, so the caller's stream advances) or ``None``
        (fresh OS entropy: not reproducible).
    name
        The parameter's name, for the error message.

    Raises
    ------
    ValueError
        For anything else (negative ints, bools, floats, strings ...).
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or isinstance(seed, np.random.SeedSequence):
        return np.random.default_rng(seed)
    entropy = _int_entropy(seed)
    if entropy is not None:
        return np.random.default_rng(entropy)
    raise ValueError(
        f"{name}: expected a non-negative int, a sequence of non-negative ints, a "
        f"numpy SeedSequence or Generator, or None; got {seed!r}."
    )


def fixed_entropy(seed: Seed) -> int | None:
    """One draw from ``seed`` (None for None), read once: a behaviour keeps it so that its noise is the
    same in every round, as a noisy dataset's is (a numpy Generator is advanced by one draw)."""
    return None if seed is None else int(as_generator(seed).integers(2**63))


def torch_generator(seed: Seed, *, name: str = "seed") -> torch.Generator:
    """A CPU ``torch.Generator`` seeded from ``seed`` (never the global torch RNG).

    An int or sequence seed always gives the same generator; a numpy Generator
    gives one seeded by its next draw.
    """
    seed_int = int(as_generator(seed, name=name).integers(2**63))
    return torch.Generator().manual_seed(seed_int)


def seeded_call(function: Callable[[], T], seed: Seed, *, name: str = "seed") -> T:
    """``function()`` with the global generators it may draw from (numpy's legacy one,
    Python's ``random``, torch's CPU generator and the initialized CUDA ones) seeded from
    ``seed``; the caller's states are put back after, whatever ``function`` did.

    A user's model factory usually initializes its layers from torch's global generator
    (``torch.nn.Linear`` does): called here, the same seed builds the same model and the
    caller's own draws are not disturbed.
    """
    numpy_seed, python_seed, torch_seed = np.random.SeedSequence(
        _entropy(seed, name)).generate_state(3, dtype=np.uint64)
    numpy_state, python_state = np.random.get_state(), random.getstate()
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        np.random.seed(int(numpy_seed) % 2**32)
        random.seed(int(python_seed))
        torch.default_generator.manual_seed(int(torch_seed) % 2**63)  # CPU only: no lazy CUDA seeding queued
        for device in cuda:
            torch.cuda.default_generators[device].manual_seed(int(torch_seed) % 2**63)
        try:
            return function()
        finally:
            np.random.set_state(numpy_state)
            random.setstate(python_state)


def _int_entropy(seed: Seed) -> int | list[int] | None:
    """Entropy for a ``SeedSequence`` from a non-negative int or a non-empty sequence of them
    (the forms a run's seed and its children take); None for anything else."""
    if _is_int(seed) and seed >= 0:
        return int(seed)
    if (isinstance(seed, Sequence) and not isinstance(seed, (str, bytes)) and len(seed) > 0
            and all(_is_int(part) and part >= 0 for part in seed)):
        return [int(part) for part in seed]
    return None


def _entropy(seed: Seed, name: str) -> int | list[int]:
    """:func:`_int_entropy`, or ValueError naming ``name``."""
    entropy = _int_entropy(seed)
    if entropy is None:
        raise ValueError(f"{name}: expected a non-negative int or a sequence of non-negative ints; got {seed!r}.")
    return entropy
