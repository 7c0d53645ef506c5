"""Gradients by hand and by autodiff: one SGD update, a finite-difference check, and each
example's own gradient (`jax.vmap`)."""

import functools

import jax
import jax.numpy as jnp

from jaxloops.losses import known_value


def sgd_update(params, grads, learning_rate: float):
    """One plain SGD step, leaf by leaf: p <- p - lr * g.

    A known learning rate must be finite and > 0: a negative one climbs the loss, 0 does
    nothing (a traced one, inside the caller's `jit`, is the caller's to check)."""
    lr = known_value(learning_rate)
    if lr is not None and not (lr.ndim == 0 and 0 < lr < float("inf")):
        raise ValueError(f"learning_rate must be a finite number > 0, got {learning_rate}")
    return jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)


def finite_difference(loss_fn, params, path: tuple, index: tuple, eps: float = 1e-3) -> float:
    """Central difference (f(p + eps) - f(p - eps)) / (2 eps) of one parameter entry.

    Args:
      loss_fn: scalar function of params.
      path: keys to the leaf, e.g. ("dense_0", "w").
      index: the entry inside that leaf, e.g. (3, 5).
    """

    if not 0 < eps < float("inf"):  # eps = 0 divides 0 by 0; NaN fails the comparison too
        raise ValueError(f"eps must be a finite number > 0, got {eps}")
    leaves = {
        tuple(getattr(k, "key", k) for k in key_path): leaf
        for key_path, leaf in jax.tree.leaves_with_path(params)
    }
    # A path or index that matches nothing would bump nothing and return 0: refuse it.
    if tuple(path) not in leaves:
        raise ValueError(f"path {path} names no leaf of params; leaves: {sorted(leaves)}")
    shape = leaves[tuple(path)].shape
    if len(index) != len(shape) or not all(0 <= i < n for i, n in zip(index, shape)):
        raise ValueError(f"index {index} is not an entry of leaf {path} of shape {shape}")

    def bumped(delta):
        def bump(key_path, leaf):
            keys = tuple(k.key for k in key_path)
            return leaf.at[index].add(delta) if keys == tuple(path) else leaf

        return loss_fn(jax.tree.map_with_path(bump, params))

    return float((bumped(eps) - bumped(-eps)) / (2 * eps))


def finite_difference_bound(
    loss_fn, params, path: tuple, index: tuple, *, eps: float, terms: int, scale: float
) -> float:
    """How far `finite_difference` at step eps may sit from the true derivative.

    Rounding: each loss is wrong by at most γ_terms * scale (γ_n = n u / (1 - n u), u the
    unit roundoff of the loss's dtype; Higham §3.1), so the difference of two, over 2 eps,
    by γ_terms * scale / eps. Truncation (eps² f''' / 6) is measured, not assumed: the
    central differences at eps and 2 eps differ by 3 times it; their whole difference is
    taken (a factor 3 for the higher-order terms and that difference's own rounding).

    Args:
      terms: the longest chain of additions in the loss (for an MLP's mean cross-entropy:
        input width + batch + classes).
      scale: what the rounding is relative to: for a mean cross-entropy, the loss plus
        twice its largest |logit| (a logit's error moves its example's loss at most twice).
    """
    if eps <= 0 or terms < 1 or scale < 0:
        raise ValueError(f"need eps > 0, terms >= 1, scale >= 0; got {eps}, {terms}, {scale}")
    dtype = jax.tree.leaves(params)[0].dtype
    u = float(jnp.finfo(dtype).eps) / 2
    if terms * u >= 1:
        raise ValueError(f"{terms} terms: the rounding bound is void in {dtype} (n u >= 1)")
    rounding = terms * u / (1 - terms * u) * scale / eps
    at = lambda step: finite_difference(loss_fn, params, path, index, eps=step)
    return rounding + abs(at(2 * eps) - at(eps))


def _check_examples(x, y) -> None:
    """x (B, ...) and y (B, ...) must hold the same B >= 1 examples."""
    if jnp.ndim(x) < 1 or jnp.ndim(y) < 1 or jnp.shape(x)[0] != jnp.shape(y)[0]:
        raise ValueError(
            f"x {jnp.shape(x)} and y {jnp.shape(y)} must share a leading axis of B examples"
        )
    if jnp.shape(x)[0] == 0:
        raise ValueError(f"x {jnp.shape(x)} holds no examples")


def per_example_grads(loss_fn, params, x, y):
    """Each example's gradient of `loss_fn`, by `jax.vmap` over one example's gradient.

    Args:
      loss_fn: the loss of ONE example, loss_fn(params, x_i, y_i) -> scalar.
      x: (B, D) inputs; y: (B,) labels.

    Returns:
      A tree like `params` whose every leaf has a leading B axis: leaf[i] is example i's.
    """
    _check_examples(x, y)
    # None: the one set of params is shared by every example; 0: x and y are split on axis 0.
    return jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))(params, x, y)


def per_example_grad_norms(example_grads) -> jax.Array:
    """(B,) each example's gradient norm: sqrt of its squares summed over every leaf."""
    leaves = jax.tree.leaves(example_grads)
    rows = {leaf.shape[:1] for leaf in leaves}
    if not leaves or len(rows) != 1 or rows == {()}:
        raise ValueError(
            f"every leaf needs the same leading B axis; shapes {[jnp.shape(g) for g in leaves]}"
        )
    squares = [jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1) for g in leaves]  # each (B,)
    return jnp.sqrt(sum(squares))


@functools.cache
def _one_example_grad(loss_fn):
    return jax.jit(jax.grad(loss_fn))  # one compiled program per loss, kept across calls


def looped_grads(loss_fn, params, x, y):
    """The same as `per_example_grads`, one example at a time: a Python loop of B calls of
    a jitted one-example gradient, stacked."""
    _check_examples(x, y)
    grad_one = _one_example_grad(loss_fn)
    rows = [grad_one(params, x[i], y[i]) for i in range(x.shape[0])]
    return jax.tree.map(lambda *leaf: jnp.stack(leaf), *rows)  # each leaf (B, ...)
