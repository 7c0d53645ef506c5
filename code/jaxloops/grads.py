"""Gradients by hand and by autodiff: one SGD update, and a finite-difference check."""

import jax


def sgd_update(params, grads, learning_rate: float):
    """One plain SGD step, leaf by leaf: p <- p - lr * g."""
    return jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)


def finite_difference(loss_fn, params, path: tuple, index: tuple, eps: float = 1e-3) -> float:
    """Central difference (f(p + eps) - f(p - eps)) / (2 eps) of one parameter entry.

    Args:
      loss_fn: scalar function of params.
      path: keys to the leaf, e.g. ("dense_0", "w").
      index: the entry inside that leaf, e.g. (3, 5).
    """

    leaves = {
        tuple(getattr(k, "key", k) for k in key_path): leaf
        for key_path, leaf in jax.tree_util.tree_leaves_with_path(params)
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

        return loss_fn(jax.tree_util.tree_map_with_path(bump, params))

    return float((bumped(eps) - bumped(-eps)) / (2 * eps))
