"""When two runs of one computation agree: bounds from float32 rounding, and the checks.

A sharded train step sums the batch's per-example gradients in another order than one
device does (partial sums per device, then an all-reduce). Two float32 sums of the same n
terms, in any two orders, differ by at most 2 γ_n Σ|terms|, with γ_n = n u / (1 - n u) and
u = 2⁻²⁴ the unit roundoff (Higham, *Accuracy and Stability of Numerical Algorithms*, §4.2).
That bound, per parameter, is the tolerance of the gradients; Adam's first step maps it to a
tolerance of the parameters through the slope of its update. A resumed run replays the same
program on the same bits, so its tolerance is zero: it must be identical.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxloops.attention import attention_rounding_bound  # re-exported: attention's bound
from jaxloops.data import Batch

__all__ = (
    "UNIT_ROUNDOFF",
    "adam_step_bound",
    "attention_rounding_bound",
    "differing",
    "gradient_bound",
    "sum_bound",
    "worst_ratio",
)

UNIT_ROUNDOFF = 2.0**-24  # float32: half the spacing of floats in [1, 2)


def sum_bound(abs_sum, count: int):
    """Largest difference between two float32 sums of `count` terms, in any two orders,
    whose absolute values sum to `abs_sum` (an array: one bound per element)."""
    if count * UNIT_ROUNDOFF >= 1:
        raise ValueError(f"{count} terms: the float32 summation bound is void (n u >= 1)")
    gamma = count * UNIT_ROUNDOFF / (1 - count * UNIT_ROUNDOFF)
    return 2 * gamma * abs_sum


def gradient_bound(loss_fn, params, batch: Batch):
    """Per parameter: how far two float32 evaluations of the mean gradient over `batch` can
    differ when they sum its B examples in different orders.

    The terms are the per-example gradients ∇ℓᵢ / B, one example at a time (a scan, so the
    memory is one gradient). Two more terms cover a mean of per-device means (`pmean`).

    Returns:
      A tree like `params`: 2 γ_(B+2) Σᵢ |∇ℓᵢ| / B.
    """
    rows = jax.tree.leaves(batch)[0].shape[0]

    def add(total, example):
        one = jax.tree.map(lambda a: a[None], example)  # a batch of one row
        grad = jax.grad(lambda p: loss_fn(p, one)[0])(params)
        return jax.tree.map(lambda t, g: t + jnp.abs(g), total, grad), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    abs_sum, _ = jax.lax.scan(add, zeros, batch)
    return jax.tree.map(lambda s: sum_bound(s / rows, rows + 2), abs_sum)


def adam_step_bound(grad, grad_bound, params, *, learning_rate: float, eps: float = 1e-8):
    """Per parameter: how far Adam's first update can move when the gradient moves by up to
    `grad_bound`, plus the rounding of the update itself.

    The first update is -η g / (|g| + ε) (bias-corrected moments: m = g, v = g²), whose slope
    ε / (|g| + ε)² is steepest where g is 0: near zero a tiny gradient difference moves a
    parameter by up to η δg / ε, never more than 2η; elsewhere it barely moves it.
    """

    def bound(g, b, w):
        g, b, w = (np.abs(np.asarray(a, np.float64)) for a in (g, b, w))
        nearest = np.maximum(g - b, 0.0)  # the smallest |g| within the bound
        slope = learning_rate * eps * b / (nearest + eps) ** 2
        return np.minimum(slope, 2 * learning_rate) + 8 * UNIT_ROUNDOFF * (w + learning_rate)

    return jax.tree.map(bound, grad, grad_bound, params)


def worst_ratio(got, want, tolerance) -> float:
    """max |got - want| / tolerance over every element of the trees: <= 1 means they agree.

    An element whose tolerance is 0 must be equal (it counts as inf otherwise)."""
    worst = 0.0
    for g, w, t in zip(*(jax.tree.leaves(x) for x in (got, want, tolerance)), strict=True):
        diff = np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))
        t = np.broadcast_to(np.asarray(t, np.float64), diff.shape)
        ratio = np.where(t > 0, diff / np.where(t > 0, t, 1.0), np.where(diff > 0, np.inf, 0.0))
        worst = max(worst, float(ratio.max(initial=0.0)))
    return worst


def differing(got: dict, want: dict) -> list[str]:
    """Names of the arrays that are not identical, bit for bit (missing ones included)."""
    names = sorted(got.keys() | want.keys())
    return [
        name
        for name in names
        if name not in got
        or name not in want
        or np.asarray(got[name]).dtype != np.asarray(want[name]).dtype
        or not np.array_equal(got[name], want[name])
    ]
