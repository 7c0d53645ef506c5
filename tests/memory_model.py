"""The model, batch and reference gradient shared by tests/test_memory*.py (built once)."""

import functools

import jax

import jaxloops
from conftest import SMALL_TRANSFORMER

B, T = 6, 7  # M = 1, 2, 3, 6 divide B; T < max_len 11


@functools.cache
def model():
    """(params, batch, loss, grads) of SMALL_TRANSFORMER on one random (B, T) batch."""
    init = jax.jit(jaxloops.init_transformer, static_argnums=1)  # one program, not one per op
    params = init(jax.random.key(0), SMALL_TRANSFORMER)
    tokens = jax.random.randint(jax.random.key(1), (B, T + 1), 0, SMALL_TRANSFORMER.vocab_size)
    batch = jaxloops.Batch(tokens[:, :-1], tokens[:, 1:])
    loss, grads = jax.jit(jax.value_and_grad(lambda p, b: jaxloops.transformer_loss(p, b)[0]))(
        params, batch
    )
    return params, batch, loss, grads
