"""What a client's reply must hold before anything reads it: each field's check, on numpy values.

A reply is untrusted input. Every field is checked here before the books, the claim review,
the inner strategy or the TracIn flows read it, and a field that fails gives a one-line
reason naming it (``"num-examples: ..."``, ``"arrays['fc.weight']: ..."``):

* **ids** (``partition-id``): a Python ``int`` ≥ 0; a bool, float, string, bytes or list is
  not an id, even when it reads as one (``True``, ``0.7``, ``"٣"``, ``b"2"``).
* **weights** (the strategy's ``weighted_by_key``, FedAvg's ``num-examples``): a finite
  number in (0, 2^53]; an example count is moreover a whole number. Above 2^53 float64
  no longer holds every whole number, and the weights' sum must stay exact and finite.
* **arrays** (the update, inference gradients, curvature): the global model's keys and
  shapes, a real floating-point dtype (or the global model's own dtype for that key, such
  as an int64 batch counter), finite values and a magnitude the arithmetic can carry.
* **metrics**: finite numbers or lists of them (Flower averages every metric).

Magnitudes. Every aggregate of the round (FedAvg's mean, a coalition's state, a robust
rule's norms and distances) is computed in the arrays' own dtype. A reply is refused
when the sum of its squares overflows that dtype (float32 at least): then its norm, the
distances to it and the products of its values with a layer's inputs are not numbers, and
one such reply spoils every coalition that includes it. Below that bound, every convex
combination of replies (each coalition's weighted mean) stays finite and so does a norm.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

#: Largest weight a reply may claim: float64 holds every whole number up to it.
MAX_WEIGHT = 2**53
#: Characters of a hostile value shown in a reason.
SHOWN_CHARS = 40


def shown(value: object) -> str:
    """``repr(value)`` cut to :data:`SHOWN_CHARS` (a reason is one short line)."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def id_problem(value: object) -> str | None:
    """Why ``value`` is not a client id (a Python int ≥ 0), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"expected an integer; got {shown(value)} ({type(value).__name__})"
    if value < 0:
        return f"expected an integer >= 0; got {value}"
    return None


def weight_problem(value: object, *, whole: bool) -> str | None:
    """Why ``value`` is not an aggregation weight: a finite number in (0, 2^53], a whole
    number when ``whole`` (an example count); None when it is one."""
    what = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected {what} in [1, 2**53]; got {shown(value)} ({type(value).__name__})"
    if not math.isfinite(value) or not 0 < value <= MAX_WEIGHT or (whole and value != math.floor(value)):
        return f"expected {what} {'in [1, 2**53]' if whole else 'in (0, 2**53]'}; got {shown(value)}"
    return None


def loss_problem(value: object) -> str | None:
    """Why ``value`` is not a loss: a finite number whose square float64 holds (so that
    differences of losses stay finite); None when it is one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a finite number; got {shown(value)} ({type(value).__name__})"
    try:
        finite = math.isfinite(float(value) ** 2)
    except OverflowError:
        finite = False
    return None if finite else f"expected a finite number of moderate size; got {shown(value)}"


def metric_problem(value: object) -> str | None:
    """Why a metric value is not a finite number or a list of finite numbers, or None."""
    values = value if isinstance(value, list) else [value]
    for item in values:
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item):
            return f"expected a finite number or a list of them; got {shown(value)}"
    return None


def metric_form(value: object) -> str:
    """What Flower's metric averaging needs equal across replies: a number, or a list of a length."""
    return f"a list of {len(value)}" if isinstance(value, list) else "a number"


def arithmetic_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype an array's sums are computed in: its own, float32 at least."""
    return np.result_type(dtype, np.float32)


def too_large(array: np.ndarray) -> bool:
    """Whether the sum of squares of a finite floating-point ``array`` overflows its
    arithmetic dtype (:func:`arithmetic_dtype`; module docstring, "Magnitudes")."""
    flat = np.ravel(array).astype(arithmetic_dtype(array.dtype), copy=False)
    if flat.size == 0:
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        return not np.isfinite(np.dot(flat, flat))


def array_problems(arrays: Mapping[str, np.ndarray], model: Mapping[str, np.ndarray] | None,
                   field: str) -> tuple[str | None, str | None]:
    """Why ``arrays`` cannot be aggregated with the global ``model``'s, as (fatal, numeric):

    ``fatal``: keys, shapes or dtypes that no aggregation can take (the reply is failed);
    ``numeric``: NaN/inf or values too large to aggregate (the reply is rejected and booked
    with the harm it would have done). ``field`` names the record in the reasons. Without
    ``model`` only dtypes and values are checked.
    """
    if model is not None:
        if set(arrays) != set(model):
            missing, extra = [k for k in model if k not in arrays], [k for k in arrays if k not in model]
            return (f"{field}: keys differ from the global model's (missing {shown(missing)}, "
                    f"unexpected {shown(extra)})"), None
        for key, value in model.items():
            if np.shape(arrays[key]) != np.shape(value):
                return (f"{field}[{key!r}]: shape {np.shape(arrays[key])} differs from the global model's "
                        f"{np.shape(value)}"), None
    for key, value in arrays.items():
        allowed = None if model is None else np.asarray(model[key]).dtype
        if value.dtype.kind != "f" and value.dtype != allowed and not (allowed is None and value.dtype.kind in "iu"):
            also = "" if allowed is None or allowed.kind == "f" else f" (or the global model's {allowed})"
            return f"{field}[{key!r}]: expected real floating point{also}; got {value.dtype}", None
    floats = {k: v for k, v in arrays.items() if v.dtype.kind == "f"}
    bad = [k for k, v in floats.items() if not np.isfinite(v).all()]
    if bad:
        return None, f"non-finite values (NaN or inf) in {bad}"
    large = [k for k, v in floats.items() if too_large(v)]
    if large:
        biggest = max(float(np.max(np.abs(floats[k]))) for k in large)
        return None, (f"{field}{large!r}: too large to aggregate (the sum of squares overflows "
                      f"{arithmetic_dtype(floats[large[0]].dtype)}; largest |value| {biggest:.3g})")
    return None, None
