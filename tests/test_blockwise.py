import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops


def qkv(key, t, s, heads, kv_heads, head_dim=5, batch=3):
    q_key, k_key, v_key = jax.random.split(key, 3)
    return (jax.random.normal(q_key, (batch, t, heads, head_dim)),
            jax.random.normal(k_key, (batch, s, kv_heads, head_dim)),
            jax.random.normal(v_key, (batch, s, kv_heads, head_dim)))


# T and S are not multiples of the block; 16 is bigger than both (a single block).
@pytest.mark.parametrize("t, s, kv_heads, block_size, is_causal", [
    (13, 11, 3, 4, True),
    (13, 11, 1, 5, False),
    (9, 13, 6, 3, False),
    (11, 7, 2, 16, True),
])
def test_blockwise_equals_naive(key, t, s, kv_heads, block_size, is_causal):
    query, key_, value = qkv(key, t, s, 6, kv_heads)
    expected = jaxloops.attention(query, key_, value, is_causal=is_causal)
    got = jaxloops.blockwise_attention(query, key_, value, is_causal=is_causal,
                                       block_size=block_size)
    np.testing.assert_allclose(got, expected, atol=3e-6)


def test_online_softmax_over_two_blocks_equals_softmax(key):
    scores = 4.0 * jax.random.normal(key, (1, 1, 1, 3, 10))  # (B, K, G, T, S)
    value = jax.random.normal(jax.random.key(1), (1, 10, 1, 5))  # (B, S, K, H)
    carry = (jnp.full((1, 1, 1, 3), -1e30), jnp.zeros((1, 1, 1, 3)), jnp.zeros((1, 1, 1, 3, 5)))
    carry = jaxloops.online_softmax_step(carry, scores[..., :4], value[:, :4])
    _, total, out = jaxloops.online_softmax_step(carry, scores[..., 4:], value[:, 4:])
    expected = jnp.einsum("BKGTS,BSKH->BKGTH", jax.nn.softmax(scores, axis=-1), value)
    np.testing.assert_allclose(out / total[..., None], expected, atol=1e-6)


def test_bad_block_size_and_shapes_raise(key):
    query, key_, value = qkv(key, 7, 7, 6, 3)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        jaxloops.blockwise_attention(query, key_, value, block_size=0)
    with pytest.raises(ValueError, match="6 heads, key/value has 4"):
        jaxloops.blockwise_attention(query, *qkv(key, 7, 7, 6, 4)[1:])
