"""The pure train step: (params, opt_state, batch) -> (params, opt_state, metrics)."""

from collections.abc import Callable
from typing import Any

import jax
import optax

LossFn = Callable[[Any, Any], tuple[jax.Array, dict[str, jax.Array]]]


def decay_mask(params) -> Any:
    """True for weight matrices, False for biases and other vectors (no decay on those)."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(learning_rate: float, weight_decay: float) -> optax.GradientTransformation:
    """AdamW with decoupled weight decay on weight matrices only."""
    # Written as `not (... > 0)` so that NaN, which fails every comparison, is refused too.
    if not (0 < learning_rate < float("inf")) or not (0 <= weight_decay < float("inf")):
        raise ValueError(
            "need a finite learning_rate > 0 and weight_decay >= 0, "
            f"got {learning_rate}, {weight_decay}"
        )
    return optax.adamw(learning_rate, weight_decay=weight_decay, mask=decay_mask)


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation):
    """Builds the pure train step for a loss `loss_fn(params, batch) -> (loss, aux)`.

    The step holds no state of its own: everything it changes comes in as an argument and
    goes out as a result, so `jax.jit` can compile the whole of it into one program.
    """

    def train_step(params, opt_state, batch):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, **aux}

    return train_step
