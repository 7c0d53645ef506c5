"""Random initial weights for every model of the book, from one normal sample."""

import itertools
import math

import jax
import jax.numpy as jnp


def draw_normal(key: jax.Array, spec):
    """N(0, gain^2 / fan_in) arrays for a tree whose leaves are (shape, fan_in, gain).

    All leaves are cut from one normal sample: one random-number kernel rather than one per
    leaf, which XLA compiles in a fraction of the time on a CPU.
    """
    is_spec = lambda leaf: isinstance(leaf, tuple) and isinstance(leaf[0], tuple)
    leaves, treedef = jax.tree.flatten(spec, is_leaf=is_spec)
    sizes = [math.prod(shape) for shape, _, _ in leaves]
    flat = jax.random.normal(key, (sum(sizes),))  # (total,)
    pieces = jnp.split(flat, list(itertools.accumulate(sizes))[:-1])
    return treedef.unflatten(
        [
            gain / math.sqrt(fan_in) * piece.reshape(shape)  # (total,) -> shape
            for piece, (shape, fan_in, gain) in zip(pieces, leaves)
        ]
    )
