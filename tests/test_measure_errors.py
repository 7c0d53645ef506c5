"""What a call raised, as a value: the error itself, or None; and one line saying so."""

import jax
import jax.numpy as jnp
import pytest

from jaxloops import tracing
from jaxloops.measure import errors


def test_raised_by_returns_the_error_a_call_raises_and_none_where_it_returns():
    error = errors.raised_by(jax.jit(tracing.clip_python_if), jnp.array([3.0, 4.0]), 1.0)
    assert isinstance(error, jax.errors.TracerBoolConversionError)
    assert errors.raised_by(tracing.clip_python_if, jnp.array([3.0, 4.0]), max_norm=1.0) is None
    assert isinstance(errors.raised_by(int, "seven"), ValueError)
    with pytest.raises(ValueError, match="fn must be callable, got 3"):
        errors.raised_by(3)


def test_outcome_names_the_error_by_its_first_line_or_the_value_returned():
    assert errors.outcome(float, jnp.float32(2.5)) == "no error: returned 2.5"
    assert errors.outcome(int, "seven") == (
        "ValueError: invalid literal for int() with base 10: 'seven'"
    )

    def two_lines():
        raise RuntimeError("first line\nsecond line")

    assert errors.outcome(two_lines) == "RuntimeError: first line"
    assert errors.outcome(dict) == "no error: returned {}"
    with pytest.raises(ValueError, match="fn must be callable, got 'x'"):
        errors.outcome("x")
