import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from conftest import normal
from jaxloops import online_attention, rounding
from jaxloops.attention import attention_rounding_bound


def qkv(t=12, s=15, heads=3, head_dim=7, batch=2):
    return (
        normal((batch, t, heads, head_dim), 1),
        normal((batch, s, heads, head_dim), 2),
        normal((batch, s, heads, head_dim), 3),
    )


def bound(query, key, value):
    """This backend's float32 rounding bound for attention (`attention_rounding_bound`)."""
    eps = rounding.backend_eps(rounding.ATTENTION)
    return attention_rounding_bound(query, key, np.abs(value).max(), eps=eps)


@pytest.mark.parametrize("block_size", [1, 3, 5, 15])
def test_scan_attention_equals_jax_and_naive(block_size):
    query, key, value = qkv()
    got = np.asarray(online_attention.scan_attention(query, key, value, block_size=block_size))
    assert got.shape == query.shape
    tolerance = bound(query, key, value)
    for expected in (
        jax.nn.dot_product_attention(query, key, value),
        jaxloops.attention(query, key, value),
    ):
        assert np.abs(got - np.asarray(expected)).max() <= tolerance


def forgetful_step(carry, scores, value_block):
    """The online-softmax step with one rescale forgotten: the running output is not brought
    to the new maximum's units (exp(old max - new max)); the sum still is."""
    running_max, running_sum, out = carry
    new_max = jnp.maximum(running_max, scores.max(axis=-1))
    correction = jnp.exp(running_max - new_max)
    weights = jnp.exp(scores - new_max[..., None])
    new_sum = running_sum * correction + weights.sum(axis=-1)
    return new_max, new_sum, out + jnp.einsum("...RS,...SH->...RH", weights, value_block)


def test_a_step_that_forgets_to_rescale_the_output_is_rejected(monkeypatch):
    query, key, value = qkv()
    expected = np.asarray(jaxloops.attention(query, key, value))
    tolerance = bound(query, key, value)
    # Un-jitted (`__wrapped__`), so the patched step is traced rather than a cached program run.
    right = online_attention.scan_attention.__wrapped__(query, key, value, block_size=3)
    assert np.abs(np.asarray(right) - expected).max() <= tolerance
    monkeypatch.setattr(online_attention, "online_softmax_step", forgetful_step)
    wrong = online_attention.scan_attention.__wrapped__(query, key, value, block_size=3)
    assert np.abs(np.asarray(wrong) - expected).max() > 1000 * tolerance


def test_one_block_is_plain_softmax_attention():
    query, key, value = qkv(t=4, s=6)
    got = online_attention.scan_attention(query, key, value, block_size=6)
    scores = np.einsum("BTNH,BSNH->BNTS", query, key) / np.sqrt(7)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = np.einsum("BNTS,BSNH->BTNH", weights, value)
    assert np.abs(np.asarray(got) - expected).max() <= bound(query, key, value)


@pytest.mark.parametrize(
    ("shapes", "block_size", "named"),
    [
        (((2, 12, 3, 7), (2, 15, 3, 7), (2, 15, 3, 7)), 4, "block_size 4"),
        (((2, 12, 3, 7), (2, 15, 3, 7), (2, 15, 3, 7)), 0, "block_size 0"),
        (((2, 12, 3, 7), (2, 15, 5, 7), (2, 15, 5, 7)), 5, "(2, 15, 5, 7)"),
        (((2, 12, 3, 7), (2, 15, 3, 7), (2, 13, 3, 7)), 5, "(2, 13, 3, 7)"),
    ],
)
def test_bad_shapes_and_blocks_are_refused(shapes, block_size, named):
    arrays = [np.zeros(s, np.float32) for s in shapes]
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        online_attention.scan_attention(*arrays, block_size=block_size)
