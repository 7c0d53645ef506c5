import jax
import numpy as np
import pytest

import jaxloops
from jaxloops import measure


def test_reference_matches_naive_in_float64_terms():
    query, key_, value = measure.random_qkv(
        jax.random.key(0), batch=3, length=7, heads=6, head_dim=5, kv_heads=2
    )
    expected = measure.reference_attention(query, key_, value, is_causal=True)
    assert expected.dtype == np.float64
    np.testing.assert_allclose(
        jaxloops.attention(query, key_, value, is_causal=True), expected, atol=2e-6
    )


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
