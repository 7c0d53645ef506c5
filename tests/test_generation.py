import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from conftest import SMALL_TRANSFORMER
from jaxloops import measure
from jaxloops.generation import generate, generate_without_cache, sample_token
from jaxloops.kvcache import kv_cache_bytes
from jaxloops.transformer import (
    cached_logits,
    kv_cache_for,
    transformer_logits,
)

CONFIG = SMALL_TRANSFORMER  # V 13, L 2, D 30, N 10, K 5 (G = 2), H 3, F 21, max_len 11
STEPS = 5  # P + STEPS = 10 < max_len


@pytest.fixture(scope="module")
def params(small_transformer):
    return small_transformer


@pytest.fixture(scope="module")
def prompt():
    rng = np.random.default_rng(4)
    # NumPy, sliced and compared in NumPy: no program per slice.
    return rng.integers(0, CONFIG.vocab_size, (7, 5), dtype=np.int32)  # (B, P)


def test_the_model_cache_is_the_one_kv_cache_of_the_formulas_size(params):
    cache = kv_cache_for(params, batch=7, length=15)
    one = jaxloops.init_kv_cache(
        layers=2, batch=7, length=15, kv_heads=5, head_dim=3, dtype=jnp.float32
    )
    assert jax.tree.structure(cache) == jax.tree.structure(one)  # one {"key", "value"} per layer
    assert [leaf.shape for leaf in jax.tree.leaves(cache)] == [(7, 5, 15, 3)] * 4  # (B, K, S, H)
    nbytes = sum(leaf.nbytes for leaf in jax.tree.leaves(cache))
    assert nbytes == kv_cache_bytes(
        layers=2, kv_heads=5, head_dim=3, length=15, batch=7, bytes_per_element=4
    )


def test_prefill_then_decode_steps_give_the_full_forward_logits(params):
    tokens = np.random.default_rng(5).integers(0, 13, (7, 11), dtype=np.int32)

    @jax.jit
    def cached_then_full(params, tokens):
        cache = kv_cache_for(params, batch=7, length=11)
        prefill, cache = cached_logits(params, tokens[:, :5], cache, 0)  # (B, P, V)

        def decode(cache, t):  # one token at a time, each reading the cache
            token = jax.lax.dynamic_slice_in_dim(tokens, t, 1, axis=1)  # (B, 1)
            logits, cache = cached_logits(params, token, cache, t)  # (B, 1, V)
            return cache, logits[:, 0]

        _, decoded = jax.lax.scan(decode, cache, jnp.arange(5, 11))  # (T - P, B, V)
        cached = jnp.concatenate([prefill, decoded.transpose(1, 0, 2)], axis=1)  # (B, T, V)
        return cached, transformer_logits(params, tokens)

    cached, full = cached_then_full(params, tokens)
    assert cached.shape == full.shape == (7, 11, 13)  # (B, T, V)
    np.testing.assert_allclose(cached, full, atol=1e-5, rtol=1e-5)


def test_generation_is_deterministic_for_a_key_and_varies_across_keys(params, prompt):
    first = generate(jax.random.key(0), params, prompt, steps=STEPS)
    again = generate(jax.random.key(0), params, prompt, steps=STEPS)
    other = generate(jax.random.key(1), params, prompt, steps=STEPS)
    assert first.shape == (7, 10) and first.dtype == jnp.int32
    first, other = np.asarray(first), np.asarray(other)  # compared in NumPy
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first[:, :5], prompt)
    assert int((first[:, 5:] != other[:, 5:]).sum()) > 0


@pytest.mark.parametrize("batch", [7, 1])  # B = 1: the cache is carried without its B axis
def test_cached_and_recomputing_decoders_sample_the_same_tokens(params, prompt, batch):
    cached = generate(jax.random.key(0), params, prompt[:batch], steps=STEPS)
    recomputed = generate_without_cache(jax.random.key(0), params, prompt[:batch], steps=STEPS)
    np.testing.assert_array_equal(cached, recomputed)


def test_temperature_zero_is_greedy():
    logits = jnp.array([[0.0, 3.0, 1.0], [2.0, -1.0, 0.5]])  # (B, V)
    np.testing.assert_array_equal(sample_token(jax.random.key(0), logits, 0.0), [1, 0])
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        sample_token(jax.random.key(0), logits, -1.0)


def test_generation_longer_than_the_position_table_raises(params, prompt):
    with pytest.raises(ValueError, match=r"12 positions is longer than the position table \(11"):
        generate(jax.random.key(0), params, prompt, steps=7)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        generate_without_cache(jax.random.key(0), params, prompt, steps=0)


def test_cached_logits_refuses_a_cache_with_other_layers(params):
    (layer,) = jaxloops.init_kv_cache(
        layers=1, batch=7, length=11, kv_heads=5, head_dim=3, dtype=jnp.float32
    )
    with pytest.raises(ValueError, match="cache has 1 layers, the model 2"):
        cached_logits(params, np.zeros((7, 1), np.int32), (layer,), 0)


@pytest.mark.parametrize("batch, kv_heads", [(1, 5), (3, 1)], ids=["one-prompt", "MQA"])
def test_the_compiled_decode_loop_copies_no_cache(batch, kv_heads):
    config = dataclasses.replace(CONFIG, num_kv_heads=kv_heads)
    shapes = jax.eval_shape(lambda k: jaxloops.init_transformer(k, config), jax.random.key(0))
    prompt = jax.ShapeDtypeStruct((batch, 3), jnp.int32)
    compiled = generate.lower(jax.random.key(1), shapes, prompt, steps=STEPS).compile()
    # Its shape only: nothing allocated, nothing compiled.
    cache = jax.eval_shape(lambda: kv_cache_for(shapes, batch, 3 + STEPS))
    layer = cache[0]["key"]  # (B, K, S, H), a size-1 axis
    assert measure.loop_copies(compiled, layer.size) == 0


def test_out_of_vocabulary_tokens_are_refused_by_value_and_never_embed_as_another_token(params):
    from jax.experimental import checkify

    V = CONFIG.vocab_size
    tokens = np.array(
        [[1, 2, V + 3], [4, -1, 5]], np.int32
    )  # (B, T); NumPy, as are the outputs below
    with pytest.raises(ValueError, match=rf"tokens must be in \[0, {V}\); got {V + 3} at index"):
        transformer_logits(params, tokens)
    only_negative = tokens.copy()
    only_negative[0, 2] = 0
    with pytest.raises(ValueError, match=r"got -1 at index \(1, 1\)"):
        transformer_logits(params, only_negative)
    # Traced, nothing can raise: a bad token embeds as NaN, not as the clamped or wrapped
    # token V - 1, and its sequence's logits are NaN (0 * NaN is NaN in the masked values);
    # a clean sequence in the same batch is untouched.
    logits_of = jax.jit(transformer_logits)
    logits = np.asarray(logits_of(params, np.concatenate([tokens, tokens[:1] % V])))
    assert np.isnan(logits[:2, -1]).all()
    # The same program: the same shapes.
    clean = np.asarray(logits_of(params, np.concatenate([tokens % V, tokens[:1] % V])))
    np.testing.assert_array_equal(logits[2], clean[2])
    assert np.isfinite(clean).all()
    # Under checkify, the prompt check of `checked_generate` names the extremes.
    checked = checkify.checkify(
        functools.partial(jaxloops.generation.checked_generate, steps=3, temperature=0.0)
    )
    error, _ = jax.jit(checked)(jax.random.key(0), params, tokens)
    with pytest.raises(ValueError, match=rf"prompt tokens must be in \[0, {V}\); got min -1"):
        error.throw()
    error, out = jax.jit(checked)(jax.random.key(0), params, tokens % V)
    assert error.get() is None
    out = np.asarray(out)
    np.testing.assert_array_equal(out[:, :3], tokens % V)
    assert out.shape == (2, 6) and ((0 <= out) & (out < V)).all()


def test_positions_past_the_table_and_nan_temperatures_are_refused(params):
    with pytest.raises(ValueError, match=r"start 9 puts 3 tokens past the position table"):
        jaxloops.transformer.embed(params, np.zeros((2, 3), np.int32), 9)
    with pytest.raises(ValueError, match="temperature must be >= 0, got nan"):
        sample_token(jax.random.key(0), np.zeros((2, 3), np.float32), float("nan"))


@pytest.mark.parametrize("decoder", [generate, generate_without_cache])
def test_an_out_of_vocabulary_prompt_is_refused_before_it_decodes(params, prompt, decoder):
    # Before the wrapper, `generate` embedded the bad token as NaN and sampled token 0
    # from then on: a (7, 10) array of valid-looking ids and no error.
    V = CONFIG.vocab_size
    for bad, where in ((V, (2, 3)), (-1, (0, 0))):
        wrong = prompt.copy()
        wrong[where] = bad
        with pytest.raises(ValueError, match=rf"prompt tokens must be in \[0, {V}\); got {bad}"):
            decoder(jax.random.key(0), params, wrong, steps=STEPS)
    # The same ids in range decode as before: the check refuses only what is wrong.
    assert decoder(jax.random.key(0), params, prompt, steps=STEPS).shape == (7, 10)
