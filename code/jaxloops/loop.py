"""Keeping the loop on the device: an epoch as one `lax.scan`, and `fit`, the book's driver."""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxloops.data import Batch, epoch_batches

# A hook sees the state after `epoch` epochs and may return metrics to record, e.g.
# {"val_loss": ...}, with "stop": True to end the run there; it must not keep the arrays:
# fit donates them to its next call.
Hook = Callable[[int, Any, Any], dict | None]


class History(NamedTuple):
    """What `fit` recorded, on the host.

    train: each metric of the train step -> array (epochs run,) of per-epoch means.
    hooks: (epoch, what the hook returned) for every hook call that returned something.
    """

    train: dict
    hooks: list


def make_epoch(train_step):
    """Wraps a pure train step into one epoch over batches stacked on a leading steps axis.

    Returns:
      `epoch(params, opt_state, batches, step_key=None) -> (params, opt_state, metrics)`,
      where each metric is the per-step history (steps,), still on the device. A
      `step_key` is passed to every step (`make_keyed_train_step`'s fourth argument).
    """

    def epoch(params, opt_state, batches: Batch, step_key=None):
        keys = () if step_key is None else (step_key,)

        def body(carry, batch):
            params, opt_state = carry
            params, opt_state, metrics = train_step(params, opt_state, batch, *keys)
            return (params, opt_state), metrics

        (params, opt_state), metrics = jax.lax.scan(body, (params, opt_state), batches)
        return params, opt_state, metrics

    return epoch


def make_epochs(train_step, batch_size: int, num_epochs: int):
    """`num_epochs` epochs as one program, reshuffling on the device before each.

    Epoch e draws its order from `fold_in(key, e)`, so any range of epochs can be run again,
    or resumed, in the same order.

    Returns:
      `epochs(params, opt_state, key, first_epoch, data, step_key=None) -> (params,
      opt_state, metrics)`, each metric (num_epochs,) of per-epoch means.
    """
    epoch = make_epoch(train_step)

    def epochs(params, opt_state, key, first_epoch, data: Batch, step_key=None):
        def body(carry, e):
            params, opt_state = carry
            batches = epoch_batches(jax.random.fold_in(key, e), data, batch_size)  # (steps, B, ...)
            params, opt_state, metrics = epoch(params, opt_state, batches, step_key)
            return (params, opt_state), jax.tree.map(jnp.mean, metrics)

        (params, opt_state), metrics = jax.lax.scan(
            body, (params, opt_state), first_epoch + jnp.arange(num_epochs)
        )
        return params, opt_state, metrics

    return epochs


@functools.lru_cache(maxsize=64)
def compiled_epochs(train_step, batch_size: int, num_epochs: int):
    """The jitted `make_epochs(...)`, one per (step function, batch size, epochs per call).

    jit then keeps one compiled program per shape and sharding of the arguments, so a
    second `fit` with the same step and data compiles nothing.
    """
    return jax.jit(make_epochs(train_step, batch_size, num_epochs), donate_argnums=(0, 1))


def fit(
    key,
    params,
    opt_state,
    train_step,
    data: Batch,
    *,
    batch_size: int,
    epochs: int,
    epochs_per_call: int | None = None,
    start_epoch: int = 0,
    hook: Hook | None = None,
    step_key: jax.Array | None = None,
):
    """Trains epochs start_epoch .. epochs-1, reshuffling on the device before each epoch.

    Each call of the compiled program runs `epochs_per_call` epochs (default: all of them
    at once); between calls `hook(epoch, params, opt_state)` runs on the host, for
    evaluation, logging or checkpoints, and ends the run early by returning "stop": True.
    Metrics stay on the device until the end.

    Args:
      key: PRNG key of the data order; epoch e uses `fold_in(key, e)`.
      train_step: pure `(params, opt_state, batch) -> (params, opt_state, metrics)`,
        not jitted (fit compiles it, once per step function, batch size and shapes).
      data: the training set, on the device, examples on the leading axis.
      start_epoch: the first epoch to run: resuming after `start_epoch` epochs replays
        the same data order as an uninterrupted run.
      step_key: for a train step that draws randomness (`make_keyed_train_step`): its key,
        the same for every step (each step folds in its own count).
    Returns:
      (params, opt_state, History). The params and opt_state passed in are donated.
    """
    examples = jax.tree.leaves(data)[0].shape[0]
    if epochs < 1:  # would return the state untouched and an empty history
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if not 0 < batch_size <= examples:
        raise ValueError(f"batch size {batch_size} must be in [1, {examples}] (the examples)")
    if not 0 <= start_epoch <= epochs:
        raise ValueError(f"start_epoch {start_epoch} must be in [0, epochs = {epochs}]")
    per_call = (epochs - start_epoch) if epochs_per_call is None else epochs_per_call
    if per_call < 1 and epochs > start_epoch:
        raise ValueError(f"epochs_per_call must be >= 1, got {epochs_per_call}")
    metrics, hooks, epoch = [], [], start_epoch
    while epoch < epochs:
        n = min(per_call, epochs - epoch)
        run = compiled_epochs(train_step, batch_size, n)
        params, opt_state, chunk = run(params, opt_state, key, epoch, data, step_key)
        metrics.append(chunk)  # stays on the device
        epoch += n
        recorded = None if hook is None else hook(epoch, params, opt_state)
        if recorded:
            hooks.append((epoch, recorded))
            if recorded.get("stop"):
                break
    train = {}
    if metrics:
        train = jax.device_get(jax.tree.map(lambda *m: jnp.concatenate(m), *metrics))
    return params, opt_state, History(train, jax.device_get(hooks))


def python_loop(step, params, opt_state, batches: list[Batch], log_every: int | None):
    """Drives `step` from Python over a list of device batches.

    Args:
      log_every: fetch the loss to the host (a device->host sync) every this many steps;
        1 syncs every step, None never does.
    Returns:
      (params, opt_state, logged losses as Python floats).
    """
    if log_every is not None and log_every < 1:
        raise ValueError(f"log_every must be >= 1 or None, got {log_every}")
    logged = []
    for i, batch in enumerate(batches):
        params, opt_state, metrics = step(params, opt_state, batch)
        if log_every is not None and i % log_every == 0:
            logged.append(float(metrics["loss"]))  # blocks until this step has finished
    return params, opt_state, logged


def unstack(batches: Batch) -> list[Batch]:
    """Splits batches stacked on a leading steps axis into a list, one device batch each."""
    return [jax.tree.map(lambda a, i=i: a[i], batches) for i in range(batches.x.shape[0])]
