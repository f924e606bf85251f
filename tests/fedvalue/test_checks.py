"""The shared input checks: what each accepts (hypothesis against the plain condition)
and the one wording of each refusal."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedvalue._checks import (
    check_choice,
    check_integer,
    check_non_negative,
    check_number,
    check_open_unit,
    check_positive,
    check_unit_interval,
)

anything = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True),
                     st.text(max_size=3), st.lists(st.integers(), max_size=2))


@given(anything, st.integers(-2, 3), st.booleans())
def test_check_integer_accepts_exactly_the_ints_at_or_above_the_minimum(value, minimum, none_ok):
    ok = (none_ok and value is None) or (type(value) is int and value >= minimum)
    if ok:
        assert check_integer("n", value, minimum, none_ok=none_ok) == value
    else:
        with pytest.raises(ValueError, match=r"^n: expected .*; got .*\.$"):
            check_integer("n", value, minimum, none_ok=none_ok)


@given(anything, st.sampled_from([None, -1.0, 0.0]), st.sampled_from([None, 1.0, 2.5]), st.booleans(), st.booleans())
def test_check_number_accepts_exactly_the_finite_reals_in_the_interval(value, low, high, low_open, high_open):
    real = type(value) in (int, float) and math.isfinite(value)
    ok = real and (low is None or (value > low if low_open else value >= low)) and (
        high is None or (value < high if high_open else value <= high))
    if ok:
        assert check_number("x", value, low=low, high=high, low_open=low_open, high_open=high_open) == float(value)
    else:
        with pytest.raises(ValueError, match=r"^x: expected a .*; got .*\.$"):
            check_number("x", value, low=low, high=high, low_open=low_open, high_open=high_open)


@pytest.mark.parametrize("call, message", [
    (lambda: check_integer("k", 0), "k: expected a positive integer; got 0."),
    (lambda: check_integer("seed", -1, 0), "seed: expected a non-negative integer; got -1."),
    (lambda: check_integer("min_claims", 2, 3, why="a median that one claim cannot move"),
     "min_claims: expected an integer ≥ 3 (a median that one claim cannot move); got 2."),
    (lambda: check_integer("k", True, unit="number of neighbours"),
     "k: expected a positive integer number of neighbours; got True."),
    (lambda: check_integer("chunk_size", 2.0, none_ok=True), "chunk_size: expected a positive integer or None; got 2.0."),
    (lambda: check_positive("lr", math.inf), "lr: expected a finite number > 0; got inf."),
    (lambda: check_non_negative("mu", -0.5), "mu: expected a finite number ≥ 0; got -0.5."),
    (lambda: check_open_unit("delta", 1), "delta: expected a number in the open interval (0, 1); got 1."),
    (lambda: check_unit_interval("p", math.nan), "p: expected a number in [0, 1]; got nan."),
    (lambda: check_number("tie", 1.0, low=0.0, high=1.0, high_open=True), "tie: expected a number in [0, 1); got 1.0."),
    (lambda: check_number("scale", "2"), "scale: expected a finite number; got '2'."),
    (lambda: check_choice("kind", "z", ("a", "b")), "kind: expected one of ['a', 'b']; got 'z'."),
    (lambda: check_choice("kind", np.zeros(2), ("a",)), "kind: expected one of ['a']; got array([0., 0.])."),
])
def test_each_refusal_reads_name_expected_got(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert str(error.value) == message


def test_numpy_scalars_are_numbers_and_come_back_as_python_ones():
    assert type(check_integer("n", np.int32(4))) is int and check_integer("n", np.int32(4)) == 4
    assert type(check_positive("x", np.float32(0.5))) is float
    assert check_choice("kind", "a", ("a", "b")) == "a"
