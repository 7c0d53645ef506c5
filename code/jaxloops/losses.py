"""Losses and metrics on logits: one module, used by every model in the book."""

import jax
import jax.numpy as jnp
from jax.experimental import checkify


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy from logits (B, C) and integer labels (B,), stable for any scale.

    A label outside [0, C) is not an error inside compiled code: its log-probability is
    gathered out of bounds, which JAX fills with NaN. `checked_cross_entropy` raises instead.
    """
    log_probs = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)  # (B, C)
    picked = jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]  # (B,)
    return -picked.mean()


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Share of rows whose largest logit is the label."""
    return (logits.argmax(axis=-1) == labels).mean()


def check_labels(labels: jax.Array, num_classes: int, what: str = "labels") -> None:
    """A run-time check, valid inside jit once functionalised by `checkify.checkify`,
    that every entry of `labels` is in [0, C); its message names the bad extremes."""
    checkify.check(
        jnp.all((labels >= 0) & (labels < num_classes)),
        f"{what} must be in [0, {num_classes}); got min {{lo}}, max {{hi}}",
        lo=labels.min(),
        hi=labels.max(),
    )


def checked_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """`cross_entropy` that checks its labels first. Under `jax.jit`, wrap the function that
    calls it in `checkify.checkify`: the check then becomes an error value to `.throw()`."""
    check_labels(labels, logits.shape[-1])
    return cross_entropy(logits, labels)
