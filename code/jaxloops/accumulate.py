"""Gradient accumulation: M micro-batches through one `lax.scan`, one optimizer update.

The activations of one micro-batch (B / M examples) are live at a time; the gradient sum
(one float32 copy of the parameters) is carried from one micro-batch to the next.
"""

import jax
import jax.numpy as jnp
import optax

from jaxloops.train import LossFn


def split_micro(batch, num_micro: int):
    """Every leaf (B, ...) of `batch` reshaped to (M, B / M, ...)."""
    if not isinstance(num_micro, int) or num_micro < 1:
        raise ValueError(f"the number of micro-batches M must be a positive int, got {num_micro!r}")
    size = jax.tree.leaves(batch)[0].shape[0]
    if size % num_micro:
        raise ValueError(
            f"the batch of {size} does not split into {num_micro} equal micro-batches; "
            "unequal micro-batches would weight their examples unequally"
        )
    return jax.tree.map(
        lambda a: a.reshape(num_micro, size // num_micro, *a.shape[1:]), batch
    )  # (B, ...) -> (M, B/M, ...)


def accumulated_grads(loss_fn: LossFn, params, batch, num_micro: int):
    """The mean loss, metrics and gradient over M equal micro-batches, summed in float32.

    For a loss that is a mean over examples, the mean of M equal micro-batches' gradients
    is the full batch's gradient (up to float32 rounding of the reassociated sum).

    Returns:
      (loss, metrics, grads), each averaged over the M micro-batches.
    """
    micro = split_micro(batch, num_micro)

    def body(grad_sum, micro_batch):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, micro_batch)
        grad_sum = jax.tree.map(lambda s, g: s + g.astype(jnp.float32), grad_sum, grads)
        return grad_sum, {"loss": loss, **aux}

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    grad_sum, metrics = jax.lax.scan(body, zeros, micro)
    grads = jax.tree.map(lambda s, p: (s / num_micro).astype(p.dtype), grad_sum, params)
    metrics = jax.tree.map(jnp.mean, metrics)
    return metrics.pop("loss"), metrics, grads


def make_accumulating_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, M: int):
    """`make_train_step`'s step, with the gradient accumulated over M micro-batches."""
    if not isinstance(M, int) or M < 1:
        raise ValueError(f"the number of micro-batches M must be a positive int, got {M!r}")

    def train_step(params, opt_state, batch):
        loss, aux, grads = accumulated_grads(loss_fn, params, batch, M)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss, **aux}

    return train_step


def multi_steps(optimizer: optax.GradientTransformation, M: int) -> optax.MultiSteps:
    """optax's accumulation: each call takes one micro-batch's gradient; the inner update
    is applied on every M-th call (with the mean of the M gradients), zeros otherwise."""
    if not isinstance(M, int) or M < 1:
        raise ValueError(f"the number of micro-batches M must be a positive int, got {M!r}")
    return optax.MultiSteps(optimizer, every_k_schedule=M)
