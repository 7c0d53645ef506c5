import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import jaxloops
from conftest import normal
from jaxloops import pallas_attention as pa
from jaxloops import pallas_kernels
from jaxloops.attention import rounding_magnitudes

# On a CPU the tests run the kernels in XLA's interpreter of Pallas (interpret=True): the same
# kernels, grid, index maps and VMEM scratch (left NaN until written), compiled once into one
# XLA program and cached; `test_the_default_on_a_cpu_is_the_tpu_interpreter` runs the
# default, Pallas's TPU interpreter, which simulates DMAs and raises on a block read out of
# bounds, but runs a grid step at a time through host callbacks (about 50 times slower). On a
# TPU they compile.
INTERPRET = False if jax.default_backend() == "tpu" else True


def qkv(batch, t, s, heads, kv_heads, head_dim, dtype, seed=0):
    return (
        normal((batch, t, heads, head_dim), seed, dtype),
        normal((batch, s, kv_heads, head_dim), seed + 1, dtype),
        normal((batch, s, kv_heads, head_dim), seed + 2, dtype),
    )


def as_float(x):
    return np.asarray(x, np.float64)


def outputs_and_grads(fn, query, key, value, d_out):
    """fn(q, k, v) and the gradients of sum(fn * d_out) w.r.t. q, k, v: one jitted program."""

    def value_and_grads(q, k, v):
        loss = lambda q, k, v: (fn(q, k, v).astype(jnp.float32) * d_out).sum()
        return fn(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    return jax.jit(value_and_grads)(query, key, value)


def errors_over_bounds(got, expected, query, key, magnitude, interpret=INTERPRET):
    """Each of out, dq, dk, dv: its largest difference over `pa.agreement_bound` (with
    `magnitude`, from `rounding_magnitudes`); <= 1 is rounding, > 1 a kernel that computes
    something else."""
    ratios = {}
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        g, e = as_float(got[i]), as_float(expected[i])
        assert g.shape == e.shape, name
        bound = pa.agreement_bound(
            query, key, np.abs(e).max(), magnitude[name], grad=i > 0, interpret=interpret
        )
        ratios[name] = np.abs(g - e).max() / bound
    return ratios


def flatten(result):
    out, grads = result
    return (out, *grads)


# Odd numbers of blocks of distinct sizes; T > S and T < S; causal with Tb = Sb, Tb > Sb and
# Tb < Sb; MHA, GQA (G = 3) and MQA; float32 and bfloat16; H 64 and 128.
CASES = [
    # dtype, is_causal, B, T, S, N, K, H, Tb, Sb
    ("float32", False, 2, 384, 256, 6, 2, 64, 128, 128),
    ("float32", True, 1, 512, 512, 3, 3, 64, 256, 128),
    ("float32", True, 2, 512, 512, 2, 1, 128, 128, 256),
    ("bfloat16", False, 2, 256, 384, 3, 3, 128, 128, 128),
    ("bfloat16", True, 1, 384, 384, 6, 2, 64, 128, 128),
]


@pytest.mark.parametrize("dtype, is_causal, B, T, S, N, K, H, Tb, Sb", CASES)
def test_forward_and_gradients_equal_naive_within_rounding(
    dtype, is_causal, B, T, S, N, K, H, Tb, Sb
):
    query, key, value = qkv(B, T, S, N, K, H, jnp.dtype(dtype))
    d_out = normal((B, T, N, H), 7).astype(jnp.dtype(dtype))  # weighs every output differently
    kernel = functools.partial(
        pa.pallas_attention, is_causal=is_causal, block_q=Tb, block_k=Sb, interpret=INTERPRET
    )
    naive = functools.partial(jaxloops.attention, is_causal=is_causal)
    got = flatten(outputs_and_grads(kernel, query, key, value, d_out))
    expected = flatten(outputs_and_grads(naive, query, key, value, d_out))
    assert all(g.dtype == jnp.dtype(dtype) for g in got)
    magnitude = rounding_magnitudes(query, key, value, d_out, is_causal=is_causal)
    ratios = errors_over_bounds(got, expected, query, key, magnitude)
    assert max(ratios.values()) <= 1, ratios
    # The bound is tight enough to reject sign-flipped results.
    flipped = errors_over_bounds([-g for g in got], expected, query, key, magnitude)
    assert min(flipped.values()) > 2, flipped


def dropped_rescale(m_ref, l_ref, acc_ref, scores, values):
    """`online_softmax_update` without the accumulator's rescale by exp(m_old - m_new): the
    sum is rescaled, the output is not (a known-wrong step)."""
    m_old = m_ref[...]
    m_new = jnp.maximum(m_old, scores.max(axis=-1, keepdims=True))
    weights = jnp.exp(scores - pallas_kernels.broadcast_lanes(m_new, scores.shape[1]))
    l_ref[...] = l_ref[...] * jnp.exp(m_old - m_new) + weights.sum(axis=-1, keepdims=True)
    acc_ref[...] = acc_ref[...] + pa.mxu_dot(weights.astype(values.dtype), values)
    m_ref[...] = m_new


def heads_major(fn):
    """fn on heads-major arrays, called with and returning the book's (B, T, N, H)."""
    return lambda *qkv: jnp.swapaxes(fn(*(jnp.swapaxes(x, 1, 2) for x in qkv)), 1, 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_bound_rejects_known_wrong_kernels(dtype):
    B, T, N, K, H = 1, 384, 6, 2, 64
    query, key, value = qkv(B, T, T, N, K, H, jnp.dtype(dtype), seed=3)
    d_out = normal((B, T, N, H), 8).astype(jnp.dtype(dtype))
    blocks = pa.make_blocks(T, T, H, dtype, is_causal=True, block_q=128, block_k=128,
                            interpret=INTERPRET)  # fmt: skip
    naive = functools.partial(jaxloops.attention, is_causal=True)
    expected = flatten(outputs_and_grads(naive, query, key, value, d_out))

    def wrong(**change):
        return heads_major(
            functools.partial(pa.heads_major_attention, blocks=blocks._replace(**change))
        )

    # The accumulator not rescaled when the max grows: the output is wrong (its gradients are
    # not computed: the backward kernels do not take the step).
    magnitude = rounding_magnitudes(query, key, value, d_out, is_causal=True)
    out = jax.jit(wrong(update=dropped_rescale))(query, key, value)
    ratios = errors_over_bounds([out, *expected[1:]], expected, query, key, magnitude)
    assert ratios["out"] > 1, ratios
    # The causal mask one key block off: rows near the diagonal see a block of their future,
    # forward and backward.
    got = flatten(outputs_and_grads(wrong(causal_offset=1), query, key, value, d_out))
    ratios = errors_over_bounds(got, expected, query, key, magnitude)
    assert min(ratios.values()) > 1, ratios


def test_blocks_no_query_sees_are_neither_computed_nor_read():
    """Keys after the last query (T < S, causal) are NaN: a kernel that computed their blocks,
    even masked, would multiply NaN values by zero weights and return NaN."""
    B, T, S, N, K, H = 1, 256, 512, 2, 1, 64
    query, key, value = qkv(B, T, S, N, K, H, np.float32, seed=5)
    key[:, T:], value[:, T:] = np.nan, np.nan
    d_out = normal((B, T, N, H), 9)
    kernel = functools.partial(pa.pallas_attention, is_causal=True, block_q=128, block_k=128,
                               interpret=INTERPRET)  # fmt: skip
    out, (dq, dk, dv) = outputs_and_grads(kernel, query, key, value, d_out)
    seen = [x[:, :T] for x in (key, value)]  # the keys the queries see
    naive = functools.partial(jaxloops.attention, is_causal=True)
    expected = flatten(outputs_and_grads(naive, query, *seen, d_out))
    got = [out, dq, np.asarray(dk)[:, :T], np.asarray(dv)[:, :T]]
    magnitude = rounding_magnitudes(query, *seen, d_out, is_causal=True)
    assert max(errors_over_bounds(got, expected, query, seen[0], magnitude).values()) <= 1
    assert np.all(np.asarray(dk)[:, T:] == 0) and np.all(np.asarray(dv)[:, T:] == 0)


def test_the_default_on_a_cpu_is_the_tpu_interpreter():
    if jax.default_backend() == "tpu":
        assert pa.default_interpret() is False
        return
    assert isinstance(pa.default_interpret(), pltpu.InterpretParams)
    B, T, N, K, H = 1, 256, 4, 2, 64
    query, key, value = qkv(B, T, T, N, K, H, jnp.bfloat16, seed=11)
    d_out = normal((B, T, N, H), 12).astype(jnp.bfloat16)
    kernel = functools.partial(pa.pallas_attention, is_causal=True, block_q=128, block_k=128)
    got = flatten(outputs_and_grads(kernel, query, key, value, d_out))
    naive = functools.partial(jaxloops.attention, is_causal=True)
    expected = flatten(outputs_and_grads(naive, query, key, value, d_out))
    magnitude = rounding_magnitudes(query, key, value, d_out, is_causal=True)
    ratios = errors_over_bounds(got, expected, query, key, magnitude, interpret=None)
    assert max(ratios.values()) <= 1, ratios


def test_heads_major_layout_is_the_same_kernel_without_the_transposes():
    query, key, value = qkv(2, 256, 384, 4, 2, 64, np.float32, seed=13)
    run = functools.partial(pa.pallas_attention, block_q=128, block_k=128, interpret=INTERPRET)
    book = run(query, key, value)
    heads = run(*(np.swapaxes(x, 1, 2) for x in (query, key, value)), layout="BNTH")
    assert heads.shape == (2, 4, 256, 64)
    np.testing.assert_array_equal(np.swapaxes(np.asarray(heads), 1, 2), np.asarray(book))


def test_bad_sizes_raise_naming_the_value():
    query, key, value = qkv(1, 384, 384, 4, 2, 64, np.float32)
    run = functools.partial(pa.pallas_attention, interpret=INTERPRET)
    with pytest.raises(ValueError, match=r"block_q 256 must be a positive divisor of T = 384"):
        run(query, key, value, block_q=256)
    with pytest.raises(ValueError, match=r"block_k 96 must be a multiple of 128"):
        run(query, key, value, block_k=96)
    with pytest.raises(ValueError, match=r"layout 'TBNH'"):
        run(query, key, value, layout="TBNH")
    with pytest.raises(ValueError, match=r"dtypes differ: query float32, key bfloat16"):
        run(query, key.astype(jnp.bfloat16), value)
    with pytest.raises(ValueError, match=r"dtype float16 is not one of"):
        run(*(x.astype(np.float16) for x in (query, key, value)))
    with pytest.raises(ValueError, match=r"query has 4 heads, key/value has 3"):
        run(query, key[:, :, :1].repeat(3, 2), value[:, :, :1].repeat(3, 2))
    with pytest.raises(ValueError, match=r"vmem_limit_bytes 0"):
        run(query, key, value, vmem_limit_bytes=0)
    with pytest.raises(ValueError, match=r"head dim H = 192"):
        pa.make_blocks(384, 384, 192, jnp.float32, is_causal=False)
    # A block equal to a length of at most 128 is whole; a longer one must be a multiple.
    assert pa.make_blocks(64, 96, 64, jnp.float32, is_causal=False)[:2] == (64, 96)
    with pytest.raises(ValueError, match=r"block_q 200 must be a multiple of 128"):
        pa.make_blocks(200, 256, 64, jnp.float32, is_causal=False)


def test_default_blocks_are_the_largest_that_divide():
    assert [pa.default_block(n) for n in (8192, 768, 384, 96)] == [512, 256, 128, 96]


def test_vmem_is_predicted_from_the_tiles_padded_to_the_lanes():
    blocks = pa.make_blocks(1024, 1024, 64, jnp.bfloat16, is_causal=False, block_q=128,
                            block_k=256, interpret=True)  # fmt: skip
    KiB = 1024
    # A (128, 64) bfloat16 tile fills (128, 128) lanes: 32 KiB; (256, 64): 64 KiB. Query,
    # key, value, output twice each; the log-sum-exp (128, 128) float32 twice.
    assert pa.tile_bytes((128, 64), jnp.bfloat16) == 32 * KiB
    assert pa.tile_bytes((1, 128), jnp.float32) == pa.tile_bytes((1, 128), jnp.bfloat16) == 4 * KiB
    parts = pa.forward_vmem_bytes(blocks, 64, jnp.bfloat16)
    assert parts["tiles"] == 2 * (32 + 64 + 64 + 32 + 64) * KiB
    assert parts["scratch"] == (64 + 64 + 64) * KiB  # max, sum, (128, 64) float32 output
    assert parts["temporaries"] == (2 * 128 + 64) * KiB  # (128, 256) float32 twice, bf16 once
    # H 64 takes as much VMEM as H 128: half of every lane row is padding.
    assert pa.forward_vmem_bytes(blocks, 128, jnp.bfloat16) == parts


def test_the_kernels_products_are_measured():
    error = pa.matmul_error(INTERPRET)
    assert 0 < error < 1e-2
    if jax.default_backend() == "cpu":  # float32 dots of 128 terms, each step rounded once
        bound = 128 * np.finfo(np.float32).eps / 2
        assert error <= bound
        # Operands rounded to bfloat16 first, as a TPU's default precision does: far above.
        a, b = normal((2, 128, 128), 0)
        rounded = [x.astype(jnp.bfloat16).astype(np.float32) for x in (a, b)]
        assert pa.product_error(rounded[0] @ rounded[1], a, b) > 100 * bound
