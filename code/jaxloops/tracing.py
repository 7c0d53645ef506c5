"""Chapter 1's tracing lesson: a Python branch on a value, its three traced forms, a static
size, and a shape that depends on values.

`jax.jit` runs a function once per signature with tracers (shape and dtype, no values), so a
Python `if` on an argument's value cannot run inside it; `jnp.where`, `jax.lax.select` and
`jax.lax.cond` put the choice into the compiled program. The clipping functions scale a
gradient `g` (any shape) down to norm `max_norm` (> 0) when its norm is larger, as
`optax.clip_by_global_norm` does for a whole tree (with `lax.select`). `max_norm` is traced
under jit, so it is not checked here: a Python check of its value would fail to trace for the
same reason as `clip_python_if`.
"""

import jax
import jax.numpy as jnp


def clip_python_if(g: jax.Array, max_norm: float) -> jax.Array:
    """`g` scaled to norm `max_norm` if its norm is larger; a Python `if`: eager only."""
    norm = jnp.sqrt(jnp.sum(g**2))
    if norm > max_norm:  # needs a concrete bool: under jit `norm` is a tracer
        return g * (max_norm / norm)
    return g


def clip_where(g: jax.Array, max_norm: float) -> jax.Array:
    """As `clip_python_if`, traceable: computes both values, `jnp.where` picks one."""
    norm = jnp.sqrt(jnp.sum(g**2))
    return jnp.where(norm > max_norm, g * (max_norm / norm), g)


def clip_select(g: jax.Array, max_norm: float) -> jax.Array:
    """As `clip_where` with `lax.select`: the two values must have one shape and dtype."""
    norm = jnp.sqrt(jnp.sum(g**2))
    return jax.lax.select(norm > max_norm, g * (max_norm / norm), g)


def clip_cond(g: jax.Array, max_norm: float) -> jax.Array:
    """As `clip_where` with `lax.cond`: a scalar predicate picks one branch to run."""
    norm = jnp.sqrt(jnp.sum(g**2))
    return jax.lax.cond(norm > max_norm, lambda g: g * (max_norm / norm), lambda g: g, g)


def batch_means(x: jax.Array, batch_size: int) -> jax.Array:
    """Mean of each run of `batch_size` entries: (B,) -> (B // batch_size,).

    `batch_size` sets the output's shape, so under jit it must be static (a traced one
    reaches `reshape`, which refuses it)."""
    if isinstance(batch_size, int) and (batch_size < 1 or x.shape[0] % batch_size):
        raise ValueError(f"batch_size {batch_size!r} must be a positive divisor of {x.shape[0]}")
    return x.reshape(-1, batch_size).mean(axis=1)  # (B // batch_size, batch_size) -> (.,)


def positive_indices(x: jax.Array, size: int | None = None) -> jax.Array:
    """Indices of the positive entries of `x` (1-D); with `size`, exactly `size` of them,
    padded with -1 (or cut). Without `size` the output's shape depends on the values."""
    if isinstance(size, int) and size < 0:
        raise ValueError(f"size {size} must be None or at least 0")
    return jnp.nonzero(x > 0, size=size, fill_value=-1)[0]
