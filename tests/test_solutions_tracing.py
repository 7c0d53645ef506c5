"""Chapter 1's loop-count exercise: a traced count compiles once; a Python loop cannot take
one, and a static count compiles once per value (the known-wrong answer to "once")."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxloops.measure import count_compiles
from jaxloops.solutions import repeat_tanh


def python_loop_tanh(x, n):
    for _ in range(n):  # needs a concrete n: unrolled at trace time
        x = jnp.tanh(x)
    return x


def numpy_tanh(x, n):
    x = np.asarray(x, np.float64)
    for _ in range(n):
        x = np.tanh(x)
    return x


def test_a_traced_count_compiles_once_and_agrees_with_numpy():
    x = jnp.linspace(-3.0, 3.0, 11)
    jitted = jax.jit(repeat_tanh)
    counts = (1, 2, 3, 5, 0)
    with count_compiles() as log:
        outs = {n: jitted(x, n) for n in counts}
    assert log.names.count("jit(repeat_tanh)") == 1
    for n, out in outs.items():
        assert np.allclose(out, numpy_tanh(x, n), rtol=1e-6, atol=1e-7), n
    assert not np.allclose(outs[3], numpy_tanh(x, 2), rtol=1e-6, atol=1e-7)  # off by one
    primitives = [e.primitive.name for e in jax.make_jaxpr(repeat_tanh)(x, 4).eqns]
    assert "while" in primitives and "tanh" not in primitives  # tanh sits in the loop's body
    with pytest.raises(ValueError, match="n -1 "):
        repeat_tanh(x, -1)


def test_a_python_loop_needs_a_static_count_and_compiles_per_value():
    x = jnp.linspace(-2.0, 2.0, 13)
    with pytest.raises(jax.errors.TracerIntegerConversionError):
        jax.jit(python_loop_tanh)(x, 3)
    static = jax.jit(python_loop_tanh, static_argnames="n")
    with count_compiles() as log:
        for n in (1, 2, 3, 2, 1):
            static(x, n=n)
    assert log.names.count("jit(python_loop_tanh)") == 3
    unrolled = [
        e.primitive.name for e in jax.make_jaxpr(python_loop_tanh, static_argnums=1)(x, 4).eqns
    ]
    assert unrolled == ["tanh"] * 4
