import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.layout import Layout

import jaxloops
from conftest import normal
from jaxloops import measure
from jaxloops.attention import attention_rounding_bound

# The tests of values call the step and the attention jitted: one program per shape, shared
# by every test below that has that shape, where an eager call compiles each of their dozens
# of operations. `start` is then traced: the tests of refusals by value call eagerly.
jit_decode_step = jax.jit(jaxloops.decode_step)
jit_decode_attention = jax.jit(jaxloops.decode_attention)


def within_rounding(got, expected, query, key, value):
    """Equal up to float32 rounding (`attention_rounding_bound`, derived, not fitted)."""
    bound = attention_rounding_bound(query, key, np.abs(np.asarray(value)).max())
    np.testing.assert_allclose(got, expected, rtol=0, atol=bound)


def test_llama2_7b_cache_is_two_gib_at_4096_tokens():
    # 2 * 32 layers * 32 heads * 128 * 4096 tokens * 2 bytes
    assert (
        jaxloops.kv_cache_bytes(
            layers=32, kv_heads=32, head_dim=128, length=4096, batch=1, bytes_per_element=2
        )
        == 2 * 2**30
    )


@pytest.mark.parametrize("kv_heads, dtype", [(7, jnp.float32), (3, jnp.bfloat16), (1, jnp.float16)])
def test_allocated_cache_bytes_equal_the_formula(kv_heads, dtype):
    cache = jaxloops.init_kv_cache(
        layers=3, batch=5, length=11, kv_heads=kv_heads, head_dim=9, dtype=dtype
    )
    expected = jaxloops.kv_cache_bytes(
        layers=3,
        kv_heads=kv_heads,
        head_dim=9,
        length=11,
        batch=5,
        bytes_per_element=jnp.dtype(dtype).itemsize,
    )
    assert len(cache) == 3  # one {"key", "value"} per layer
    assert cache[2]["key"].shape == cache[2]["value"].shape == (5, kv_heads, 11, 9)  # (B, K, S, H)
    leaves = jax.tree.leaves(cache)
    assert sum(leaf.nbytes for leaf in leaves) == expected
    # What the device allocates: the formula's arrays as their layout stores them (a CPU:
    # the same bytes; a TPU: the minor-most dims padded to its tiles).
    laid_out = [measure.laid_out_bytes(leaf.shape, dtype, leaf.format.layout) for leaf in leaves]
    assert measure.allocated_bytes(cache) == sum(laid_out)


def test_laid_out_bytes_pad_the_minor_dims_to_the_first_tile():
    shape = (5, 7, 11, 9)  # (B, K, S, H)
    assert measure.laid_out_bytes(shape, jnp.float32, Layout((0, 1, 2, 3), ())) == 4 * 3465
    # The layout a TPU v5e gave the float32 cache above (1,105,920 bytes for its 6 arrays):
    # K and S minor-most, in tiles of 8 sublanes by 128 lanes.
    tpu = Layout((0, 3, 1, 2), ((8, 128),))
    assert measure.laid_out_bytes(shape, jnp.float32, tpu) == 5 * 9 * 8 * 128 * 4 == 1105920 // 6
    # A second tile subdivides the first (bfloat16's pairs): no more padding.
    bf16 = Layout((0, 3, 1, 2), ((8, 128), (2, 1)))
    assert measure.laid_out_bytes(shape, jnp.bfloat16, bf16) == 5 * 9 * 8 * 128 * 2
    # A tile longer than the rank pads the missing dims too: a vector fills a whole tile.
    assert measure.laid_out_bytes((7,), jnp.float32, Layout((0,), ((8, 128),))) == 4096


def test_cache_refuses_a_zero_size():
    with pytest.raises(ValueError, match="length=0"):
        jaxloops.init_kv_cache(layers=2, batch=1, length=0, kv_heads=1, head_dim=4)


def test_attention_kind():
    assert [jaxloops.attention_kind(8, k) for k in (8, 2, 1)] == ["MHA", "GQA", "MQA"]
    with pytest.raises(ValueError, match="8 query heads is not a multiple of 3"):
        jaxloops.attention_kind(8, 3)


@pytest.mark.parametrize("kv_heads", [6, 2], ids=["MHA", "GQA"])
def test_decoding_token_by_token_equals_causal_attention(kv_heads):
    batch, length, heads, head_dim, slots = 3, 7, 6, 5, 11
    query = normal((batch, length, heads, head_dim), 1)
    key_ = normal((batch, length, kv_heads, head_dim), 2)
    value = normal((batch, length, kv_heads, head_dim), 3)
    cache_key = cache_value = np.zeros((batch, kv_heads, slots, head_dim), np.float32)
    outputs = []
    for t in range(length):
        out, cache_key, cache_value = jit_decode_step(
            query[:, t : t + 1], key_[:, t : t + 1], value[:, t : t + 1], cache_key, cache_value, t
        )
        outputs.append(out)
    expected = jaxloops.attention(query, key_, value, is_causal=True)
    within_rounding(np.concatenate(outputs, axis=1), expected, query, key_, value)


def test_decode_step_rejects_a_mismatched_token():
    cache_key = np.zeros((3, 2, 11, 5), np.float32)  # (B, K, S, H)
    with pytest.raises(ValueError, match=r"\(B, T, K, H\) = \(3, 1, 2, 5\)"):
        jaxloops.decode_step(
            np.zeros((3, 1, 6, 5)),
            np.zeros((3, 1, 3, 5)),
            np.zeros((3, 1, 3, 5)),
            cache_key,
            cache_key,
            0,
        )


def test_decode_attention_rejects_a_cache_that_does_not_fit():
    message = r"query \(3, 1, 6, 5\) .* does not fit cache \(3, 4, 11, 5\)"
    with pytest.raises(ValueError, match=message):
        jaxloops.decode_attention(
            np.zeros((3, 1, 6, 5)), np.zeros((3, 4, 11, 5)), np.zeros((3, 4, 11, 5)), 4
        )


@pytest.mark.parametrize("kv_heads", [6, 3, 1], ids=["MHA", "GQA", "MQA"])
def test_prefill_then_steps_equal_causal_attention(kv_heads):
    batch, length, heads, head_dim, slots, prefill = 3, 7, 6, 5, 11, 4
    query = normal((batch, length, heads, head_dim), 4)
    key_ = normal((batch, length, kv_heads, head_dim), 5)
    value = normal((batch, length, kv_heads, head_dim), 6)
    (layer,) = jaxloops.init_kv_cache(
        layers=1,
        batch=batch,
        length=slots,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=jnp.float32,
    )
    out, cache_key, cache_value = jit_decode_step(
        query[:, :prefill], key_[:, :prefill], value[:, :prefill], layer["key"], layer["value"], 0
    )  # the prompt's T = 4 tokens at once
    outputs = [out]
    for t in range(prefill, length):
        out, cache_key, cache_value = jit_decode_step(
            query[:, t : t + 1], key_[:, t : t + 1], value[:, t : t + 1], cache_key, cache_value, t
        )
        outputs.append(out)
    expected = jaxloops.attention(query, key_, value, is_causal=True)
    within_rounding(np.concatenate(outputs, axis=1), expected, query, key_, value)
    cache_key = np.asarray(cache_key)  # sliced in NumPy: no program per slice
    np.testing.assert_array_equal(cache_key[:, :, :length], key_.swapaxes(1, 2))  # (B, K, S, H)
    assert not np.any(cache_key[:, :, length:])  # slots not reached stay empty


@pytest.mark.parametrize("kv_heads", [6, 3, 1], ids=["MHA", "GQA", "MQA"])
def test_decode_tokens_after_a_prefill_equals_causal_attention(kv_heads):
    batch, length, heads, head_dim, slots = 3, 7, 6, 5, 11
    query = normal((batch, length, heads, head_dim), 7)
    key_ = normal((batch, length, kv_heads, head_dim), 8)
    value = normal((batch, length, kv_heads, head_dim), 9)
    cache_key = cache_value = np.zeros((batch, kv_heads, slots, head_dim), np.float32)
    first, cache_key, cache_value = jit_decode_step(
        query[:, :2], key_[:, :2], value[:, :2], cache_key, cache_value, 0
    )
    rest, cache_key, _ = jaxloops.decode_tokens(
        query[:, 2:], key_[:, 2:], value[:, 2:], cache_key, cache_value, 2
    )
    expected = jaxloops.attention(query, key_, value, is_causal=True)
    within_rounding(np.concatenate([first, rest], axis=1), expected, query, key_, value)
    np.testing.assert_array_equal(np.asarray(cache_key)[:, :, :length], key_.swapaxes(1, 2))


@pytest.mark.parametrize(
    "batch, kv_heads",
    [(3, 6), (3, 3), (1, 6), (1, 3), (1, 1)],
    ids=["MHA", "GQA", "MHA-one-sequence", "GQA-one-sequence", "MQA-one-sequence"],
)
def test_decode_tokens_writes_the_donated_cache_in_place(batch, kv_heads):
    heads, head_dim, slots, steps = 6, 33, 512, 7  # cache > scratch
    queries = jax.ShapeDtypeStruct((batch, steps, heads, head_dim), jnp.float32)
    new = jax.ShapeDtypeStruct((batch, steps, kv_heads, head_dim), jnp.float32)
    cache = jax.ShapeDtypeStruct((batch, kv_heads, slots, head_dim), jnp.float32)
    compiled = jaxloops.decode_tokens.lower(queries, new, new, cache, cache, 0).compile()
    memory = compiled.memory_analysis()
    # The cache's bytes as the program lays its parameters out (a TPU pads them to its tiles).
    (_, _, _, key_format, value_format, _), _ = compiled.input_formats
    cache_bytes = measure.laid_out_bytes(cache.shape, cache.dtype, key_format.layout)
    assert cache_bytes >= batch * kv_heads * slots * head_dim * 4
    assert value_format.layout == key_format.layout
    assert memory.alias_size_in_bytes == 2 * cache_bytes  # outputs reuse the donated buffers
    assert memory.temp_size_in_bytes < cache_bytes  # no copy of the cache anywhere


def test_drop_unit_axes_drops_the_size_1_axes_and_keeps_the_bytes():
    cache = jaxloops.init_kv_cache(layers=2, batch=1, length=11, kv_heads=3, head_dim=5)
    carried = jaxloops.drop_unit_axes(cache)
    assert carried[1]["value"].shape == (3, 11, 5)  # (K, S, H): B = 1 dropped
    shapes = {(2, 3): (2, 3, 11, 5), (2, 1): (2, 11, 5), (1, 1): (11, 5)}  # (B, K) -> form
    for (batch, kv_heads), shape in shapes.items():
        assert jaxloops.drop_unit_axes(np.zeros((batch, kv_heads, 11, 5))).shape == shape


@pytest.mark.parametrize("batch, kv_heads", [(1, 3), (2, 1), (1, 1)])
def test_decode_step_on_the_cache_without_unit_axes_equals_the_full_cache(batch, kv_heads):
    heads, head_dim, slots, length = 6, 5, 11, 4
    query = normal((batch, length, heads, head_dim), 10)
    key_ = normal((batch, length, kv_heads, head_dim), 11)
    value = normal((batch, length, kv_heads, head_dim), 12)
    cache = np.asarray(normal((batch, kv_heads, slots, head_dim), 13))  # stale slots too
    full = jit_decode_step(query, key_, value, cache, cache, 2)
    carried = jit_decode_step(
        query, key_, value, jaxloops.drop_unit_axes(cache), jaxloops.drop_unit_axes(cache), 2
    )
    np.testing.assert_array_equal(carried[0], full[0])
    np.testing.assert_array_equal(carried[1], jaxloops.drop_unit_axes(np.asarray(full[1])))


def test_decode_attention_rejects_a_drop_unit_axes_that_does_not_fit():
    query = np.zeros((2, 1, 6, 5))  # B = 2: a (2, S, H) form is K = 1, a (3, S, H) form fits none
    with pytest.raises(ValueError, match=r"drop_unit_axes form of a \(B, K, S, H\) cache"):
        jaxloops.decode_attention(query, np.zeros((3, 11, 5)), np.zeros((3, 11, 5)), 0)


def test_a_start_past_the_cache_is_refused_by_value_and_checkified_when_traced():
    from jax.experimental import checkify

    batch, heads, kv_heads, head_dim, slots = 3, 6, 2, 5, 7
    query = normal((batch, 2, heads, head_dim), 1)  # T = 2 new tokens
    new = normal((batch, 2, kv_heads, head_dim), 2)
    cache = np.zeros((batch, kv_heads, slots, head_dim), np.float32)
    # A static start is checked by value at trace time, as in an eager call, in one program.
    fitting = jax.jit(jaxloops.decode_step, static_argnums=5)
    out, *_ = fitting(query, new, new, cache, cache, 5)  # slots 5, 6: fits
    assert out.shape == query.shape
    for start in (6, 9, -1):
        with pytest.raises(ValueError, match=rf"start {start} does not fit 2 new tokens"):
            jaxloops.decode_step(query, new, new, cache, cache, start)
        with pytest.raises(ValueError, match=rf"start {start} does not fit"):
            jaxloops.decode_attention(query, cache, cache, start)
    checked = jax.jit(checkify.checkify(jaxloops.kvcache.checked_decode_step))
    error, _ = checked(query, new, new, cache, cache, 9)  # traced: only checkify sees it
    with pytest.raises(ValueError, match="start 9 does not fit 2 new tokens into a cache of 7"):
        error.throw()
    error, (out, *_) = checked(query, new, new, cache, cache, 5)
    assert error.get() is None and out.shape == query.shape


@pytest.mark.parametrize("kv_heads", [6, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_cached_decoding_equals_uncached_within_float32_rounding_and_wrong_caches_fail(kv_heads):
    from jaxloops.attention import attention_rounding_bound

    batch, length, heads, head_dim, slots, prefill = 3, 9, 6, 5, 13, 4
    query = normal((batch, length, heads, head_dim), 11)
    key_ = normal((batch, length, kv_heads, head_dim), 12)
    value = normal((batch, length, kv_heads, head_dim), 13)
    expected = np.asarray(jaxloops.attention(query, key_, value, is_causal=True), np.float64)
    bound = attention_rounding_bound(query, key_, np.abs(value).max())

    def decoded(cache_key, positions_shift=0):
        cache_value = np.zeros((batch, kv_heads, slots, head_dim), np.float32)
        first, cache_key, cache_value = jit_decode_step(
            query[:, :prefill], key_[:, :prefill], value[:, :prefill], cache_key, cache_value, 0
        )
        rest, *_ = jaxloops.decode_tokens(
            query[:, prefill:],
            key_[:, prefill:],
            value[:, prefill:],
            cache_key,
            cache_value,
            prefill + positions_shift,
        )
        return np.concatenate([first, rest], axis=1)

    def misses(got):
        return float(np.abs(got - expected).max()) / bound

    empty = np.zeros((batch, kv_heads, slots, head_dim), np.float32)
    assert misses(decoded(empty)) <= 1
    # Shifted positions: the decoded tokens written one slot late (a gap of one empty slot).
    assert misses(decoded(empty, positions_shift=1)) > 100
    # A stale cache slot: token 6 attends over a cache whose slot 6 still holds what an
    # empty cache held (a step that forgot to write its own slot) -- rejected; written -- not.
    cache_key = np.zeros((batch, kv_heads, slots, head_dim), np.float32)
    cache_value = cache_key.copy()
    cache_key[:, :, :7], cache_value[:, :, :7] = (
        key_[:, :7].swapaxes(1, 2),
        value[:, :7].swapaxes(1, 2),
    )
    written = np.asarray(jit_decode_attention(query[:, 6:7], cache_key, cache_value, 6))
    assert float(np.abs(written - expected[:, 6:7]).max()) / bound <= 1
    cache_key[:, :, 6] = cache_value[:, :, 6] = 0.0
    stale = np.asarray(jit_decode_attention(query[:, 6:7], cache_key, cache_value, 6))
    assert float(np.abs(stale - expected[:, 6:7]).max()) / bound > 100


def test_sizes_below_one_are_refused_by_name():
    with pytest.raises(ValueError, match="batch=0"):
        jaxloops.kv_cache_bytes(
            layers=2, kv_heads=1, head_dim=4, length=8, batch=0, bytes_per_element=2
        )
    with pytest.raises(ValueError, match="0 query heads"):
        jaxloops.attention_kind(0, 1)
    cache = np.zeros((2, 1, 3, 4), np.float32)
    tokens = np.zeros((2, 5, 1, 4), np.float32)  # T = 5 > S = 3
    with pytest.raises(ValueError, match="5 tokens cannot fit a cache of 3 slots"):
        jaxloops.decode_tokens(tokens, tokens, tokens, cache, cache, 0)


def test_decode_tokens_refuses_a_known_start_past_the_cache_before_compiling():
    # Inside the compiled loop `start` is traced and `dynamic_update_slice` would clamp it:
    # start 5 with 4 tokens in 7 slots would write slots 3..6 and decode from the wrong ones.
    cache = np.zeros((2, 1, 7, 3), np.float32)  # (B, K, S, H)
    tokens = normal((2, 4, 1, 3), 3)  # (B, T, N, H), T = 4
    for start in (4, 5, -1):
        with pytest.raises(ValueError, match=rf"start {start} does not fit 4 new tokens"):
            jaxloops.decode_tokens(tokens, tokens, tokens, cache, cache.copy(), start)
    out, *_ = jaxloops.decode_tokens(tokens, tokens, tokens, cache, cache.copy(), 3)
    assert out.shape == tokens.shape
