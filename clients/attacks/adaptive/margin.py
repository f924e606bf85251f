"""The margin of an adaptive attack, and the update it shapes put back into arrays.

An adaptive attack places its statistic at (1 + ``margin``) × its defence's threshold, in that
defence's own units: 0 is on the threshold (where the test's ≤ and float32 rounding decide), a
margin > 0 is outside it (the defence does not fire), a margin in (−1, 0) inside it (a control that
the defence catches). The study (``fedvalue run attacks``) takes margins ≥ 0 only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedvalue._checks import check_number


def check_margin(margin: object) -> float:
    """``margin`` as a float > −1, else ValueError naming it."""
    return check_number("margin", margin, low=-1.0, low_open=True,
                        why="the attack sits at (1 + margin) × its defence's threshold: 0 on it, > 0 outside it, "
                            "< 0 inside it")


def float_keys(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """The floating-point entries of ``arrays`` (integer buffers are never moved)."""
    return [key for key, value in arrays.items() if np.asarray(value).dtype.kind == "f"]


def moved_by(start: Mapping[str, np.ndarray], vector: np.ndarray, keys: list[str],
             rest: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``start + vector`` over ``keys``, cast back to each entry's dtype; the other entries from ``rest``."""
    reply, offset = {}, 0
    for key, value in start.items():
        value = np.asarray(value)
        if key not in keys:
            reply[key] = np.array(rest[key], copy=True)
            continue
        part = vector[offset:offset + value.size].reshape(value.shape)
        reply[key] = (value.astype(np.float64) + part).astype(value.dtype)
        offset += value.size
    return reply
