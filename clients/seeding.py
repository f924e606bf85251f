"""Seeds -> generators, shared by clients/ and simulations/ (simulations imports clients,
never the reverse, so the one implementation lives here)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

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
    if _is_int(seed) and seed >= 0:
        return np.random.default_rng(int(seed))
    if (
        isinstance(seed, Sequence)
        and not isinstance(seed, (str, bytes))
        and len(seed) > 0
        and all(_is_int(part) and part >= 0 for part in seed)
    ):
        return np.random.default_rng([int(part) for part in seed])
    raise ValueError(
        f"{name}: expected a non-negative int, a sequence of non-negative ints, a "
        f"numpy SeedSequence or Generator, or None; got {seed!r}."
    )


def torch_generator(seed: Seed, *, name: str = "seed") -> torch.Generator:
    """A CPU ``torch.Generator`` seeded from ``seed`` (never the global torch RNG).

    An int or sequence seed always gives the same generator; a numpy Generator
    gives one seeded by its next draw.
    """
    seed_int = int(as_generator(seed, name=name).integers(2**63))
    return torch.Generator().manual_seed(seed_int)
