"""Dropout for the transformer: the rate lives in `TransformerConfig`, the key in the step.

At a rate p > 0 each residual branch's output (attention's and the MLP's, before they are
added back to the stream) keeps each element with probability 1 - p, scaled by 1 / (1 - p),
so its expectation is unchanged. The train step derives step n's key as
`fold_in(key, n)` from the optimizer's own step counter, so a resumed run draws the same
masks; evaluation passes no key and is deterministic.
"""

import functools

import jax
import jax.numpy as jnp
import optax

from jaxloops.train import make_train_step


def check_rate(rate: float) -> None:
    """Raises ValueError unless 0 <= rate < 1 (NaN refused too)."""
    if not (0.0 <= rate < 1.0):
        raise ValueError(f"dropout_rate must be in [0, 1), got {rate!r}")


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """x with each element zeroed with probability `rate`, the rest scaled by 1 / (1 - rate);
    x itself when rate is 0."""
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

    def train_step(params, opt_state, batch):
        step = optax.tree_utils.tree_get(opt_state, "count")  # updates applied so far
        loss = functools.partial(loss_fn, dropout_rate=rate, key=jax.random.fold_in(key, step))
        return make_train_step(loss, optimizer)(params, opt_state, batch)

    return train_step
