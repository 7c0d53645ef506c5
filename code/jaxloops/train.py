"""The pure train step: (params, opt_state, batch[, key]) -> (params, opt_state, metrics)."""

from collections.abc import Callable
from typing import Any

import jax
import optax

LossFn = Callable[[Any, Any], tuple[jax.Array, dict[str, jax.Array]]]
KeyedLossFn = Callable[[Any, Any, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]


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


def step_count(opt_state) -> jax.Array:
    """The optimizer's step counter: how many updates `opt_state` has seen (int32 scalar).

    optax keeps it in the state as `count` (AdamW's moments, or inject_hyperparams' own);
    every counter in a state advances once per update, so the first one found is the step.
    """
    counts = optax.tree.get_all_with_path(opt_state, "count")
    if not counts:
        raise ValueError(f"opt_state {type(opt_state).__name__} holds no step counter `count`")
    return counts[0][1]


def make_keyed_train_step(loss_fn: KeyedLossFn, optimizer: optax.GradientTransformation):
    """The train step of a loss that draws randomness: `loss_fn(params, batch, key)`.

    The step takes one key for the whole run and draws from `fold_in(key, step)`, with the
    step read from the optimizer's counter: the masks of step t depend only on the key and
    t, so a run resumed from a checkpoint (which holds the counter) draws the same ones.

    Returns:
      `train_step(params, opt_state, batch, key) -> (params, opt_state, metrics)`.
    """

    def train_step(params, opt_state, batch, key):
        step_key = jax.random.fold_in(key, step_count(opt_state))
        loss = lambda params, batch: loss_fn(params, batch, step_key)
        return make_train_step(loss, optimizer)(params, opt_state, batch)

    return train_step
