"""The input checks every package shares: one wording a kind of check.

An error names the parameter, what was expected and what was got, in one form:
``"{name}: expected {what}; got {value!r}."``. ``why`` adds the reason in brackets after
``what`` where a bound is not self-evident (``min_claims: expected an integer ≥ 3 (a
median that one claim cannot move)``). Bools are refused wherever a number is expected.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import numpy as np


def _expected(what: str, none_ok: bool, why: str) -> str:
    return what + (" or None" if none_ok else "") + (f" ({why})" if why else "")


def integer_wording(minimum: int) -> str:
    """How an integer bound reads in a message: "a positive integer", "a non-negative
    integer" or "an integer ≥ m"."""
    return {1: "a positive integer", 0: "a non-negative integer"}.get(minimum, f"an integer ≥ {minimum}")


def check_integer(name: str, value: object, minimum: int = 1, *, none_ok: bool = False, unit: str = "",
                  why: str = "") -> int | None:
    """``value`` as an int ≥ ``minimum`` (numpy integers accepted, bools refused; None
    passes through with ``none_ok``), else a ValueError naming ``name``. ``unit`` reads
    after the bound: "a positive integer number of neighbours"."""
    if none_ok and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        what = integer_wording(minimum) + (f" {unit}" if unit else "")
        raise ValueError(f"{name}: expected {_expected(what, none_ok, why)}; got {value!r}.")
    return int(value)


def number_wording(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """How a real interval reads in a message: "a finite number", "a finite number > 0",
    "a finite number ≥ 0", "a number in [0, 1]", "a number in the open interval (0, 1)"."""
    if low is None and high is None:
        return "a finite number"
    if high is None:
        return f"a finite number {'>' if low_open else '≥'} {low:g}"
    if low is None:
        return f"a finite number {'<' if high_open else '≤'} {high:g}"
    if low_open and high_open:
        return f"a number in the open interval ({low:g}, {high:g})"
    return f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def check_number(name: str, value: object, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, none_ok: bool = False,
                 why: str = "") -> float | None:
    """``value`` as a finite float in the interval from ``low`` to ``high`` (either side
    unbounded when None, open when ``*_open``), else a ValueError naming ``name``."""
    if none_ok and value is None:
        return None
    ok = (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
          and (low is None or (value > low if low_open else value >= low))
          and (high is None or (value < high if high_open else value <= high)))
    if not ok:
        what = number_wording(low, high, low_open, high_open)
        raise ValueError(f"{name}: expected {_expected(what, none_ok, why)}; got {value!r}.")
    return float(value)


def check_positive(name: str, value: object) -> float:
    """``value`` as a finite float > 0, else ValueError naming ``name``."""
    return check_number(name, value, low=0.0, low_open=True)


def check_non_negative(name: str, value: object) -> float:
    """``value`` as a finite float ≥ 0, else ValueError naming ``name``."""
    return check_number(name, value, low=0.0)


def check_open_unit(name: str, value: object) -> float:
    """``value`` as a float in (0, 1), else ValueError naming ``name``."""
    return check_number(name, value, low=0.0, high=1.0, low_open=True, high_open=True)


def check_unit_interval(name: str, value: object) -> float:
    """``value`` as a float in [0, 1], else ValueError naming ``name``."""
    return check_number(name, value, low=0.0, high=1.0)


def check_choice(name: str, value: object, choices: Iterable) -> object:
    """``value`` when it is one of ``choices``, else a ValueError listing them."""
    choices = list(choices)
    try:
        known = value in choices
    except (TypeError, ValueError):  # an array or another value without a plain ==
        known = False
    if not known:
        raise ValueError(f"{name}: expected one of {choices}; got {value!r}.")
    return value


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


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun`` as a message says them: "1 round", "2 rounds", "0 rounds"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
