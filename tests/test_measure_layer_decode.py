"""Chapter 10's whole-layer decode step: the bytes it reads (weights plus cache), its loop
that writes the cache in place, and the page's claim that MQA's lead grows with the cache."""

import jax
import jax.numpy as jnp
import pytest

from jaxloops import measure
from jaxloops.kvcache import drop_unit_axes
from jaxloops.measure import layer_decode
from jaxloops.pages import ch10_heads_and_cache as page
from jaxloops.transformer import init_transformer, kv_cache_for

HEADS, HEAD_DIM, BATCH = 4, 8, 2


def params_for(length, kv):
    config = layer_decode.layer_config(length, kv, heads=HEADS, head_dim=HEAD_DIM)
    return init_transformer(jax.random.key(0), config)


def test_a_step_reads_every_matrix_and_one_row_of_each_table_it_looks_up():
    params = params_for(64, 2)
    D, K, H, F, V = HEADS * HEAD_DIM, 2, HEAD_DIM, 4 * HEADS * HEAD_DIM, layer_decode.VOCAB
    matrices = D * HEADS * H * 2 + D * K * H * 2 + D * F * 2 + D * V  # q, out; k, v; mlp; unembed
    scales = 3 * D  # two norms in the block, one at the end
    rows = (BATCH + 1) * D  # a token row per sequence, one position row
    assert layer_decode.weight_bytes(params, BATCH) == 4 * (matrices + scales + rows)
    # the whole position table is not read: counting it would be off by 63 rows
    assert layer_decode.weight_bytes(params, BATCH) < measure.compiled.dtype_bytes("f32") * (
        matrices + scales + 64 * D
    )


def test_the_crossover_is_where_the_cache_holds_as_many_bytes_as_the_weights():
    S = layer_decode.crossover_length(2**20, batch=4, kv_heads=2, head_dim=64, itemsize=2)
    assert 2 * 4 * 2 * S * 64 * 2 == 2**20


def test_the_sweep_counts_weights_and_cache_and_its_loop_copies_no_cache():
    rows = layer_decode.layer_decode_sweep(
        jax.random.key(1), (16, 32), (HEADS, 1), batch=BATCH, heads=HEADS, head_dim=HEAD_DIM,
        dtype=jnp.float32, repeats=1, steps=3)  # fmt: skip
    assert [(r["K"], r["S"]) for r in rows] == [(4, 16), (1, 16), (4, 32), (1, 32)]
    for r in rows:
        assert r["cache_bytes"] == 2 * BATCH * r["K"] * r["S"] * HEAD_DIM * 4  # K and V, L = 1
        assert r["bytes"] == r["weight_bytes"] + r["cache_bytes"]
        # at least the matmuls with the weights: 2 FLOPs per weight and token
        assert r["flops"] >= 2 * BATCH * (r["weight_bytes"] / 4 - (BATCH + 1) * HEADS * HEAD_DIM)
        assert r["seconds"] > 0 and len(r["round_seconds"]) == 1
    params = params_for(32, 1)
    cache = drop_unit_axes(kv_cache_for(params, BATCH, 32))
    token = jnp.zeros((BATCH, 1), jnp.int32)
    compiled = jax.jit(layer_decode._steps, static_argnames="steps", donate_argnums=2).lower(
        params, token, cache, steps=3).compile()  # fmt: skip
    assert measure.loop_copies(compiled, BATCH * 32 * HEAD_DIM) == 0


def test_the_cache_carried_as_given_is_copied_each_step_only_where_that_was_measured():
    """The control for drop_unit_axes: carried as given, (B, 1, S, H), the same loop copies its
    cache on XLA:CPU; XLA:TPU (a v5e, compiled ahead of time and on the chip) makes no copy of
    either form. Each backend's measured fact is checked; a GPU's was never measured."""
    params = params_for(32, 1)
    token = jnp.zeros((BATCH, 1), jnp.int32)
    as_given = jax.jit(layer_decode._steps, static_argnames="steps").lower(
        params, token, kv_cache_for(params, BATCH, 32), steps=3).compile()  # fmt: skip
    copies = measure.loop_copies(as_given, BATCH * 32 * HEAD_DIM)
    if jax.default_backend() == "cpu":
        assert copies > 0
    elif jax.default_backend() == "tpu":
        assert copies == 0
    else:
        pytest.skip(f"this loop's copies were never measured on a {jax.default_backend()}")


def rows_with(short_mha, long_mha):
    """MQA at 1 ms in every round; MHA's rounds as given; bytes of weights 100, caches K * S."""
    rows = []
    for S, mha_rounds in ((8, short_mha), (64, long_mha)):
        for K, rounds in ((4, mha_rounds), (2, [1.5e-3] * 3), (1, [1e-3] * 3)):
            cache = K * S
            row = {"K": K, "S": S, "seconds": sorted(rounds)[1], "round_seconds": rounds}
            rows.append({**row, "weight_bytes": 100, "cache_bytes": cache,
                         "bytes": 100 + cache, "predicted": 1e-3})  # fmt: skip
    return rows


def test_the_lead_must_grow_past_the_short_caches_rounds_and_a_flat_one_fails():
    grows = page.layer_decode_figures(rows_with([1.1e-3, 1.2e-3, 1.4e-3], [3e-3] * 3), (4, 2, 1))
    assert grows["short_lead"] == pytest.approx(1.2) and grows["long_lead"] == pytest.approx(3)
    assert grows["short_lead_high"] == pytest.approx(1.4) and grows["long_lead_low"] == 3
    assert grows["short_lead_predicted"] == pytest.approx(132 / 108)
    assert grows["gqa_of_roofline"] == pytest.approx(1e-3 / 1.5e-3)
    assert page.lead_grows(grows)
    # A lead above the short cache's median by less than the margin: no growth shown
    flat = page.layer_decode_figures(rows_with([1.1e-3, 1.2e-3, 1.4e-3], [1.3e-3] * 3), (4, 2, 1))
    assert not page.lead_grows(flat)
    with pytest.raises(ValueError, match="need every K"):
        page.layer_decode_figures(rows_with([1e-3] * 3, [3e-3] * 3)[:5], (4, 2, 1))
    table = page.layer_decode_table(rows_with([1.2e-3] * 3, [3e-3] * 3), 4)
    assert table[0]["kind"] == "MHA" and table[0]["weights' share of bytes"] == 100 / 132
