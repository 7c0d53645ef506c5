import jax
import numpy as np
import pytest

import jaxloops


def normal(shape, seed=0):
    """Standard-normal test data from NumPy (no sampler to compile per shape)."""
    return np.random.default_rng(seed).standard_normal(shape, np.float32)


def qkv(t, s, heads, kv_heads, head_dim=5, batch=3):
    return (
        normal((batch, t, heads, head_dim), 1),
        normal((batch, s, kv_heads, head_dim), 2),
        normal((batch, s, kv_heads, head_dim), 3),
    )


# T and S are not multiples of the block; T > S and T < S; 16 is bigger than both.
@pytest.mark.parametrize(
    "t, s, kv_heads, block_size, is_causal",
    [
        (13, 11, 3, 4, True),
        (9, 13, 6, 3, False),
        (11, 7, 1, 16, True),
    ],
)
def test_blockwise_equals_naive(t, s, kv_heads, block_size, is_causal):
    query, key, value = qkv(t, s, 6, kv_heads)
    expected = jaxloops.attention(query, key, value, is_causal=is_causal)
    got = jaxloops.blockwise_attention(
        query, key, value, is_causal=is_causal, block_size=block_size
    )
    np.testing.assert_allclose(got, expected, atol=3e-6)


def test_online_softmax_over_two_blocks_equals_softmax():
    scores = 4.0 * normal((1, 1, 1, 3, 10), 1)  # (B, K, G, T, S)
    value = normal((1, 1, 10, 5), 2)  # (B, K, S, H)
    carry = (
        np.full((1, 1, 1, 3), -1e30, np.float32),
        np.zeros((1, 1, 1, 3), np.float32),
        np.zeros((1, 1, 1, 3, 5), np.float32),
    )

    @jax.jit
    def two_blocks(carry, scores, value):
        carry = jaxloops.online_softmax_step(carry, scores[..., :4], value[:, :, :4])
        return jaxloops.online_softmax_step(carry, scores[..., 4:], value[:, :, 4:])

    _, total, out = map(np.asarray, two_blocks(carry, scores, value))
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = np.einsum("BKGTS,BKSH->BKGTH", weights, value)  # (B, K, G, T, H)
    np.testing.assert_allclose(out / total[..., None], expected, atol=1e-6)


def test_bad_block_size_and_shapes_raise():
    query, key, value = qkv(7, 7, 6, 3)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        jaxloops.blockwise_attention(query, key, value, block_size=0)
    with pytest.raises(ValueError, match="6 heads, key/value has 4"):
        jaxloops.blockwise_attention(query, *qkv(7, 7, 6, 4)[1:])
