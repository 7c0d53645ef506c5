import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from backend_marks import xla_cpu_only
from jaxloops import measure
from jaxloops.attention import attention_rounding_bound, softmax


def test_reference_matches_naive_in_float64_terms():
    query, key_, value = measure.random_qkv(
        jax.random.key(0), batch=3, length=7, heads=6, head_dim=5, kv_heads=2
    )
    expected = measure.reference_attention(query, key_, value, is_causal=True)
    assert expected.dtype == np.float64
    got = jaxloops.attention(query, key_, value, is_causal=True)
    # Within this backend's rounding of one attention (derived; its rejection of wrong
    # answers is tests/test_attention.py's).
    bound = attention_rounding_bound(query, key_, np.abs(np.asarray(value)).max())
    np.testing.assert_allclose(got, expected, rtol=0, atol=bound)


def test_naive_scratch_and_flops_grow_with_the_square_of_length():
    rows = measure.attention_sweep(
        jax.random.key(0),
        (16, 32),
        [("naive", "float32")],
        batch=3,
        heads=5,
        head_dim=7,
        block_size=8,
        repeats=1,
        materialise_max_length=32,
    )
    small, large = rows
    assert small["temp_bytes"] >= 3 * 5 * 16 * 16 * 4  # the (B, N, T, S) float32 scores
    assert large["flops"] == pytest.approx(4 * small["flops"], rel=0.05)
    assert small["seconds"] > 0 and small["error"] == ""


def test_numerics_table_reports_errors_and_refusals():
    rows = measure.numerics_table(
        jax.random.key(0),
        ["naive", "cudnn"],
        ["float32"],
        batch=1,
        length=9,
        heads=3,
        head_dim=8,
        block_size=4,
    )
    naive, cudnn = rows
    assert naive["max_abs_error"] < 1e-5 and naive["error"] == ""
    if jax.default_backend() == "cpu":
        assert cudnn["max_abs_error"] is None and "cuDNN" in cudnn["error"]


def test_causal_sweep_pairs_full_and_causal_calls():
    rows = measure.causal_sweep(
        jax.random.key(0),
        (12,),
        ("naive", "blockwise"),
        dtype="float32",
        batch=1,
        heads=3,
        head_dim=5,
        block_size=4,
        repeats=3,
        materialise_max_length=12,
    )
    assert [(r["implementation"], r["T"]) for r in rows] == [("naive", 12), ("blockwise", 12)]
    for row in rows:
        assert row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
        assert row["rounds"] == 3 and 0 <= row["causal_wins"] <= 3
    naive = rows[0]
    # Masking does not remove work from a program that builds the whole (T, S) matrix.
    assert naive["causal_flops"] >= naive["full_flops"]


@functools.partial(jax.jit, donate_argnums=(3, 4))
def _carried_as_given(queries, keys, values, cache_key, cache_value):
    """decode_tokens' scan without drop_unit_axes: the (B, K, S, H) cache is the carry."""

    def step(carry, new):
        cache_key, cache_value, position = carry
        out, cache_key, cache_value = jaxloops.decode_step(
            *(x[:, None] for x in new), cache_key, cache_value, position
        )
        return (cache_key, cache_value, position + 1), out

    tokens_first = tuple(x.swapaxes(0, 1) for x in (queries, keys, values))
    return jax.lax.scan(step, (cache_key, cache_value, 0), tokens_first)


@xla_cpu_only("the loop body made no copy of the cache (loop_copies 0)")
def test_loop_copies_counts_the_cache_copies_a_loop_body_makes():
    batch, heads, kv_heads, slots, head_dim, steps = 1, 6, 3, 128, 5, 7  # B = 1: a size-1 axis
    queries = jax.ShapeDtypeStruct((batch, steps, heads, head_dim), jnp.float32)
    new = jax.ShapeDtypeStruct((batch, steps, kv_heads, head_dim), jnp.float32)
    cache = jax.ShapeDtypeStruct((batch, kv_heads, slots, head_dim), jnp.float32)
    elements = batch * kv_heads * slots * head_dim
    as_given = _carried_as_given.lower(queries, new, new, cache, cache).compile()
    carried = jaxloops.decode_tokens.lower(queries, new, new, cache, cache, 0).compile()
    assert measure.loop_copies(as_given, elements) >= 1  # the products' reshaped copy
    assert measure.loop_copies(carried, elements) == 0
    assert measure.loop_copies(as_given, elements + 1) == 0  # only arrays of that size count


def test_softmax_control_keeps_the_passes_and_bytes_but_no_exponential():
    # At the scores chapter 8 profiles on this backend (`naive_attention_parts`: B 1, its N
    # heads, T = S its shortest length; a CPU (1, 4, 256, 256), a TPU (1, 8, 1024, 1024)),
    # scaled as there, compiled only. The passes are the compiler's choice and depend on the
    # shape: at (2, 3, 16, 128) a TPU v5e (JAX 0.10.2) fused the real softmax into one kernel
    # (147,456 bytes) and wrote the control's weights from a kernel of their own (294,912).
    a = jaxloops.experiment_sizes().attention
    shape = jax.ShapeDtypeStruct((1, a.heads, a.lengths[0], a.lengths[0]), jnp.float32)
    scale = 1.0 / math.sqrt(a.head_dim)
    real = measure.compiled_costs(lambda s: softmax(s * scale), shape)
    control = measure.compiled_costs(lambda s: measure.softmax_without_exp(s * scale), shape)
    elements = math.prod(shape.shape)
    assert real["transcendentals"] >= elements and control["transcendentals"] == 0
    assert control["bytes_accessed"] == pytest.approx(real["bytes_accessed"], rel=0.05)
    scores = np.random.default_rng(0).standard_normal((2, 3, 16, 128)).astype(np.float32)
    # One jitted call, not a program per eager operation; the softmax's weights in NumPy.
    weights = np.asarray(jax.jit(measure.softmax_without_exp)(scores))
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)  # rows still sum to one...
    exp = np.exp(scores - scores.max(-1, keepdims=True))
    assert np.abs(weights - exp / exp.sum(-1, keepdims=True)).max() > 0.01  # ...


def test_naive_parts_include_their_controls_in_the_same_rotation():
    rows = measure.naive_attention_parts(jax.random.key(0), T=24, heads=3, head_dim=5, repeats=3)
    part = {row["part"]: row for row in rows}
    no_exp = part["control: softmax, exp → 1 / (1 - x)"]
    square = part["control: square matmul, FLOPs of Q Kᵀ"]
    assert no_exp["transcendentals"] == 0 < part["softmax"]["transcendentals"]
    # n^3 rounds the cube root: within (1 +- 1/n)^3 of the scores matmul's FLOPs.
    assert square["flops"] == pytest.approx(part["scores: Q Kᵀ"]["flops"], rel=0.2)
    assert all(len(row["samples"]) == 3 for row in rows)


@xla_cpu_only("no layout compiled to a transposing copy (0 for (B, S, K, H))")
def test_layout_control_computes_one_step_four_ways_and_finds_the_transposes():
    rows = measure.decode_layout_control(
        jax.random.key(0), batch=2, length=13, heads=3, head_dim=5, dtype="float32", repeats=1
    )
    cell = {(row["function"], row["layout"]): row for row in rows}
    assert len(cell) == 4
    assert max(row["difference"] for row in rows) < 1e-5  # the same attention step, four ways
    assert cell["decode_attention", "(B, K, S, H)"]["transposes"] == 0
    assert cell["decode_attention", "(B, S, K, H)"]["transposes"] >= 1
    assert all(row["seconds"] > 0 for row in rows)
