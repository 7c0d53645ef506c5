"""A small MLP on a dict pytree: init, logits and its loss."""

import functools
import math

import jax
import jax.numpy as jnp

from jaxloops.data import Batch
from jaxloops.dropout import check_rate, dropout
from jaxloops.initializers import draw_normal
from jaxloops.losses import accuracy, cross_entropy

Params = dict[str, dict[str, jax.Array]]


def init_mlp(key: jax.Array, sizes: tuple[int, ...]) -> Params:
    """He-initialised dense layers: {"dense_0": {"w": (F_0, F_1), "b": (F_1,)}, ...}.

    Args:
      key: a PRNG key.
      sizes: layer widths from input to output, e.g. (64, 256, 256, 10); a tuple of ints,
        static under jit: one compiled initialiser per architecture.
    """
    if not isinstance(sizes, tuple) or not all(isinstance(s, int) for s in sizes):
        raise ValueError(f"sizes {sizes!r} must be a tuple of ints, e.g. (64, 256, 10)")
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"sizes {sizes} need at least an input and an output width >= 1")
    return _init_layers(key, sizes)


@functools.partial(jax.jit, static_argnames="sizes")
def _init_layers(key: jax.Array, sizes: tuple[int, ...]) -> Params:
    # He initialisation: w ~ N(0, 2 / fan_in), all layers cut from one normal sample.
    spec = {
        f"dense_{i}": {"w": ((fan_in, fan_out), fan_in, math.sqrt(2.0))}
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:]))
    }
    params = draw_normal(key, spec)
    for i, fan_out in enumerate(sizes[1:]):
        params[f"dense_{i}"]["b"] = jnp.zeros((fan_out,))
    return params


def mlp_logits(
    params: Params, x: jax.Array, key: jax.Array | None = None, dropout_rate: float = 0.0
) -> jax.Array:
    """Logits (B, C) of inputs x (B, F_in): ReLU between layers, none after the last.

    With a `key`, dropout at `dropout_rate` follows every hidden ReLU, layer i drawing from
    `fold_in(key, i)` (training); without one there is none (evaluation, deterministic).
    """
    check_rate(dropout_rate)
    layers = [params[f"dense_{i}"] for i in range(len(params))]
    if x.ndim != 2 or x.shape[1] != layers[0]["w"].shape[0]:
        raise ValueError(
            f"inputs have shape {x.shape}; the first layer expects (B, {layers[0]['w'].shape[0]})"
        )
    # Biases (F,) broadcast over the batch explicitly: the tests forbid implicit rank promotion.
    for i, layer in enumerate(layers[:-1]):
        x = jax.nn.relu(x @ layer["w"] + layer["b"][None, :])  # (B, F_i) -> (B, F_{i+1})
        if key is not None:
            x = dropout(x, dropout_rate, jax.random.fold_in(key, i))
    return x @ layers[-1]["w"] + layers[-1]["b"][None, :]  # (B, F) -> (B, C)


def mlp_loss(
    params: Params, batch: Batch, key: jax.Array | None = None, dropout_rate: float = 0.0
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross-entropy of the MLP on a batch, with accuracy as an auxiliary metric.

    `key` and `dropout_rate` as in `mlp_logits`: pass a key only when training.
    """
    logits = mlp_logits(params, batch.x, key, dropout_rate)
    return cross_entropy(logits, batch.y), {"accuracy": accuracy(logits, batch.y)}
