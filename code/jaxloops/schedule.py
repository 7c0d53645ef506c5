"""A learning-rate schedule: linear warm-up, then cosine decay, read back from the state.

The rate at step t (0-based), for peak η, W warm-up steps and a run of T steps:
    η t / W                                 for t < W
    η (1 + cos(π (t - W) / (T - W))) / 2    for W <= t <= T
"""

import math

import jax
import numpy as np
import optax

from jaxloops.equivalence import UNIT_ROUNDOFF
from jaxloops.train import decay_mask


def warmup_cosine(peak: float, *, warmup_steps: int, total_steps: int) -> optax.Schedule:
    """optax's warm-up-then-cosine schedule from 0 up to `peak` and back down to 0.

    Raises:
      ValueError: a warm-up that is not shorter than the run, or a peak that is not > 0.
    """
    if not (0 < peak < float("inf")):
        raise ValueError(f"peak learning rate {peak} must be finite and > 0")
    if not 0 < warmup_steps < total_steps:
        raise ValueError(
            f"warm-up of {warmup_steps} steps must be >= 1 and shorter than the run of "
            f"{total_steps} steps"
        )
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak, warmup_steps=warmup_steps, decay_steps=total_steps
    )


def make_scheduled_optimizer(
    schedule: optax.Schedule, weight_decay: float
) -> optax.GradientTransformation:
    """`make_optimizer`'s AdamW with a scheduled rate, kept in the state for reading back.

    `inject_hyperparams` evaluates the schedule at the step counter on every update and
    stores the rate it used in `opt_state.hyperparams`; `mask` is a function, not a
    schedule, so it is passed through as a static argument.
    """
    if not (0 <= weight_decay < float("inf")):
        raise ValueError(f"need a finite weight_decay >= 0, got {weight_decay}")
    adamw = optax.inject_hyperparams(optax.adamw, static_args=("mask",))
    return adamw(learning_rate=schedule, weight_decay=weight_decay, mask=decay_mask)


def applied_learning_rate(opt_state) -> jax.Array:
    """The rate the last update used (after step t: the schedule at t), from the state."""
    if not hasattr(opt_state, "hyperparams"):
        raise ValueError(
            f"opt_state {type(opt_state).__name__} keeps no hyperparams: build the optimizer "
            "with make_scheduled_optimizer (optax.inject_hyperparams)"
        )
    return opt_state.hyperparams["learning_rate"]


def warmup_cosine_formula(steps, peak: float, warmup_steps: int, total_steps: int) -> np.ndarray:
    """The module docstring's formula at `steps`, in float64: the reference for the schedule."""
    t = np.asarray(steps, np.float64)
    since_peak = np.clip(t - warmup_steps, 0, None) / (total_steps - warmup_steps)
    decay = 0.5 * (1 + np.cos(np.pi * since_peak))
    return np.where(t < warmup_steps, peak * t / warmup_steps, peak * decay)


def schedule_bound(peak: float) -> float:
    """How far float32 evaluation of the schedule may sit from the float64 formula.

    The cosine's argument π (t - W) / (T - W) is three float32 roundings of a number of at
    most π (3π u); cos, the sum, the halving and the product with η add one rounding each
    (4 u), all relative to η at most. The warm-up's ramp takes fewer.
    """
    return peak * UNIT_ROUNDOFF * (3 * math.pi + 4)


def schedule_error(applied, peak: float, warmup_steps: int, total_steps: int) -> float:
    """max |applied - formula| / schedule_bound over steps 0, 1, ...: <= 1 means they agree."""
    applied = np.asarray(applied, np.float64)
    formula = warmup_cosine_formula(np.arange(applied.size), peak, warmup_steps, total_steps)
    return float(np.abs(applied - formula).max() / schedule_bound(peak))
