"""Dropout, for the MLP (after each hidden ReLU) and the transformer (the rate lives in
`TransformerConfig`, the key in the step).

At a rate p > 0 each hidden activation of the MLP, and each residual branch's output of the
transformer (attention's and the MLP's, before they are added back to the stream), keeps
each element with probability 1 - p, scaled by 1 / (1 - p), so its expectation is unchanged.
The train step derives step n's key as `fold_in(key, n)` from the optimizer's own step
counter (`train.make_keyed_train_step`), so a resumed run draws the same masks; evaluation
passes no key and is deterministic.
"""

import jax
import jax.numpy as jnp
import optax

from jaxloops.train import make_keyed_train_step, make_train_step


def check_rate(rate: float) -> None:
    """Raises ValueError unless 0 <= rate < 1."""
    # Written as `not (...)` so that NaN, which fails every comparison, is refused too.
    if not (0.0 <= rate < 1.0):
        raise ValueError(f"dropout rate {rate!r} must be in [0, 1)")


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Zeroes each entry of `x` with probability `rate`, scaling the rest by 1 / (1 - rate),
    so that every entry keeps its expected value (inverted dropout); x itself at rate 0."""
    check_rate(rate)
    if rate == 0.0:
        return x
    if key is None:
        raise ValueError(f"dropout at rate {rate} needs a key")
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def make_dropout_train_step(loss_fn, optimizer: optax.GradientTransformation, key, rate: float):
    """Chapter 5's train step for `loss_fn(params, batch, dropout_rate=, key=)`; step n's key
    is `fold_in(key, n)`, n the optimizer's step counter. At rate 0 it is chapter 5's step of
    `loss_fn(params, batch)` exactly: no key is drawn or passed."""
    check_rate(rate)
    if rate == 0.0:
        return make_train_step(loss_fn, optimizer)

    keyed = make_keyed_train_step(
        lambda params, batch, step_key: loss_fn(params, batch, dropout_rate=rate, key=step_key),
        optimizer,
    )
    return lambda params, opt_state, batch: keyed(params, opt_state, batch, key)
