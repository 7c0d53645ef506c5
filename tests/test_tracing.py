"""Chapter 1's tracing lesson, as properties: a Python `if` on a traced value fails to trace;
`jnp.where`, `lax.select` and `lax.cond` agree with NumPy and compile once whatever the values;
a static size compiles once per distinct value; a value-dependent shape needs `size=`.

Each test uses shapes of its own: `jax.jit` of one function shares its compiled programs
between wrappers, so a shape another test compiled would count no compilation here.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxloops import tracing
from jaxloops.measure import count_compiles

TRACED_CLIPS = (tracing.clip_where, tracing.clip_select, tracing.clip_cond)


def clip_reference(g: np.ndarray, max_norm: float) -> np.ndarray:
    norm = np.sqrt(np.sum(np.asarray(g, np.float64) ** 2))
    return g * (max_norm / norm) if norm > max_norm else g


def clip_squared_norm(g, max_norm):
    """A known-wrong clip: the squared norm where the norm belongs."""
    norm2 = jnp.sum(g**2)
    return jnp.where(norm2 > max_norm, g * (max_norm / norm2), g)


def agrees(got, want) -> bool:
    return np.allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)


def test_a_python_if_on_a_traced_value_raises_the_tracer_error():
    g = jax.random.normal(jax.random.key(0), (3, 7))
    max_norm = 0.5 * float(jnp.linalg.norm(g))
    # Eagerly the norm is a concrete value, and the Python `if` works.
    assert agrees(tracing.clip_python_if(g, max_norm), clip_reference(np.asarray(g), max_norm))
    with pytest.raises(jax.errors.TracerBoolConversionError):
        jax.jit(tracing.clip_python_if)(g, max_norm)
    # The same computation written with jnp.where traces (the error is the `if`'s, not jit's).
    assert agrees(jax.jit(tracing.clip_where)(g, max_norm), clip_reference(np.asarray(g), max_norm))


def test_the_traced_clips_agree_with_numpy_and_compile_once_for_any_values():
    key_big, key_small = jax.random.split(jax.random.key(1))
    big = 3.0 * jax.random.normal(key_big, (5, 3))
    small = 0.01 * jax.random.normal(key_small, (5, 3))
    max_norms = (0.7, 2.9)
    for clip in TRACED_CLIPS:
        jitted = jax.jit(clip)
        with count_compiles() as log:
            outs = [(g, m, jitted(g, m)) for g in (big, small) for m in max_norms]
        assert log.names.count(f"jit({clip.__name__})") == 1, (clip.__name__, log.names)
        for g, m, out in outs:
            assert agrees(out, clip_reference(np.asarray(g), m)), (clip.__name__, m)
    # Both branches were taken: `big` was scaled to each max_norm, `small` left alone.
    for m in max_norms:
        assert np.isclose(float(jnp.linalg.norm(tracing.clip_where(big, m))), m, rtol=1e-5)
        assert agrees(tracing.clip_where(small, m), np.asarray(small))
    # The checks reject a wrong clip, and a jit that recompiles per value.
    assert not agrees(clip_squared_norm(big, 2.9), clip_reference(np.asarray(big), 2.9))
    per_value = jax.jit(tracing.clip_where, static_argnames="max_norm")
    with count_compiles() as log:
        for m in max_norms:
            per_value(big, max_norm=m)
    assert log.names.count("jit(clip_where)") == 2


def test_a_static_size_compiles_once_per_distinct_value():
    x = jnp.arange(21.0)
    with pytest.raises(TypeError, match="concrete values of integer type"):
        jax.jit(tracing.batch_means)(x, 3)  # traced: reshape cannot use it as a shape
    means = jax.jit(tracing.batch_means, static_argnames="batch_size")
    sizes = (3, 7, 3, 7, 21, 3)
    with count_compiles() as log:
        outs = {b: means(x, batch_size=b) for b in sizes}
    assert log.names.count("jit(batch_means)") == len(set(sizes)) == 3
    for b, out in outs.items():
        assert out.shape == (21 // b,)
        assert agrees(out, np.arange(21.0).reshape(-1, b).mean(axis=1))
    # A transposed reshape, the known-wrong answer, is rejected.
    assert not agrees(outs[3], np.arange(21.0).reshape(3, -1).mean(axis=0)[:7])
    for bad in (0, 4, -3):
        with pytest.raises(ValueError, match=f"batch_size {bad} "):
            tracing.batch_means(x, bad)


def test_a_value_dependent_shape_needs_a_static_size():
    v = jnp.array([0.5, -1.0, 2.0, -3.0, 4.0, 0.0, 7.0])
    want = np.nonzero(np.asarray(v) > 0)[0]
    assert np.array_equal(tracing.positive_indices(v), want)  # eager: as long as it needs
    with pytest.raises(jax.errors.ConcretizationTypeError):
        jax.jit(tracing.positive_indices)(v)
    padded = jax.jit(tracing.positive_indices, static_argnames="size")
    assert np.array_equal(padded(v, size=6), [*want, -1, -1])
    assert np.array_equal(padded(v, size=2), want[:2])
    assert not np.array_equal(padded(v, size=6), [*want, 0, 0])  # not padded with index 0
    with pytest.raises(ValueError, match="size -1 "):
        tracing.positive_indices(v, size=-1)


def test_where_differentiates_both_sides_and_cond_only_the_one_taken():
    def log_where(x):
        return jnp.where(x > 0, jnp.log(x), 0.0)

    def log_cond(x):
        return jax.lax.cond(x > 0, jnp.log, jnp.zeros_like, x)

    for fn in (log_where, log_cond):
        assert float(fn(0.0)) == 0.0 and np.isclose(float(fn(2.0)), np.log(2.0))
    # At 0 the unchosen log's slope is infinite: 0 * inf is nan in where's gradient.
    assert np.isnan(float(jax.grad(log_where)(0.0)))
    assert float(jax.grad(log_cond)(0.0)) == 0.0
    assert np.isclose(float(jax.grad(log_where)(2.0)), 0.5)  # where the log is taken, its slope
