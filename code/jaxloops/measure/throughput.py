"""Measuring training loops: ways to drive the same step, host/device overlap, steps/s."""

import time

import jax
import jax.numpy as jnp

from jaxloops.data import Batch, epoch_batches
from jaxloops.loop import fit, make_epoch, python_loop, unstack
from jaxloops.measure.compiled import costs_of
from jaxloops.measure.profile import HOST_WORK
from jaxloops.measure.timing import interleaved_seconds, time_call


def random_batches(
    key: jax.Array, steps: int, batch_size: int, num_features: int, num_classes: int
) -> Batch:
    """Synthetic batches (steps, B, F_in) / (steps, B): throughput does not depend on the values."""
    x_key, y_key = jax.random.split(key)
    x = jax.random.normal(x_key, (steps, batch_size, num_features))
    y = jax.random.randint(y_key, (steps, batch_size), 0, num_classes)
    return Batch(x, y)


def scan_throughput(
    train_step, params, opt_state, batches: Batch, repeats: int
) -> dict[str, float]:
    """Steps/s and FLOP/s of the scanned epoch, compiled once.

    FLOPs per step come from XLA's cost analysis of the compiled epoch, which counts a loop
    body once: the epoch's count is one step's (a test checks it against the step's own).
    """
    steps, batch_size = batches.x.shape[:2]
    compiled = jax.jit(make_epoch(train_step)).lower(params, opt_state, batches).compile()
    flops_per_step = costs_of(compiled)["flops"]
    seconds = time_call(compiled, params, opt_state, batches, repeats=repeats)
    return {
        "batch_size": int(batch_size),
        "steps_per_s": steps / seconds,
        "examples_per_s": steps * batch_size / seconds,
        "flops_per_step": flops_per_step,
        "flops_per_s": flops_per_step * steps / seconds,
    }


def host_pipeline(batches, host_seconds: float):
    """Yields each batch after `host_seconds` of host work, as an input pipeline that reads
    and decodes files would. A sleep stands in for that work: unlike real decoding, it
    leaves the processor free, so it overlaps with a CPU backend as it would with a GPU."""
    for batch in batches:
        with jax.profiler.TraceAnnotation(HOST_WORK):
            time.sleep(host_seconds)
        yield batch


def overlap_drivers(train_step, params, opt_state, batches: Batch, host_seconds: float, k: int):
    """The drivers of the overlap experiment, each `() -> final params`.

    Three feed the jitted step from `host_pipeline` and fetch the loss every step, every
    k steps, or never; the scan runs the epoch on batches already on the device (the
    pipeline moved onto the device, as chapter 2 does), with no per-step host work.
    """
    as_list = unstack(batches)
    jitted = jax.jit(train_step)
    epoch = jax.jit(make_epoch(train_step))
    fed = lambda log_every: python_loop(
        jitted, params, opt_state, host_pipeline(as_list, host_seconds), log_every
    )[0]
    return {
        "fetch every step": lambda: fed(1),
        f"fetch every {k} steps": lambda: fed(k),
        "never fetch": lambda: fed(None),
        "scan, data on device": lambda: epoch(params, opt_state, batches)[0],
    }


def predicted_step_seconds(host: float, device: float, k: int) -> dict[str, float]:
    """Seconds per step each overlap driver should take, for host work h and device work d.

    Fetching every step serialises them: h + d. Otherwise the host prepares step t+1
    while the device runs step t: max(h, d); a fetch every k steps drains the queue once
    per k steps, adding min(h, d) / k. The scan has no host work per step: d.
    """
    return {
        "fetch every step": host + device,
        f"fetch every {k} steps": max(host, device) + min(host, device) / k,
        "never fetch": max(host, device),
        "scan, data on device": device,
    }


def fit_against_bare_epoch(
    key, params, opt_state, train_step, data: Batch, *, batch_size: int, epochs: int, rounds: int
) -> dict[str, float]:
    """Seconds of `fit` and of the same jitted epoch driven directly from Python, reshuffling
    included, each compiled beforehand (fastest of `rounds`, taken in turn).

    Both start from fresh copies of `params` and `opt_state` (fit donates what it is given).
    """
    copies = lambda: jax.tree.map(jnp.copy, (params, opt_state))
    epoch = jax.jit(make_epoch(train_step), donate_argnums=(0, 1))

    def bare():
        p, s = copies()
        for e in range(epochs):
            batches = epoch_batches(jax.random.fold_in(key, e), data, batch_size)  # (steps, B, ...)
            p, s, _ = epoch(p, s, batches)
        return p

    def through_fit():
        return fit(key, *copies(), train_step, data, batch_size=batch_size, epochs=epochs)[0]

    seconds = interleaved_seconds({"fit": through_fit, "bare epoch": bare}, rounds)
    seconds["steps"] = epochs * (data.x.shape[0] // batch_size)
    return seconds
