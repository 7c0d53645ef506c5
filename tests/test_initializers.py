import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from jaxloops.initializers import init_mlp_per_layer

SIZES = (61, 257, 11)  # odd, distinct widths: a transposed layer cannot pass
# The per-layer draw as one program per widths: eagerly, each draw and scale compiles alone.
per_layer = jax.jit(init_mlp_per_layer, static_argnums=1)


def scale_agrees(params, sizes, gain_squared: float = 2.0) -> bool:
    """Each layer's weight std is sqrt(gain_squared / fan_in) within 5 sampling sd."""
    for i, fan_in in enumerate(sizes[:-1]):
        w = np.asarray(params[f"dense_{i}"]["w"])
        expected, sd = np.sqrt(gain_squared / fan_in), 1 / np.sqrt(2 * w.size)  # relative sd
        if abs(w.std() / expected - 1) > 5 * sd:
            return False
    return True


def test_the_per_layer_initialiser_draws_he_weights_and_zero_biases(key):
    params = per_layer(key, SIZES)
    shapes = jax.tree.map(jnp.shape, params)
    assert shapes == jax.tree.map(jnp.shape, jaxloops.init_mlp(key, SIZES))
    assert shapes["dense_0"] == {"w": (61, 257), "b": (257,)}
    assert all(not np.asarray(layer["b"]).any() for layer in params.values())
    assert scale_agrees(params, SIZES)
    # A check that can fail: unit-variance weights (gain 1, not sqrt 2) are rejected.
    assert not scale_agrees(params, SIZES, gain_squared=1.0)
    # One key per layer: two layers of the same shape get different values.
    twin = per_layer(key, (13, 13, 13))
    assert not np.array_equal(twin["dense_0"]["w"], twin["dense_1"]["w"])


def test_init_mlp_has_the_same_scale_as_the_per_layer_draw(key):
    assert scale_agrees(jaxloops.init_mlp(key, SIZES), SIZES)


def test_the_per_layer_initialiser_refuses_a_single_width(key):
    with pytest.raises(ValueError, match=r"\(64,\)"):
        init_mlp_per_layer(key, (64,))
