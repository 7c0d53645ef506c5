import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from conftest import normal
from jaxloops import rounding

# Odd, distinct sizes: B, T, S, N, H; K varies per test. Data and references are NumPy,
# so that the only programs compiled are the ones under test.
B, T, S, N, H = 3, 7, 11, 6, 5
library_attention = jax.jit(jax.nn.dot_product_attention, static_argnames="is_causal")


def within_rounding(got, expected, query, key, value):
    """Equal up to float32 rounding (`attention_rounding_bound`, derived, not fitted)."""
    from jaxloops.attention import attention_rounding_bound

    bound = attention_rounding_bound(query, key, np.abs(np.asarray(value, np.float32)).max())
    np.testing.assert_allclose(got, expected, rtol=0, atol=bound)


def qkv(kv_heads, t=T, s=S, dtype=np.float32):
    return (
        normal((B, t, N, H), 1, dtype),
        normal((B, s, kv_heads, H), 2, dtype),
        normal((B, s, kv_heads, H), 3, dtype),
    )


@pytest.mark.parametrize("kv_heads", [6, 3, 1], ids=["MHA", "GQA", "MQA"])
def test_naive_equals_jax_full_and_causal(kv_heads):
    @jax.jit  # one program for all four outputs: one compile instead of four
    def pairs(query, key, value):
        return [
            (
                jaxloops.attention(query, key, value, is_causal=causal),
                jax.nn.dot_product_attention(query, key, value, is_causal=causal),
            )
            for causal in (False, True)
        ]

    for got, expected in pairs(*qkv(kv_heads)):
        within_rounding(got, expected, *qkv(kv_heads))


def test_boolean_masks_equal_jax():
    full_mask = normal((B, N, T, S), 4) > -0.3  # (B, N, T, S)
    key_mask = normal((1, 1, 1, S), 5) > -0.3  # broadcast over B, N and T

    @jax.jit
    def pairs(query, key, value):
        return [
            (
                jaxloops.attention(query, key, value, mask=mask),
                jax.nn.dot_product_attention(query, key, value, mask=mask),
            )
            for mask in (full_mask, key_mask)
        ]

    for got, expected in pairs(*qkv(3)):
        within_rounding(got, expected, *qkv(3))


def test_bfloat16_matches_jax():
    query, key, value = qkv(3, dtype=jnp.bfloat16)
    got = jaxloops.attention(query, key, value)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(got, np.float32),
        np.asarray(library_attention(query, key, value), np.float32),
        atol=1e-2,
    )


def test_gqa_with_k_equal_n_is_mha():
    # MHA written head by head, in float64 NumPy, the way the original paper has it.
    query, key, value = (x.astype(np.float64) for x in qkv(N))
    scores = np.einsum("BTNH,BSNH->BNTS", query, key) / np.sqrt(H)  # (B, N, T, S)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    mha = np.einsum("BNTS,BSNH->BTNH", weights, value)  # (B, T, N, H)
    within_rounding(jaxloops.attention(*qkv(N)), mha, *qkv(N))


def test_gqa_equals_mha_with_repeated_kv_heads():
    query, key, value = qkv(2)
    # (B, S, N, H): query head n reads key/value head n // G, G = 3
    repeat = lambda x: np.repeat(x, N // 2, axis=2)
    within_rounding(
        jaxloops.attention(query, key, value),
        jaxloops.attention(query, repeat(key), repeat(value)),
        query,
        key,
        value,
    )


def test_output_shape_is_the_same_for_mha_gqa_mqa():
    # eval_shape traces without compiling: the shape is decided at trace time.
    shapes = {k: jax.eval_shape(jaxloops.attention, *qkv(k)).shape for k in (6, 3, 2, 1)}
    assert shapes == {6: (B, T, N, H), 3: (B, T, N, H), 2: (B, T, N, H), 1: (B, T, N, H)}


def test_causal_output_ignores_the_future():
    query, key, value = qkv(3, s=T)
    t = 4
    later = normal((B, T - t - 1, 3, H), 6)
    change = lambda x, new: np.concatenate([x[:, : t + 1], new], axis=1)
    before = np.asarray(jaxloops.attention(query, key, value, is_causal=True))
    after = np.asarray(
        jaxloops.attention(
            change(query, 0 * query[:, t + 1 :]),
            change(key, later),
            change(value, 2 * later),
            is_causal=True,
        )
    )
    np.testing.assert_array_equal(after[:, : t + 1], before[:, : t + 1])
    assert np.abs(after[:, t + 1 :] - before[:, t + 1 :]).max() > 0.1


def test_is_causal_is_the_top_left_mask():
    query, key, value = qkv(3)
    explicit = jaxloops.attention(query, key, value, mask=np.tril(np.ones((T, S), bool)))
    within_rounding(
        jaxloops.attention(query, key, value, is_causal=True), explicit, query, key, value
    )


def test_causal_mask_offset_aligns_bottom_right():
    # Sizes and offset static, as in an eager call: one program per mask, not per operation.
    causal_mask = jax.jit(jaxloops.causal_mask, static_argnums=(0, 1), static_argnames="offset")
    bottom_right = np.asarray(causal_mask(3, 7, offset=4))
    np.testing.assert_array_equal(bottom_right, np.tril(np.ones((3, 7), bool), k=4))
    np.testing.assert_array_equal(np.asarray(causal_mask(3, 7)).sum(axis=1), [1, 2, 3])


@pytest.mark.parametrize(
    "shapes, message",
    [
        (((B, T, N, H), (B, S, 4, H), (B, S, 4, H)), r"6 heads, key/value has 4.*\(3, 11, 4, 5\)"),
        (((B, T, N, H), (B, S, 3, 7), (B, S, 3, 7)), r"head dim 5 != key/value head dim 7"),
        (((T, N, H), (B, S, 3, H), (B, S, 3, H)), r"query must have rank 4.*\(7, 6, 5\)"),
        (((B, T, N, H), (5, S, 3, H), (5, S, 3, H)), r"batch 3, key/value have batch 5"),
        (
            ((B, T, N, H), (B, S, 3, H), (B, 13, 3, H)),
            r"key \(3, 11, 3, 5\), value \(3, 13, 3, 5\)",
        ),
    ],
)
def test_bad_shapes_raise_naming_them(shapes, message):
    query, key, value = (np.zeros(s, np.float32) for s in shapes)
    with pytest.raises(ValueError, match=message):
        jaxloops.attention(query, key, value)


def test_bad_masks_raise():
    query, key, value = qkv(3)
    with pytest.raises(ValueError, match=r"mask shape \(7, 7\) does not broadcast"):
        jaxloops.attention(query, key, value, mask=np.ones((T, T), bool))
    with pytest.raises(ValueError, match="mask must be boolean"):
        jaxloops.attention(query, key, value, mask=np.ones((T, S), np.float32))


@pytest.mark.parametrize("name, position", [("query", 0), ("key", 1), ("value", 2)])
def test_integer_inputs_raise_naming_them(name, position):
    arrays = list(qkv(3))
    arrays[position] = np.ones(arrays[position].shape, np.int32)
    with pytest.raises(ValueError, match=f"{name} must be floating point, got int32"):
        jaxloops.attention(*arrays)


def test_empty_lengths_raise_naming_the_shape():
    query, key, value = qkv(3)
    with pytest.raises(ValueError, match=r"query \(3, 0, 6, 5\) has an empty axis"):
        jaxloops.attention(query[:, :0], key, value)
    with pytest.raises(ValueError, match=r"key \(3, 0, 3, 5\) has an empty axis"):
        jaxloops.attention(query, key[:, :0], value[:, :0])


def _misses(got, expected, bound) -> float:
    """How many rounding bounds apart two answers are (<= 1: rounding explains it)."""
    return (
        float(np.abs(np.asarray(got, np.float64) - np.asarray(expected, np.float64)).max()) / bound
    )


@pytest.mark.parametrize("kv_heads, is_causal", [(6, True), (2, False), (1, True)])
def test_blockwise_equals_naive_within_float32_rounding_and_a_wrong_answer_is_rejected(
    kv_heads, is_causal
):
    from jaxloops.attention import attention_rounding_bound

    t, s = (13, 13) if is_causal else (9, 13)
    query, key, value = qkv(kv_heads, t, s)
    weights = normal((B, t, N, H), 4)  # a loss that weighs every output differently
    blockwise = lambda q, k, v: jaxloops.blockwise_attention(
        q, k, v, is_causal=is_causal, block_size=4, parallel_blocks=2
    )
    naive = lambda q, k, v: jaxloops.attention(q, k, v, is_causal=is_causal)

    @jax.jit
    def out_and_grads(q, k, v):
        def of(fn):
            loss = lambda q, k, v: (fn(q, k, v) * weights).sum()
            return fn(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

        # A wrong answer to compare with: values shifted by one position against their keys
        # (what an off-by-one between a key block's offset and its value block's computes).
        shifted = naive(q, k, jnp.roll(v, 1, axis=1))
        return of(blockwise), of(naive), shifted

    (got, got_grads), (expected, expected_grads), shifted = out_and_grads(query, key, value)
    out_bound = attention_rounding_bound(query, key, np.abs(value).max())
    # Blockwise's backward recomputes the weights from the log-sum-exp it saved: log's error.
    grad_eps = rounding.backend_eps((*rounding.ATTENTION, "log"))
    assert _misses(got, expected, out_bound) <= 1
    assert _misses(shifted, expected, out_bound) > 100  # shifted positions: rejected
    for name, g, e in zip("qkv", got_grads, expected_grads):
        g, e = np.asarray(g), np.asarray(e)  # the wrong answers made in NumPy: no programs
        grad_bound = attention_rounding_bound(query, key, np.abs(e).max(), eps=grad_eps)
        assert _misses(g, e, grad_bound) <= 1, f"d{name}"
        assert _misses(-g, e, grad_bound) > 100, f"d{name} sign-flipped is rejected"
        assert _misses(np.zeros_like(g), e, grad_bound) > 100, f"d{name} zeroed is rejected"


def test_the_rounding_bound_is_eps_times_sqrt_s_and_the_score_size():
    from jaxloops.attention import attention_rounding_bound

    query, key = np.ones((1, 1, 1, 4), np.float32), np.full((1, 9, 1, 4), 0.5, np.float32)
    # A = sum_h |q k| / sqrt(H) = 4 * 0.5 / 2 = 1; sqrt(S) = 3; scale 2.
    eps = float(jnp.finfo(jnp.float32).eps)
    bound = attention_rounding_bound(query, key, 2.0, eps=eps)
    assert bound == pytest.approx(2 * eps * 2 * (1 + 3 + 1))
    # By default eps is this backend's in an attention's operations (float32's on a CPU;
    # more where it rounds worse).
    backend = rounding.backend_eps(rounding.ATTENTION)
    assert backend >= eps
    assert attention_rounding_bound(query, key, 2.0) == pytest.approx(bound * backend / eps)
    # A Python float, so a page can glue it (a NumPy scalar glues with a Sphinx warning).
    assert type(attention_rounding_bound(query, key, 2.0)) is float


@pytest.mark.parametrize("T, S", [(0, 5), (3, 0), (-2, 4)])
def test_an_empty_causal_mask_is_refused(T, S):
    with pytest.raises(ValueError, match=f"T and S must be >= 1, got T = {T}, S = {S}"):
        jaxloops.causal_mask(T, S)
