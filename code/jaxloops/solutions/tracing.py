"""Answer to chapter 1's exercise on a loop count; tests/test_solutions_tracing.py checks it."""

import jax
import jax.numpy as jnp


def repeat_tanh(x: jax.Array, n) -> jax.Array:
    """`jnp.tanh` applied `n` times. `n` may be traced: under jit the loop is one `while` in
    the compiled program, so one compilation serves every `n` (a Python `for` over
    `range(n)` needs `n` static, and unrolls it: a compilation per value)."""
    if isinstance(n, int) and n < 0:
        raise ValueError(f"n {n} must be at least 0")
    return jax.lax.fori_loop(0, n, lambda i, x: jnp.tanh(x), x)
