"""Chapter 16's numbers: what each NNX form of the step costs per call, at a batch where the
per-call work dominates and at one where the step's compute does.

A form's per-call overhead is its time per step less the pytree step's at the same batch. The
large batch is found by measurement (`compute_bound_batch`): doubling from a start until the
pytree step takes at least `factor` times `nnx.jit`'s overhead, on whatever machine runs
the page (a chip computes the small batch far faster than two CPU cores, so no fixed size
would do on both).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxloops.data import Batch
from jaxloops.measure import timing

# Each timed form's short name in the page's glue names: ch16_{short}_us and so on.
SHORT = {
    "pytree": "pytree",
    "nnx.jit": "jit",
    "nnx.cached_partial": "cached",
    "nnx.jit(graph=False)": "tree",
    "nnx.jit_partial(graph=False)": "partial",
    "split/merge": "split",
}


def batch_of(data: Batch, size: int) -> Batch:
    """The first `size` examples of `data`, its examples repeated in order where `size`
    exceeds them: a batch of any size from a small data set (the page times steps, not
    learning)."""
    n = int(data.x.shape[0])
    if size < 1 or n < 1:
        raise ValueError(f"need a batch size >= 1 and data with examples, got {size}, {n}")
    index = jnp.arange(size) % n  # (B,)
    return jax.device_put(Batch(data.x[index], data.y[index]))


def compute_bound_batch(
    seconds_at: Callable[[int], float],
    overhead: float,
    *,
    start: int,
    factor: float = 10.0,
    cap: int = 2**20,
) -> tuple[int, float]:
    """The smallest of start, 2·start, 4·start, ... up to `cap` whose step takes at least
    `factor` × `overhead` seconds (`seconds_at(size)`): a batch where the step's compute
    outweighs a per-call overhead of `overhead` by `factor`.

    Returns:
      (that batch size, its step's seconds), or the cap's where no size reaches the target.
    """
    if start < 1 or cap < start or factor <= 0 or not overhead > 0:
        raise ValueError(
            f"need 1 <= start <= cap, factor > 0, overhead > 0; got start {start}, cap {cap}, "
            f"factor {factor}, overhead {overhead}"
        )
    size = start
    while True:
        seconds = seconds_at(size)
        if seconds >= factor * overhead or 2 * size > cap:
            return size, seconds
        size *= 2


def step_seconds(step, batch: Batch, steps: int = 3) -> float:
    """Seconds per call of `step(batch)` (a form's step, `nnx_step.form_step`): the median of
    three runs of `steps` calls, after one run that compiles it."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")

    def run():
        for _ in range(steps):
            loss = step(batch)
        return loss

    return timing.time_call(run, warmup=1, repeats=3) / steps


def pytree_seconds_at(params, tx, data: Batch) -> Callable[[int], float]:
    """`size -> seconds per step` of the book's pytree step (chapter 5, state donated) on
    `batch_of(data, size)`, for `compute_bound_batch`."""
    from jaxloops.mlp import mlp_loss
    from jaxloops.train import make_train_step

    step = jax.jit(make_train_step(mlp_loss, tx), donate_argnums=(0, 1))
    state = [jax.tree.map(lambda a: a.copy(), params), tx.init(params)]

    def one(batch):
        state[0], state[1], metrics = step(*state, batch)
        return metrics["loss"]

    return lambda size: step_seconds(one, batch_of(data, size))


def per_form(samples: dict[str, list[float]], steps: int) -> dict[str, dict[str, float]]:
    """Each form's figures from `interleaved_samples` of `form_loops` (`steps` steps per
    timed call, "pytree" among them): `us`, the median µs per step; `ratio`, the median over
    rounds of its time over the pytree step's in the same round; `over`, its µs per step
    beyond the pytree step's."""
    if "pytree" not in samples or steps < 1:
        raise ValueError(f"need the pytree step's samples and steps >= 1: {list(samples)}, {steps}")
    us = {form: 1e6 * float(np.median(s)) / steps for form, s in samples.items()}
    return {
        form: {
            "us": us[form],
            "ratio": timing.paired_ratio(samples[form], samples["pytree"]),
            "over": us[form] - us["pytree"],
        }
        for form in samples
    }


def predicted_ratio(overhead_us: float, step_us: float) -> float:
    """A form's time over the pytree step's where its per-call overhead and the step's compute
    take turns (no overlap): 1 + overhead / step."""
    if not step_us > 0:
        raise ValueError(f"the step's time must be positive, got {step_us} µs")
    return 1 + max(overhead_us, 0.0) / step_us


def glue_values(figures: dict[str, dict[str, float]], prefix: str = "") -> dict[str, float]:
    """`per_form`'s figures under the page's glue names, e.g. {prefix}jit_us, {prefix}tree_ratio."""
    unknown = set(figures) - set(SHORT)
    if unknown:
        raise ValueError(f"unknown forms {sorted(unknown)}; expected some of {list(SHORT)}")
    return {
        f"{prefix}{SHORT[form]}_{key}": float(value)
        for form, row in figures.items()
        for key, value in row.items()
    }
