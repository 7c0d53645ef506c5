"""Measuring training loops: four ways to drive the same step, and steps/s vs batch size."""

import jax

from jaxloops.data import Batch
from jaxloops.loop import make_epoch, python_loop, unstack
from jaxloops.measure.timing import time_call


def random_batches(
    key: jax.Array, steps: int, batch_size: int, num_features: int, num_classes: int
) -> Batch:
    """Synthetic batches (steps, B, F_in) / (steps, B): throughput does not depend on the values."""
    x_key, y_key = jax.random.split(key)
    x = jax.random.normal(x_key, (steps, batch_size, num_features))
    y = jax.random.randint(y_key, (steps, batch_size), 0, num_classes)
    return Batch(x, y)


def compare_loops(
    train_step, params, opt_state, batches: Batch, log_every: int, repeats: int, eager_steps: int
) -> dict[str, float]:
    """Steps per second of four drivers of the same pure `train_step`, measured in one run.

    Args:
      batches: one epoch, stacked on a leading steps axis.
      log_every: k for the "log every k steps" driver.
      eager_steps: how many steps to time the (slow) un-jitted driver over.
    Returns:
      {driver name: steps per second}.
    """
    steps = batches.x.shape[0]
    as_list = unstack(batches)
    jitted = jax.jit(train_step)
    epoch = jax.jit(make_epoch(train_step))
    # Each driver returns its final params so time_call waits for all of its work.
    drivers = {
        "eager step, loss to host every step": (
            lambda: python_loop(train_step, params, opt_state, as_list[:eager_steps], 1)[0],
            eager_steps,
        ),
        "jitted step, loss to host every step": (
            lambda: python_loop(jitted, params, opt_state, as_list, 1)[0],
            steps,
        ),
        f"jitted step, loss to host every {log_every} steps": (
            lambda: python_loop(jitted, params, opt_state, as_list, log_every)[0],
            steps,
        ),
        "lax.scan over the epoch, metrics stay on device": (
            lambda: epoch(params, opt_state, batches)[0],
            steps,
        ),
    }
    rates = {}
    for name, (run, n) in drivers.items():
        reps = 1 if name.startswith("eager") else repeats
        rates[name] = n / time_call(run, warmup=1, repeats=reps)
    return rates


def scan_throughput(
    train_step, params, opt_state, batches: Batch, repeats: int
) -> dict[str, float]:
    """Steps/s and FLOP/s of the scanned epoch, compiled once.

    FLOPs per step come from XLA's cost analysis of the compiled epoch, which counts a loop
    body once: the epoch's count is one step's (a test checks it against the step's own).
    """
    steps, batch_size = batches.x.shape[:2]
    compiled = jax.jit(make_epoch(train_step)).lower(params, opt_state, batches).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops_per_step = float(cost["flops"])
    seconds = time_call(compiled, params, opt_state, batches, repeats=repeats)
    return {
        "batch_size": int(batch_size),
        "steps_per_s": steps / seconds,
        "examples_per_s": steps * batch_size / seconds,
        "flops_per_step": flops_per_step,
        "flops_per_s": flops_per_step * steps / seconds,
    }
