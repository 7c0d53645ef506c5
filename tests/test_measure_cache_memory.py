"""Chapter 10's harness: each decode loop compiled, its copies and scratch read."""

import jax
import jax.numpy as jnp

import jaxloops
from jaxloops import measure


def test_loop_memory_rows_finds_the_copy_that_unit_axes_cause():
    @jax.jit
    def copied(queries, keys, values, cache_key, cache_value, start):
        return queries, cache_key + 0, cache_value  # no donation: nothing aliased

    rows = measure.cache_memory.loop_memory_rows(
        {"drop_unit_axes": jaxloops.decode_tokens, "copied": copied},
        heads=6,
        head_dim=5,
        length=7,
        steps=3,
        batches=(1,),
        kv_choices=(3, 1),
        dtype=jnp.float32,
    )
    assert [(r["B"], r["K"], r["kind"]) for r in rows] == [(1, 3, "GQA"), (1, 1, "MQA")]
    for row in rows:
        assert row["cache MiB (K and V)"] == 2 * row["K"] * 7 * 5 * 4 / 2**20
        assert row["copies, drop_unit_axes"] == 0 and row["copies, copied"] == 0  # no loop
        assert row["aliased MiB"] == 0  # the last loop, `copied`, donates nothing
