"""Keeping the loop on the device: a whole epoch of train steps as one `lax.scan`."""

import jax
import jax.numpy as jnp

from jaxloops.data import Batch, epoch_batches


def make_epoch(train_step):
    """Wraps a pure train step into one epoch over batches stacked on a leading steps axis.

    Returns:
      `epoch(params, opt_state, batches) -> (params, opt_state, metrics)`, where each metric
      is the per-step history (steps,), still on the device.
    """

    def epoch(params, opt_state, batches: Batch):
        def body(carry, batch):
            params, opt_state = carry
            params, opt_state, metrics = train_step(params, opt_state, batch)
            return (params, opt_state), metrics

        (params, opt_state), metrics = jax.lax.scan(body, (params, opt_state), batches)
        return params, opt_state, metrics

    return epoch


def fit(key, params, opt_state, train_step, data: Batch, batch_size: int, epochs: int):
    """Trains for `epochs` epochs, reshuffling on the device each epoch.

    Returns:
      (params, opt_state, history): history maps each metric to an array (epochs,) of
      per-epoch means, fetched from the device once, at the end.
    """
    epoch = jax.jit(make_epoch(train_step), donate_argnums=(0, 1))
    history = []
    for epoch_key in jax.random.split(key, epochs):
        batches = epoch_batches(epoch_key, data, batch_size)
        params, opt_state, metrics = epoch(params, opt_state, batches)
        history.append(jax.tree.map(jnp.mean, metrics))  # stays on the device
    history = jax.device_get(jax.tree.map(lambda *m: jnp.stack(m), *history))
    return params, opt_state, history


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
    return [jax.tree.map(lambda a: a[i], batches) for i in range(batches.x.shape[0])]
