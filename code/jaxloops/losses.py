"""Losses and metrics on logits: one module, used by every model in the book."""

import jax
import jax.numpy as jnp


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy from logits (B, C) and integer labels (B,), stable for any scale."""
    log_probs = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)  # (B, C)
    picked = jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]  # (B,)
    return -picked.mean()


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Share of rows whose largest logit is the label."""
    return (logits.argmax(axis=-1) == labels).mean()
