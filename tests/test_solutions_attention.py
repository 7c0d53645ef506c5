"""The exercise solutions of chapters 8-11, each checked against a reference."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from conftest import device_bytes, normal
from jaxloops import generation, measure
from jaxloops.attention import attention_rounding_bound
from jaxloops.solutions import attention as ex

# One GQA problem shared by several tests, so they share compilations: B=2, T=S=11, N=9, K=3, H=5.
B, L, N, K, H = 2, 11, 9, 3, 5


@pytest.fixture(scope="module")
def qkv():
    return measure.random_qkv(jax.random.key(3), batch=B, length=L, heads=N, head_dim=H, kv_heads=K)


@pytest.fixture(scope="module")
def library():
    return jax.jit(jax.nn.dot_product_attention, static_argnames=("is_causal", "local_window_size"))


# The masks in one program per (T, S, window, offset), not one per operation of an eager call.
sliding_window_mask = jax.jit(
    ex.sliding_window_mask, static_argnums=(0, 1, 2), static_argnames="offset"
)


# Chapter 8.
_RESULT = re.compile(r"^\s*(?:ROOT )?%?[\w.-]+ = (.*?) ([\w-]+)\(")
_VIEWS = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple"}


def arrays_written(program, elements: int) -> int:
    """How many arrays of `elements` elements the top-level instructions of a compiled
    program write (each array of a tuple result counted; parameters and views of another
    array not): what it keeps in memory, not what a fusion computes and consumes inside."""
    written = 0
    for computation, line in measure.compiled.hlo_lines(program.as_text()):
        result = _RESULT.match(line)
        if computation == "ENTRY" and result and result[2] not in _VIEWS:
            shapes = measure.compiled.SHAPE.findall(result[1])
            written += sum(math.prod(measure.compiled.shape_dims(d)) == elements for _, d in shapes)
    return written


def test_naive_temp_formula_is_the_leading_term_of_the_compiled_scratch():
    # Long enough that the (B, N, T, S) arrays dominate the Q, K, V and output copies.
    b, t, s, n, h = 1, 257, 263, 3, 7
    query = np.ones((b, t, n, h), np.float32)
    key = np.ones((b, s, n, h), np.float32)
    predicted = ex.naive_attention_temp_bytes(b, n, t, s, jnp.float32)
    assert predicted == 2 * b * n * t * s * 4  # two float32 score arrays at a time, at most
    program = measure.compiled.compile_call(jax.nn.dot_product_attention, query, key, key)
    compiled = measure.compiled.costs_of(program)["temp_bytes"]
    # How many score arrays the program keeps is the compiler's choice, read from the program:
    # XLA:CPU writes the exponentials (fused into the scores matmul) and the weights,
    # transposed (2, the formula's count); XLA:TPU (v5e, JAX 0.10.2) writes the scores alone
    # and recomputes the exponentials and the division inside the second matmul (1). Each is
    # laid out as the device lays it out (a TPU pads it to tiles).
    written = arrays_written(program, b * n * t * s)
    assert 1 <= written <= 2, written  # at least the scores; at most the formula's two
    one = device_bytes((b, n, t, s))
    assert written * one <= compiled < 1.25 * written * one, (written, one, compiled)
    # One score array more or fewer than the program writes is rejected by the same bounds.
    for wrong in (written - 1, written + 1):
        assert not wrong * one <= compiled < 1.25 * wrong * one, (wrong, one, compiled)


def test_naive_temp_formula_counts_float32_scores_for_bfloat16_inputs():
    # The compiled bfloat16 scratch differs between XLA releases (jax 0.12's is below the
    # formula, jax 0.10's matches it), so only the formula is pinned here.
    assert ex.naive_attention_temp_bytes(1, 3, 257, 263, jnp.bfloat16) == 2 * 3 * 257 * 263 * 4


def test_einsum_attention_equals_jax(qkv, library):
    got = jax.jit(ex.einsum_attention)(*qkv)
    np.testing.assert_allclose(got, library(*qkv), atol=2e-6)


def test_einsum_attention_refuses_heads_that_do_not_group():
    with pytest.raises(ValueError, match="9 is not a multiple of 4"):
        ex.einsum_attention(np.ones((1, 3, 9, 5)), np.ones((1, 7, 4, 5)), np.ones((1, 7, 4, 5)))


# Chapter 8b.
@pytest.mark.parametrize("split", [1, 7])
def test_split_kv_attention_equals_full_attention(qkv, library, split):
    # Within this backend's rounding of one attention (derived; its rejection of wrong
    # answers is tests/test_attention.py's).
    bound = attention_rounding_bound(qkv[0], qkv[1], np.abs(np.asarray(qkv[2])).max())
    np.testing.assert_allclose(ex.split_kv_attention(*qkv, split), library(*qkv), atol=bound)


# Chapter 9.
def test_chunked_prefill_equals_causal_attention(qkv, library):
    # Jitted: its chunks, masks and attentions in one program, not one per operation.
    chunked = jax.jit(ex.chunked_causal_attention, static_argnames="chunk")
    got = chunked(*qkv, chunk=4)  # chunks of 4, 4 and 3 queries
    np.testing.assert_allclose(got, library(*qkv, is_causal=True), atol=2e-6)


def test_sliding_window_mask_equals_jax_local_window(qkv, library):
    window = 4
    mask = sliding_window_mask(L, L, window)
    assert np.asarray(mask).sum(axis=1).tolist() == [min(t + 1, window) for t in range(L)]
    got = jaxloops.attention(*qkv, mask=mask)
    want = library(*qkv, is_causal=True, local_window_size=(window - 1, 0))
    np.testing.assert_allclose(got, want, atol=2e-6)


def test_sliding_window_with_offset_is_the_bottom_rows_of_the_full_window():
    full = np.asarray(sliding_window_mask(11, 11, 3))
    np.testing.assert_array_equal(sliding_window_mask(4, 11, 3, offset=7), full[7:])


def test_top_left_causal_single_query_returns_the_first_value(qkv, library):
    query, key, value = (np.asarray(x) for x in qkv)  # sliced in NumPy: no program per slice
    out = np.asarray(library(query[:, -1:], key, value, is_causal=True))  # (B, 1, N, H)
    first = np.repeat(value[:, :1], N // K, axis=2)  # slot 0's value, per query head
    np.testing.assert_allclose(out, first, atol=1e-6)


# Chapter 10.
@pytest.mark.parametrize("heads, budget_k", [(32, 8), (15, 5), (15, 3), (7, 1)])
def test_max_kv_heads_fits_and_the_next_divisor_does_not(heads, budget_k):
    shape = dict(layers=5, head_dim=11, length=13, batch=3, bytes_per_element=2)
    budget = jaxloops.kv_cache_bytes(kv_heads=budget_k, **shape) + 1
    got = ex.max_kv_heads(budget, heads=heads, **shape)
    assert got == budget_k and heads % got == 0
    larger = [k for k in range(got + 1, heads + 1) if heads % k == 0]
    if larger:
        assert jaxloops.kv_cache_bytes(kv_heads=larger[0], **shape) > budget


def test_max_kv_heads_for_llama_2_7b_in_16_gib():
    k = ex.max_kv_heads(
        16 * 2**30, layers=32, heads=32, head_dim=128, length=8192, batch=16, bytes_per_element=2
    )
    assert k == 8  # 2 GiB per key/value head


def test_max_kv_heads_refuses_an_impossible_budget():
    with pytest.raises(ValueError, match="even K = 1"):
        ex.max_kv_heads(100, layers=3, heads=5, head_dim=7, length=11, batch=1, bytes_per_element=2)


def test_ragged_decode_equals_jax_with_sequence_lengths():
    b, s, n, k, h = 5, 11, 9, 3, 7
    query = normal((b, 1, n, h), 4)  # (B, 1, N, H)
    cache_key = normal((b, k, s, h), 5)  # (B, K, S, H)
    cache_value = normal((b, k, s, h), 6)
    lengths = np.array([1, 11, 4, 7, 2], np.int32)
    got = jax.jit(ex.ragged_decode_attention)(query, cache_key, cache_value, lengths)
    want = jax.jit(jax.nn.dot_product_attention)(
        query, cache_key.swapaxes(1, 2), cache_value.swapaxes(1, 2), key_value_seq_lengths=lengths
    )
    np.testing.assert_allclose(got, want, atol=2e-6)
    for bad in ([0, 11, 4, 7, 2], [1, 12, 4, 7, 2]):  # no slot, or one past the cache
        with pytest.raises(ValueError, match=r"lengths \[.*\] must be \(B,\) = \(5,\) ints"):
            ex.ragged_decode_attention(query, cache_key, cache_value, np.array(bad, np.int32))


# Chapter 11.
def test_temperature_probs_are_what_sample_token_draws(key):
    logits = np.array([2.0, -1.0, 0.5, 1.5, -3.0], np.float32)
    draws = 20_000
    sample = jax.jit(jax.vmap(lambda k: generation.sample_token(k, logits[None], 0.7)[0]))
    counts = np.bincount(np.asarray(sample(jax.random.split(key, draws))), minlength=5)
    # Four standard errors of a frequency at most 0.5: 4 * sqrt(0.25 / 20000) < 0.015.
    probs = jax.jit(ex.temperature_probs, static_argnums=1)(logits, 0.7)  # one program
    np.testing.assert_allclose(counts / draws, probs, atol=0.015)


def test_temperature_moves_from_argmax_to_uniform():
    logits = np.array([[2.0, -1.0, 0.5, 1.5, -3.0, 0.0, 1.0]], np.float32)
    temperatures = (0.0, 0.3, 0.7, 1.0, 3.0, 100.0)
    # Every temperature in one program, not one per operation; entropies in NumPy.
    argmax, *probs = jax.jit(lambda x: [ex.temperature_probs(x, t) for t in temperatures])(logits)
    np.testing.assert_array_equal(argmax, np.eye(7)[[0]])  # one-hot on index 0
    entropy = lambda p: float(-(p * np.log(p)).sum())
    entropies = [entropy(np.asarray(p)) for p in probs]
    assert entropies == sorted(entropies)
    np.testing.assert_allclose(entropies[-1], math.log(7), rtol=1e-3)


def test_incremental_logits_equal_the_full_forward_pass(key):
    config = jaxloops.TransformerConfig(
        vocab_size=13,
        num_layers=1,
        model_dim=30,
        num_heads=6,
        num_kv_heads=2,
        hidden_dim=7,
        max_len=11,
    )
    params = jaxloops.init_transformer(key, config)
    tokens = np.random.default_rng(1).integers(0, 13, (3, 7)).astype(np.int32)
    got = ex.incremental_logits(params, tokens, prefill=4)  # prefill 4, then 3 decode steps
    want = jax.jit(jaxloops.transformer_logits)(params, tokens)
    np.testing.assert_allclose(got, want, atol=1e-5)
