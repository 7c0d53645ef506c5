import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from backend_marks import xla_cpu_only
from conftest import SMALL_TRANSFORMER
from jaxloops.attention import attention
from jaxloops.blockwise import blockwise_attention
from jaxloops.data import Batch
from jaxloops.loop import make_epoch
from jaxloops.memory import close_within, rounding_terms
from jaxloops.sizes import experiment_sizes
from jaxloops.text import VOCAB_SIZE, load_stdlib_corpus, sample_windows
from jaxloops.train import make_optimizer, make_train_step
from jaxloops.transformer import (
    TransformerConfig,
    attention_map,
    embed,
    init_transformer,
    project_qkv,
    rms_norm,
    transformer_logits,
    transformer_loss,
)

# Distinct sizes: V 13, L 2, D 30, N 10, K 5 (G = 2), H 3, F 21, max_len 11; batches B 7, T 9.
GQA = SMALL_TRANSFORMER  # V 13, L 2, D 30, N 10, K 5 (G = 2), H 3, F 21, max_len 11
SIZES = dataclasses.asdict(GQA)


# Jitted once here: run eagerly, every small op would compile on its own (seconds in all).
logits_fn = jax.jit(transformer_logits)


@pytest.fixture(scope="module")
def params(small_transformer):
    return small_transformer


@pytest.fixture(scope="module")
def tokens():
    rng = np.random.default_rng(2)  # test data; NumPy spares a compile of the JAX sampler
    return jax.device_put(rng.integers(0, GQA.vocab_size, (7, 9), dtype=np.int32))  # (B, T)


@pytest.fixture(scope="module")
def batch(tokens):
    """Each token's target is the next one (wrapping around), shifted on the host."""
    return Batch(x=tokens, y=jax.device_put(np.roll(np.asarray(tokens), -1, axis=1)))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model_dim": 32}, "model_dim 32 is not divisible by num_heads 10"),
        ({"num_kv_heads": 4}, "num_heads 10 is not a multiple of num_kv_heads 4"),
        ({"num_layers": 0}, "num_layers must be a positive int"),
    ],
)
def test_bad_configs_raise(overrides, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**{**SIZES, **overrides})


def test_sequence_longer_than_the_position_table_raises(params):
    too_long = np.zeros((2, GQA.max_len + 1), np.int32)
    with pytest.raises(ValueError, match=r"12 positions is longer than the position table \(11"):
        transformer_logits(params, too_long)
    with pytest.raises(ValueError, match=r"\(B, T\) integers"):
        transformer_logits(params, np.zeros((2, 3), np.float32))


def test_parameter_shapes_follow_the_config(params):
    attn, mlp = params["block_1"]["attention"], params["block_1"]["mlp"]
    assert attn["query"].shape == (30, 10, 3)  # (D, N, H)
    assert attn["key"].shape == attn["value"].shape == (30, 5, 3)  # (D, K, H)
    assert attn["out"].shape == (10, 3, 30)  # (N, H, D)
    assert mlp["w_in"].shape == (30, 21) and mlp["w_out"].shape == (21, 30)
    assert params["embed"]["positions"].shape == (11, 30)
    assert params["unembed"]["w"].shape == (30, 13)
    assert "block_2" not in params


def test_output_at_t_does_not_depend_on_tokens_after_t(params, tokens):
    t = 4
    changed = np.array(tokens)
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 5) % GQA.vocab_size  # every later token differs
    before, after = (np.asarray(logits_fn(params, x)) for x in (tokens, changed))
    assert before.shape == (7, 9, 13)  # (B, T, V)
    np.testing.assert_array_equal(before[:, : t + 1], after[:, : t + 1])
    assert float(np.abs(before[:, t + 1 :] - after[:, t + 1 :]).min()) > 0


def test_loss_is_optax_cross_entropy_of_the_logits(params, batch):
    @jax.jit
    def loss_and_reference(params, batch):
        loss, aux = transformer_loss(params, batch)
        logits = transformer_logits(params, batch.x)  # (B, T, V)
        reference = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y).mean()
        return loss, aux["accuracy"], reference, (logits.argmax(-1) == batch.y).mean()

    loss, accuracy, expected, expected_accuracy = loss_and_reference(params, batch)
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    np.testing.assert_allclose(accuracy, expected_accuracy)


def test_blockwise_attention_trains_the_same_model(params, batch):
    # Blocks of 4 over T = 9: the last block is partial, and causal blocks are skipped.
    blockwise = functools.partial(blockwise_attention, block_size=4, parallel_blocks=1)

    @jax.jit
    def both(params):
        grad = jax.value_and_grad(lambda p, attend: transformer_loss(p, batch, attend)[0])
        return grad(params, attention), grad(params, blockwise)

    (loss, grads), (loss_blockwise, grads_blockwise) = both(params)
    np.testing.assert_allclose(loss_blockwise, loss, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(grads_blockwise), jax.tree.leaves(grads)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def test_attention_map_is_causal_and_reproduces_the_attention_output(params, tokens):
    @jax.jit
    def both_ways(params, tokens):
        weights = attention_map(params, tokens, layer=0)  # (B, N, T, S)
        query, key, value = project_qkv(params["block_0"]["attention"], embed(params, tokens))
        value_BSNH = jnp.repeat(value, 2, axis=2)  # (B, S, N, H): head n reads kv head n // G
        mixed = jnp.einsum("BNTS,BSNH->BTNH", weights, value_BSNH)  # (B, T, N, H)
        return weights, mixed, attention(query, key, value, is_causal=True)

    weights, mixed, reference = map(np.asarray, both_ways(params, tokens))
    assert weights.shape == (7, 10, 9, 9)  # (B, N, T, S)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    assert float(np.triu(weights, k=1).max()) == 0.0  # np.triu: the last two axes, (T, S)
    np.testing.assert_allclose(mixed, reference, atol=1e-6)
    with pytest.raises(ValueError, match=r"layer 2 is not in \[0, 1\]"):
        attention_map(params, tokens, layer=2)


@pytest.mark.parametrize("model_dim", [15, 45])
def test_fresh_logits_have_std_one_over_sqrt_d_so_the_loss_starts_at_ln_v(model_dim):
    """Chapter 11's check at init: logits of std sigma raise the loss by about sigma^2 / 2.
    The control, the unembedding at unit gain (logits of std 1), starts half a nat above."""
    V = 97
    config = TransformerConfig(V, 2, model_dim, 3, 1, 21, 11)
    params = init_transformer(jax.random.key(3), config)
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, V, (13, 12), dtype=np.int32)  # (B, T + 1)
    batch = Batch(x=jnp.asarray(tokens[:, :-1]), y=jnp.asarray(tokens[:, 1:]))
    std = float(logits_fn(params, batch.x).std(-1).mean())
    assert abs(std * math.sqrt(model_dim) - 1) < 0.2
    loss = float(jax.jit(transformer_loss)(params, batch)[0])
    assert abs(loss - math.log(V)) < 0.25  # the page's bound
    unit = {**params, "unembed": {"w": params["unembed"]["w"] * math.sqrt(model_dim)}}
    assert float(logits_fn(unit, batch.x).std(-1).mean()) > 0.8
    assert float(jax.jit(transformer_loss)(unit, batch)[0]) - math.log(V) > 0.3


def test_tiny_model_learns_stdlib_text_with_the_books_train_step():
    config = TransformerConfig(
        vocab_size=VOCAB_SIZE,
        num_layers=1,
        model_dim=15,
        num_heads=3,
        num_kv_heads=1,
        hidden_dim=21,
        max_len=11,
    )
    params = init_transformer(jax.random.key(0), config)
    optimizer = make_optimizer(1e-2, 0.0)
    epoch = jax.jit(make_epoch(make_train_step(transformer_loss, optimizer)))
    text = jax.device_put(load_stdlib_corpus(2**14).train)
    batches = sample_windows(jax.random.key(1), text, steps=40, batch_size=7, seq_len=11)
    opt_state = jax.jit(optimizer.init)(params)  # one program, not one per leaf shape
    _, _, metrics = epoch(params, opt_state, batches)
    losses = np.asarray(metrics["loss"])  # (steps,)
    assert abs(losses[0] - math.log(VOCAB_SIZE)) < 0.25  # logits of std 1/sqrt(D): about ln V
    assert losses[-10:].mean() < 3.5  # from 4.6 nats to below 3.5 in 40 steps


def test_the_sizes_build_the_config_in_its_own_words():
    lm = experiment_sizes("cpu").lm
    config = TransformerConfig.from_sizes(lm, 97)
    assert config.vocab_size == 97
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.max_len) == (
        lm.num_layers,
        lm.num_heads,
        lm.num_kv_heads,
        lm.max_len,
    )
    with pytest.raises(ValueError, match="vocab_size must be a positive int, got 0"):
        TransformerConfig.from_sizes(lm, 0)


def einsum_loss(params, batch):
    """The model as chapter 11 first wrote it, every projection a 3-D einsum: the reference
    for `dense`, which computes the same contractions as 2-D matmuls."""
    x = embed(params, batch.x)  # (B, T, D)
    for i in range(2):
        attn, mlp = params[f"block_{i}"]["attention"], params[f"block_{i}"]["mlp"]
        h = rms_norm(attn["norm"], x)
        q = jnp.einsum("BTD,DNH->BTNH", h, attn["query"])
        k = jnp.einsum("BTD,DKH->BTKH", h, attn["key"])
        v = jnp.einsum("BTD,DKH->BTKH", h, attn["value"])
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # (B, T, N, H)
        x = x + jnp.einsum("BTNH,NHD->BTD", out, attn["out"])
        h = jnp.einsum("BTD,DF->BTF", rms_norm(mlp["norm"], x), mlp["w_in"])
        x = x + jnp.einsum("BTF,FD->BTD", jax.nn.gelu(h), mlp["w_out"])
    logits = jnp.einsum("BTD,DV->BTV", rms_norm(params["norm"], x), params["unembed"]["w"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch.y).mean()


def test_dense_layers_equal_the_einsum_model_within_rounding(params, batch):
    model = jax.jit(jax.value_and_grad(lambda p: transformer_loss(p, batch)[0]))
    reference = jax.jit(jax.value_and_grad(lambda p: einsum_loss(p, batch)))
    terms = rounding_terms(GQA, batch.x.shape[1])
    (loss, grads), (want, want_grads) = model(params), reference(params)
    assert close_within(want, loss, terms)["ok"]
    assert close_within(want_grads, grads, terms)["ok"]
    # A known-wrong model (one projection's weight transposed in its head axes) is rejected.
    wrong = jax.tree.map(lambda a: a, params)
    key_weight = np.asarray(params["block_1"]["attention"]["key"])
    wrong["block_1"]["attention"]["key"] = jax.device_put(np.flip(key_weight, 1))
    wrong_loss, wrong_grads = model(wrong)
    assert not close_within(want_grads, wrong_grads, terms)["ok"]


@xla_cpu_only("the einsum model compiled to no transposing copy either (0 bytes)")
def test_dense_layers_compile_to_fewer_transposing_copies_than_the_einsums(params, batch):
    from jaxloops.measure import breakdown

    def copy_bytes(loss):
        program = jax.jit(jax.grad(loss)).lower(params).compile()
        kernels = breakdown.kernels_of(program)
        return sum(k.bytes for k in kernels if breakdown.transformer_group(k).startswith("copies"))

    dense_bytes = copy_bytes(lambda p: transformer_loss(p, batch)[0])
    assert dense_bytes < copy_bytes(lambda p: einsum_loss(p, batch))
