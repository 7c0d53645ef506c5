"""Random initial weights: an MLP's layers as a reader writes them, one key per layer, and
the one-sample draw every model of the book uses (`draw_normal`)."""

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
    # The barrier keeps the sample one kernel on every backend: without it XLA's TPU compiler
    # copied the random-number code into 10 of the leaves' kernels, and compiling chapter
    # 11's initialiser took 41 s, not 6. The numbers are the same.
    flat = jax.lax.optimization_barrier(jax.random.normal(key, (sum(sizes),)))  # (total,)
    pieces = jnp.split(flat, list(itertools.accumulate(sizes))[:-1])
    return treedef.unflatten(
        [
            gain / math.sqrt(fan_in) * piece.reshape(shape)  # (total,) -> shape
            for piece, (shape, fan_in, gain) in zip(pieces, leaves)
        ]
    )


def init_mlp_per_layer(key: jax.Array, sizes: tuple[int, ...]) -> dict:
    """He-initialised dense layers, w ~ N(0, 2 / fan_in) and b = 0, one key per layer:
    {"dense_0": {"w": (F_0, F_1), "b": (F_1,)}, ...} for widths `sizes`, input to output.

    The same distribution as `jaxloops.init_mlp`, which cuts every layer from one sample
    (`draw_normal`) instead, so its values differ.
    """
    if len(sizes) < 2:
        raise ValueError(f"sizes {sizes} need at least an input and an output width")
    keys = jax.random.split(key, len(sizes) - 1)  # one independent key per layer
    return {
        f"dense_{i}": {
            "w": jax.random.normal(k, (fan_in, fan_out)) * math.sqrt(2.0 / fan_in),
            "b": jnp.zeros((fan_out,)),
        }
        for i, (k, fan_in, fan_out) in enumerate(zip(keys, sizes[:-1], sizes[1:]))
    }
