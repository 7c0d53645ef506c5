"""When two runs of one computation agree: bounds from float32 rounding, and the checks.

A sharded train step sums the batch's per-example gradients in another order than one
device does (partial sums per device, then an all-reduce). Two float32 sums of the same n
terms, in any two orders, differ by at most 2 γ_n Σ|terms|, with γ_n = n u / (1 - n u) and
u = 2⁻²⁴ the unit roundoff (Higham, *Accuracy and Stability of Numerical Algorithms*, §4.2).
That bound, per parameter, is the tolerance of the gradients; Adam's first step maps it to a
tolerance of the parameters through the slope of its update. A resumed run replays the same
program on the same bits, so its tolerance is zero: it must be identical.

Not every backend rounds each float32 operation correctly. A TPU computes exp and log less
accurately than a CPU, and multiplies float32 matrices in bfloat16 passes (one at the default
precision; several, still not exact float32, at "highest"). `backend_eps` measures, in this
process, the relative error its default backend commits where correct rounding commits at
most float32's epsilon (`jaxloops.rounding`); a bound built on it holds for the arithmetic
actually done.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxloops.attention import attention_rounding_bound  # re-exported: attention's bound
from jaxloops.data import Batch
from jaxloops.rounding import backend_eps, backend_errors  # re-exported: this backend's eps

__all__ = (
    "UNIT_ROUNDOFF",
    "adam_step_bound",
    "attention_rounding_bound",
    "backend_eps",
    "backend_errors",
    "differing",
    "gradient_bound",
    "homogeneity_bound",
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


@functools.partial(jax.jit, static_argnums=0)  # one program, not one per operation
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


def _chain_error(x, weights, targets):
    """Per output: a bound on |float32 MLP(weights) - exact MLP(targets)| (zero biases, ReLU).

    Layer by layer, fl(x̂ W) - t W_t = [fl(x̂ W) - x̂ W] + x̂ (W - W_t) + (x̂ - t) W_t, so with
    e the bound so far and |x̂| <= |t| + e: e' = γ_(n+1) (|t| + e)|W| + (|t| + e)|W - W_t|
    + e |W_t| (Higham §3.5; ReLU is 1-Lipschitz). t is exact: float64, whose own rounding
    (1e-16 relative) is far below float32's."""
    t = np.asarray(x, np.float64)
    e = np.zeros_like(t)
    for i, (w, w_t) in enumerate(zip(weights, targets, strict=True)):
        w = np.asarray(w, np.float64)
        reach = np.abs(t) + e
        n = w.shape[0] + 1  # the fan-in's products and the bias
        e = sum_bound(reach, n) / 2 @ np.abs(w) + reach @ np.abs(w - w_t) + e @ np.abs(w_t)
        t = t @ w_t if i == len(weights) - 1 else np.maximum(t @ w_t, 0.0)
    return e


def homogeneity_bound(params, x, factor: float = 10.0):
    """Per logit: how far a float32 MLP with every weight times `factor` can be from
    `factor`^L times the float32 MLP's logits (L layers, zero biases, ReLU).

    Exactly the two are equal (ReLU is positively homogeneous). In float32, each differs
    from the exact scaled logits by its products' rounding (γ_(n+1) per layer of fan-in n,
    carried forward through |W|) and, for the scaled one, by the rounding of factor·W, known
    exactly: the sum of the two `_chain_error` bounds.

    Returns:
      (B, C) float64.
    """
    layers = [params[f"dense_{i}"] for i in range(len(params))]
    biggest_bias = max(float(np.abs(np.asarray(layer["b"])).max()) for layer in layers)
    if biggest_bias != 0:
        raise ValueError(
            f"biases must be zero for the homogeneity identity; max |b| = {biggest_bias}"
        )
    if not factor > 0:
        raise ValueError(f"factor must be positive (ReLU is homogeneous for those): {factor}")
    weights = [np.asarray(layer["w"], np.float64) for layer in layers]
    scaled = [np.asarray(factor * layer["w"]) for layer in layers]  # rounded as the page does
    exact_scaled = [factor * w for w in weights]
    return _chain_error(x, scaled, exact_scaled) + factor ** len(layers) * _chain_error(
        x, weights, weights
    )
