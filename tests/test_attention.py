import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops

# Odd, distinct sizes: B, T, S, N, H; K varies per test.
B, T, S, N, H = 3, 7, 11, 6, 5


def normal(shape, seed=0, dtype=jnp.float32):
    """Standard-normal test data from NumPy (no sampler to compile per shape)."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32), dtype)


def qkv(kv_heads, t=T, s=S, dtype=jnp.float32):
    return (normal((B, t, N, H), 1, dtype), normal((B, s, kv_heads, H), 2, dtype),
            normal((B, s, kv_heads, H), 3, dtype))


@pytest.mark.parametrize("kv_heads", [6, 3, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_naive_equals_jax(kv_heads, is_causal):
    query, key_, value = qkv(kv_heads)
    expected = jax.jit(jax.nn.dot_product_attention, static_argnames="is_causal")(
        query, key_, value, is_causal=is_causal)
    got = jaxloops.attention(query, key_, value, is_causal=is_causal)
    np.testing.assert_allclose(got, expected, atol=2e-6)


def test_boolean_mask_equals_jax():
    query, key_, value = qkv(3)
    mask = normal((B, N, T, S), 4) > -0.3
    row_mask = normal((1, 1, 1, S), 5) > -0.3
    for m in (mask, row_mask):
        expected = jax.jit(jax.nn.dot_product_attention)(query, key_, value, mask=m)
        np.testing.assert_allclose(jaxloops.attention(query, key_, value, mask=m), expected,
                                   atol=2e-6)


def test_bfloat16_matches_jax():
    query, key_, value = qkv(3, dtype=jnp.bfloat16)
    got = jaxloops.attention(query, key_, value)
    expected = jax.jit(jax.nn.dot_product_attention)(query, key_, value)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(got.astype(jnp.float32), expected.astype(jnp.float32), atol=1e-2)


def test_gqa_with_k_equal_n_is_mha():
    # MHA written head by head, the way the original paper has it.
    query, key_, value = qkv(N)
    scores = jnp.einsum("BTNH,BSNH->BNTS", query, key_) / np.sqrt(H)  # (B, N, T, S)
    mha = jnp.einsum("BNTS,BSNH->BTNH", jax.nn.softmax(scores, axis=-1), value)  # (B, T, N, H)
    np.testing.assert_allclose(jaxloops.attention(query, key_, value), mha, atol=2e-6)


def test_gqa_equals_mha_with_repeated_kv_heads():
    query, key_, value = qkv(2)
    repeat = lambda x: jnp.repeat(x, N // 2, axis=2)  # (B, S, N, H): head n reads n // G
    np.testing.assert_allclose(jaxloops.attention(query, key_, value),
                               jaxloops.attention(query, repeat(key_), repeat(value)), atol=2e-6)


def test_output_shape_is_the_same_for_mha_gqa_mqa():
    shapes = {k: jaxloops.attention(*qkv(k)).shape for k in (6, 3, 2, 1)}
    assert set(shapes.values()) == {(B, T, N, H)}


def test_causal_output_ignores_the_future():
    query, key_, value = qkv(3, s=T)
    t = 4
    later = normal((B, T - t - 1, 3, H), 6)
    changed_key = key_.at[:, t + 1:].set(later)
    changed_value = value.at[:, t + 1:].set(2 * later)
    changed_query = query.at[:, t + 1:].set(0.0)
    before = jaxloops.attention(query, key_, value, is_causal=True)
    after = jaxloops.attention(changed_query, changed_key, changed_value, is_causal=True)
    np.testing.assert_array_equal(after[:, :t + 1], before[:, :t + 1])
    assert not np.allclose(after[:, t + 1:], before[:, t + 1:])


def test_is_causal_is_the_top_left_mask():
    query, key_, value = qkv(3)
    explicit = jaxloops.attention(query, key_, value, mask=jaxloops.causal_mask(T, S))
    np.testing.assert_allclose(jaxloops.attention(query, key_, value, is_causal=True), explicit,
                               atol=1e-6)


def test_causal_mask_offset_aligns_bottom_right():
    mask = np.asarray(jaxloops.causal_mask(3, 7, offset=4))
    np.testing.assert_array_equal(mask.sum(axis=1), [5, 6, 7])
    np.testing.assert_array_equal(np.asarray(jaxloops.causal_mask(3, 7)).sum(axis=1), [1, 2, 3])


@pytest.mark.parametrize("shapes, message", [
    (((B, T, N, H), (B, S, 4, H), (B, S, 4, H)), r"6 heads, key/value has 4.*\(3, 11, 4, 5\)"),
    (((B, T, N, H), (B, S, 3, 7), (B, S, 3, 7)), r"head dim 5 != key/value head dim 7"),
    (((T, N, H), (B, S, 3, H), (B, S, 3, H)), r"query must have rank 4.*\(7, 6, 5\)"),
    (((B, T, N, H), (5, S, 3, H), (5, S, 3, H)), r"batch 3, key/value have batch 5"),
    (((B, T, N, H), (B, S, 3, H), (B, 13, 3, H)), r"key \(3, 11, 3, 5\), value \(3, 13, 3, 5\)"),
])
def test_bad_shapes_raise_naming_them(shapes, message):
    query, key_, value = (jnp.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        jaxloops.attention(query, key_, value)


def test_bad_masks_raise():
    query, key_, value = jnp.zeros((B, T, N, H)), jnp.zeros((B, S, 3, H)), jnp.zeros((B, S, 3, H))
    with pytest.raises(ValueError, match=r"mask shape \(7, 7\) does not broadcast"):
        jaxloops.attention(query, key_, value, mask=jnp.ones((T, T), bool))
    with pytest.raises(ValueError, match="mask must be boolean"):
        jaxloops.attention(query, key_, value, mask=jnp.ones((T, S)))
