"""Chapter 4's page: the tolerance its per-example gradients are checked against, and the
figures of its vmap-against-a-loop timing (book/04_gradients.md)."""

import statistics

import jax
import numpy as np

from jaxloops import equivalence
from jaxloops.measure.timing import paired_ratio

# Two float32 computations of one value, each within e of the exact one, differ by at most
# 2 e. The loop's e is measured; FACTOR doubles 2 e again, so the vmapped run's own largest
# error may be twice the loop's.
FACTOR = 4.0


def float32_tolerance(looped32, looped64, factor: float = FACTOR):
    """Per leaf, one number: how far another float32 computation of the same per-example
    gradients may sit from `looped32`. `factor` times the largest distance of `looped32`
    from the same gradients computed in float64, at least `factor` u max|g| (u float32's
    unit roundoff) where the loop happened to be exact.

    Args:
      looped32, looped64: trees of the same structure and shapes (float32, float64).
    """
    if not 0 < factor < float("inf"):
        raise ValueError(f"factor must be a finite number > 0, got {factor}")
    shapes32, shapes64 = (jax.tree.map(np.shape, t) for t in (looped32, looped64))
    if shapes32 != shapes64:
        raise ValueError(f"the two trees differ: {shapes32} and {shapes64}")

    def leaf_tolerance(got, exact):
        got, exact = np.asarray(got, np.float64), np.asarray(exact, np.float64)
        floor = equivalence.UNIT_ROUNDOFF * np.abs(exact).max(initial=0.0)
        return factor * max(float(np.abs(got - exact).max(initial=0.0)), floor)

    return jax.tree.map(leaf_tolerance, looped32, looped64)


def mean_tolerance(loss_fn, params, batch, per_example_tolerance):
    """Per parameter: how far the mean of per-example gradients may sit from the gradient of
    the batch's mean loss. The two sum the B examples in different orders
    (`equivalence.gradient_bound`), and each example's term may differ by its leaf's
    `per_example_tolerance` (`float32_tolerance`), which bounds their mean too."""
    order = equivalence.gradient_bound(loss_fn, params, batch)
    return jax.tree.map(lambda b, t: np.asarray(b, np.float64) + t, order, per_example_tolerance)


def vmap_timing(samples: dict[str, list[float]]) -> dict[str, float]:
    """The vmapped call against the loop, from `measure.interleaved_samples` with runs
    "vmap" and "loop": each one's median milliseconds, and the loop's time over vmap's (the
    median of the paired rounds, `measure.paired_ratio`)."""
    if set(samples) != {"vmap", "loop"}:
        raise ValueError(f"need the runs 'vmap' and 'loop', got {sorted(samples)}")
    return {
        "vmap_ms": 1e3 * statistics.median(samples["vmap"]),
        "loop_ms": 1e3 * statistics.median(samples["loop"]),
        "ratio": paired_ratio(samples["loop"], samples["vmap"]),
    }
