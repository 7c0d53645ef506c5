import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from conftest import normal
from jaxloops import measure, rounding
from jaxloops.attention import attention_rounding_bound
from jaxloops.blockwise import (
    Tiling,
    choose_tiling,
    computed_scores,
    default_blocks,
    from_tiles,
    heads_per_step,
    splits_diagonal,
    to_tiles,
    unmasked_key_blocks,
    unrolls,
    visible_key_blocks,
)


def assert_within_rounding(got, expected, query, key, scale, name="", grad=False):
    """Equal up to the rounding this backend commits (`attention_rounding_bound`, with its
    measured eps; a `grad`'s with log's too: blockwise's backward recomputes the weights from
    the log-sum-exp it saved), and the bound tight enough to reject the sign-flipped answer."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    ops = (*rounding.ATTENTION, "log") if grad else rounding.ATTENTION
    bound = attention_rounding_bound(query, key, scale, eps=rounding.backend_eps(ops))
    assert np.abs(got - expected).max() <= bound, (name, np.abs(got - expected).max(), bound)
    assert np.abs(-got - expected).max() > 100 * bound, f"{name}: sign-flipped not rejected"


def qkv(t, s, heads, kv_heads, head_dim=5, batch=3):
    return (
        normal((batch, t, heads, head_dim), 1),
        normal((batch, s, kv_heads, head_dim), 2),
        normal((batch, s, kv_heads, head_dim), 3),
    )


# Odd sizes; T > S and T < S; blocks that do not divide the lengths (and one bigger than
# both); MHA, GQA and MQA; parallel query blocks that do not divide the number of blocks;
# every tile walking alone, several heads a step, and all B * K heads a step. unroll: None
# is the default (short causal calls with T = S unroll), False walks, True unrolls.
CASES = [
    (13, 11, 3, 4, 2, True, 1, None),
    (9, 13, 6, 3, 4, False, 30, None),
    (9, 13, 6, 3, 4, False, 30, True),  # full attention unrolled: a tile sees every key
    (11, 7, 1, 16, 4, True, 2048, None),
    (7, 19, 2, 4, 3, True, 2048, None),
    (7, 19, 2, 4, 3, True, 1, None),
    # T = S, tiles of whole blocks: each masked block folded into the rows that see it
    # (splits_diagonal), GQA (G = 3) and MHA, several heads a step and one; walked ...
    (24, 24, 2, 4, 3, True, 2048, False),
    (16, 16, 6, 4, 2, True, 1, False),
    # ... and unrolled (the default here), in tiles of 8 with the last one padded.
    (24, 24, 2, 4, 3, True, 2048, None),
    (20, 20, 6, 4, 2, True, 1, None),
]


@pytest.mark.parametrize(
    "t, s, kv_heads, block_size, parallel, is_causal, rows_per_step, unroll", CASES
)
def test_blockwise_forward_and_gradients_equal_naive(
    t, s, kv_heads, block_size, parallel, is_causal, rows_per_step, unroll
):
    query, key, value = qkv(t, s, 6, kv_heads)
    weights = normal((3, t, 6, 5), 4)  # a loss that weighs every output differently
    blockwise = functools.partial(
        jaxloops.blockwise_attention,
        is_causal=is_causal,
        block_size=block_size,
        parallel_blocks=parallel,
        rows_per_step=rows_per_step,
        unroll=unroll,
    )
    naive = functools.partial(jaxloops.attention, is_causal=is_causal)

    @jax.jit
    def outputs_and_grads(query, key, value):
        def value_and_grads(fn):
            loss = lambda q, k, v: (fn(q, k, v) * weights).sum()
            return fn(query, key, value), jax.grad(loss, argnums=(0, 1, 2))(query, key, value)

        return value_and_grads(blockwise), value_and_grads(naive)

    (got, got_grads), (expected, expected_grads) = outputs_and_grads(query, key, value)
    assert_within_rounding(got, expected, query, key, np.abs(value).max())
    for name, g, e in zip("qkv", got_grads, expected_grads):
        assert g.shape == e.shape, name
        assert_within_rounding(g, e, query, key, np.abs(np.asarray(e)).max(), f"d{name}", True)


@jax.jit
def causal_output_and_value_grad(query, key, value):
    """Blockwise causal attention in blocks of 4, and d(sum of outputs)/d value: one program
    (eagerly, the gradient's small operations would each compile on their own)."""
    attend = lambda v: jaxloops.blockwise_attention(query, key, v, is_causal=True, block_size=4)
    return attend(value), jax.grad(lambda v: attend(v).sum())(value)


def test_blockwise_agrees_with_float64_reference_forward_and_backward():
    query, key, value = qkv(10, 9, 6, 2, head_dim=4, batch=2)
    got, grad = map(np.asarray, causal_output_and_value_grad(query, key, value))
    expected = measure.reference_attention(query, key, value, is_causal=True)
    assert_within_rounding(got, expected, query, key, np.abs(value).max())  # float64: exact
    # d(sum of outputs)/d value: each key's total weight over the rows that see it.
    step = 1e-3
    bumped = value.astype(np.float64).copy()
    bumped[0, 3, 1, 2] += step
    numeric = (
        measure.reference_attention(query, key, bumped, is_causal=True).sum() - expected.sum()
    ) / step
    # The outputs are linear in the values: the float64 difference quotient is exact (to
    # float64's rounding over the step, ~1e-13), so the gradient is held to rounding alone.
    scale = np.abs(grad).max()
    assert_within_rounding(grad[0, 3, 1, 2], numeric, query, key, scale, "dv", grad=True)


def test_gradient_scratch_is_a_small_fraction_of_naive():
    # The compiled scratch of jax.grad of a scalar loss (deterministic: no timing). At this
    # size naive keeps several (T, S) arrays per head for the backward pass; blockwise keeps
    # O(T + S) residuals and one tile's worth of work at a time. Key blocks of 128, a TPU's
    # lane width: a TPU pads an array's minor dim to whole 128-lane tiles, and blocks of 32
    # stored each block's (32, H) keys and values in 4 times their bytes (a TPU v5e at
    # T = 512: blockwise 1,699,328 bytes, naive 4,399,104; a CPU 445,008 and 8,458,240).
    T, N = 1024, 2
    spec = jax.ShapeDtypeStruct((1, T, N, 16), jnp.float32)  # (B, T, N, H), T = S

    def grad_temp_bytes(fn):
        loss = lambda q, k, v: fn(q, k, v).sum()
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(spec, spec, spec).compile()
        return measure.compiled.scratch_bytes(compiled.memory_analysis())

    naive = grad_temp_bytes(jaxloops.attention)
    blockwise = grad_temp_bytes(
        functools.partial(jaxloops.blockwise_attention, block_size=128, parallel_blocks=2)
    )
    # At least the (B, N, T, S) float32 weights, which the backward pass needs (a CPU keeps
    # four such arrays; a TPU v5e two, at precision "highest"; at the default precision, 1.6).
    assert naive >= T * T * N * 4
    assert blockwise * 8 <= naive, (blockwise, naive)


def test_heads_walk_together_while_their_rows_fit():
    assert heads_per_step(4, 2048) == 1  # one tile already has all the rows a step may have
    assert heads_per_step(32, 128) == 16  # 16 x 128 = 2048
    assert heads_per_step(6, 700) == 2  # divisors of 6: 3 x 700 > 2048
    assert heads_per_step(5, 9999) == 1  # a tile larger than a step still walks
    assert heads_per_step(6, 4, max_rows=24) == 6


def test_causal_query_tiles_see_only_the_key_blocks_up_to_their_last_query():
    tiling = Tiling(T=20, S=20, Tq=8, Sb=3, is_causal=True)
    # Tiles of 8 queries: the first ends at query 7 (key block 2 holds keys 6-8), the
    # second at 15 (block 5), the third at 23, capped at the 7 blocks there are.
    counts = [int(visible_key_blocks(tile, tiling, 7)) for tile in range(3)]
    assert counts == [3, 6, 7]
    assert visible_key_blocks(0, tiling._replace(is_causal=False), 7) == 7


def test_only_blocks_that_cross_the_diagonal_or_hold_padding_are_masked():
    tiling = Tiling(T=20, S=20, Tq=8, Sb=3, is_causal=True)
    # Tile 0 starts at query 0: no block is whole to it. Tile 1 starts at query 8: blocks
    # 0-2 (keys 0-8) are, block 3 (keys 9-11) is not. Tile 2 starts at 16: blocks 0-4
    # (keys 0-14), and block 5 (keys 15-17) crosses; block 6 holds padded keys 20 and 21.
    assert [int(unmasked_key_blocks(tile, tiling, 7)) for tile in range(3)] == [0, 3, 5]
    full = tiling._replace(is_causal=False)
    assert unmasked_key_blocks(0, full, 7) == 6  # every block but the padded last one
    assert unmasked_key_blocks(0, full._replace(S=21), 7) == 7  # no padding: none masked


def test_default_tiles_depend_on_length_and_causality():
    # Full attention: one tiling at every length.
    assert {default_blocks(t, False) for t in (7, 512, 1024, 4096)} == {(512, 4)}
    # Causal, up to T = 1024: blocks of 128, query tiles of 256 (at most four, unrolled).
    assert {default_blocks(t, True) for t in (7, 512, 700, 1024)} == {(128, 2)}
    # Longer: key blocks of T / 4 (a power of two, 128 to 256), query tiles of 512.
    assert default_blocks(1025, True) == (256, 2)  # T / 4 = 256
    assert default_blocks(2048, True) == (256, 2)
    assert default_blocks(4096, True) == (256, 2)
    assert default_blocks(1500, True) == (256, 2)  # 375 rounds down to 256
    assert default_blocks(np.int64(2048), True) == (256, 2)
    # From T = 1024 on, the causal tiling has at least 2 query tiles and 4 key blocks, so it
    # skips blocks above the diagonal; full attention walks all of them.
    for t in (1024, 2048, 4096, 8192, 16384):
        block, parallel = default_blocks(t, True)
        assert t // (block * parallel) >= 2 and t // block >= 4, t
    with pytest.raises(ValueError, match="T must be >= 1, got 0"):
        default_blocks(0, True)


def walked_and_masked(tiling: Tiling, n_query_tiles: int, n_key_blocks: int):
    """(tile, block) pairs the causal walk folds, and those it masks, as the walk counts."""
    walked = sum(int(visible_key_blocks(c, tiling, n_key_blocks)) for c in range(n_query_tiles))
    whole = sum(int(unmasked_key_blocks(c, tiling, n_key_blocks)) for c in range(n_query_tiles))
    return walked, walked - whole


@pytest.mark.parametrize(
    "t, s, tq, sb", [(20, 20, 8, 3), (1024, 1024, 512, 256), (2048, 2048, 512, 256), (13, 17, 4, 5)]
)
def test_causal_schedule_walks_the_blocks_of_the_triangle_and_masks_its_diagonal(t, s, tq, sb):
    tiling = Tiling(T=t, S=s, Tq=tq, Sb=sb, is_causal=True)
    n_tiles, n_blocks = -(-t // tq), -(-s // sb)
    # Brute force over every (query, key) position of the padded grid: query q sees key k
    # when k <= q and k is a real key.
    q_pos, k_pos = np.arange(n_tiles * tq), np.arange(n_blocks * sb)
    sees = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] < s)
    sees = sees.reshape(n_tiles, tq, n_blocks, sb)
    some, every = sees.any(axis=(1, 3)), sees.all(axis=(1, 3))  # (tiles, blocks)
    assert walked_and_masked(tiling, n_tiles, n_blocks) == (some.sum(), (some & ~every).sum())
    # The blocks walked are a prefix of each tile's row: nothing after a skipped block is seen.
    assert all(row[: row.sum()].all() for row in some)


def test_default_causal_tiling_skips_the_blocks_its_prediction_counts():
    # Chapter 9's prediction: full attention folds every (tile, block) pair of a Tq x Sb grid,
    # causal only those of the triangle. With the defaults at T = 2048: 4 tiles of 512 walk
    # 2, 4, 6 and 8 of the 8 key blocks of 256, 20 of 32; at T = 1024, 4 tiles of 256 see
    # 2, 4, 6 and 8 of the 8 blocks of 128, 20 of 32 (unrolled, those before a tile are
    # folded as one block, of as many scores).
    for t, expected in ((1024, (20, 32)), (2048, (20, 32))):
        block, parallel = default_blocks(t, True)
        tiling = Tiling(T=t, S=t, Tq=block * parallel, Sb=block, is_causal=True)
        walked, _ = walked_and_masked(tiling, t // tiling.Tq, t // block)
        assert (walked, (t // tiling.Tq) * (t // block)) == expected


@pytest.mark.parametrize("t, tq, sb", [(1024, 512, 256), (2048, 512, 256), (24, 12, 4), (20, 4, 4)])
def test_split_diagonal_computes_the_triangle_and_only_the_rows_it_skips_see_nothing(t, tq, sb):
    tiling = Tiling(T=t, S=t, Tq=tq, Sb=sb, is_causal=True)
    assert splits_diagonal(tiling)
    n_tiles, n_blocks, m = t // tq, t // sb, tq // sb
    sees = np.tril(np.ones((t, t), bool)).reshape(n_tiles, tq, n_blocks, sb)  # k <= q
    computed = 0
    for c in range(n_tiles):
        walked = int(visible_key_blocks(c, tiling, n_blocks))
        for j in range(walked):
            skip = max(0, j - (walked - m)) * sb  # masked block j - (walked - m) skips rows
            assert not sees[c, :skip, j].any(), (c, j)  # the skipped rows see none of it
            computed += (tq - skip) * sb
        assert not sees[c, :, walked:].any()  # nor any block after the walk
    assert computed == computed_scores(tiling, n_tiles, n_blocks)
    assert computed >= sees.sum()  # every visible score is among them


def test_split_diagonal_prediction_at_the_default_tiles():
    # T = 1024, tiles of 256, blocks of 128: tile c computes c x 256 x 256 unmasked scores
    # and 256 x 128 + 128 x 128 on its diagonal: 589,824 of 1,048,576 (1.78x fewer);
    # T = 2048: 2,359,296 of 4,194,304 (1.78x). Not split (T != S): every walked block whole.
    full = lambda t: t * t
    for t, expected in ((1024, 589_824), (2048, 2_359_296)):
        block, parallel = default_blocks(t, True)
        tiling = Tiling(T=t, S=t, Tq=block * parallel, Sb=block, is_causal=True)
        assert computed_scores(tiling, t // tiling.Tq, t // block) == expected
        assert computed_scores(
            tiling._replace(is_causal=False), t // tiling.Tq, t // block
        ) == full(t)
    unaligned = Tiling(T=20, S=21, Tq=8, Sb=4, is_causal=True)
    assert not splits_diagonal(unaligned)
    assert computed_scores(unaligned, 3, 6) == (2 + 4 + 6) * 8 * 4


@functools.cache
def lowered_text(**options) -> str:
    """The lowered program of blockwise_attention(**options) at T = S = 1024, B = K = 1,
    N = 2, H = 3: lowered once for the tests that read it."""
    query, key, value = qkv(1024, 1024, 2, 1, head_dim=3, batch=1)
    attend = functools.partial(jaxloops.blockwise_attention, **options)
    return jax.jit(attend).lower(query, key, value).as_text()


def test_default_tiling_is_what_a_call_without_sizes_uses():
    for is_causal in (False, True):
        block, parallel = default_blocks(1024, is_causal)
        default = lowered_text(is_causal=is_causal)
        explicit = lowered_text(is_causal=is_causal, block_size=block, parallel_blocks=parallel)
        other = lowered_text(is_causal=is_causal, block_size=64, parallel_blocks=1)
        assert default == explicit and default != other, is_causal


def test_short_causal_calls_run_unrolled_and_the_rest_walk():
    assert unrolls(Tiling(T=1024, S=1024, Tq=256, Sb=128, is_causal=True))  # 4 tiles
    assert unrolls(Tiling(T=20, S=20, Tq=8, Sb=4, is_causal=True))  # the last tile padded
    assert not unrolls(Tiling(T=1024, S=1024, Tq=128, Sb=128, is_causal=True))  # 8 tiles
    assert not unrolls(Tiling(T=2048, S=2048, Tq=1024, Sb=256, is_causal=True))  # T > 1024
    assert not unrolls(Tiling(T=1024, S=1024, Tq=256, Sb=128, is_causal=False))  # full
    assert not unrolls(Tiling(T=20, S=21, Tq=8, Sb=4, is_causal=True))  # T != S
    assert not unrolls(Tiling(T=24, S=24, Tq=12, Sb=8, is_causal=True))  # 12 % 8 != 0
    # The compiled programs: the default causal call at T = 1024 has no loop, the walk has.
    assert "while" not in lowered_text(is_causal=True)
    assert "while" in lowered_text(is_causal=True, unroll=False)
    with pytest.raises(ValueError, match="unroll=True needs T = S and query tiles of whole"):
        jaxloops.blockwise_attention(*qkv(13, 11, 2, 1), is_causal=True, unroll=True)


def test_online_softmax_over_two_blocks_equals_softmax():
    scores = 4.0 * normal((3, 10), 1)  # (R, S)
    value = normal((10, 5), 2)  # (S, H)
    carry = (
        np.full((3,), -1e30, np.float32),
        np.zeros((3,), np.float32),
        np.zeros((3, 5), np.float32),
    )

    @jax.jit
    def two_blocks(carry, scores, value):
        carry = jaxloops.online_softmax_step(carry, scores[:, :4], value[:4])
        return jaxloops.online_softmax_step(carry, scores[:, 4:], value[4:])

    _, total, out = map(np.asarray, two_blocks(carry, scores, value))
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = weights @ value  # (R, H)
    np.testing.assert_allclose(out / total[..., None], expected, atol=1e-6)


def test_bad_block_size_and_shapes_raise():
    query, key, value = qkv(7, 7, 6, 3)
    with pytest.raises(ValueError, match="block_size and parallel_blocks must be >= 1, got 0, 4"):
        jaxloops.blockwise_attention(query, key, value, block_size=0)
    with pytest.raises(ValueError, match="got 8, 0"):
        jaxloops.blockwise_attention(query, key, value, block_size=8, parallel_blocks=0)
    with pytest.raises(ValueError, match=r"rows_per_step \(max_rows\) must be >= 1, got 0"):
        jaxloops.blockwise_attention(query, key, value, block_size=8, rows_per_step=0)
    with pytest.raises(ValueError, match="6 heads, key/value has 4"):
        jaxloops.blockwise_attention(query, *qkv(7, 7, 6, 4)[1:])


def test_from_tiles_puts_every_query_row_back_where_to_tiles_took_it():
    # T = 7 padded to tiles of 4 queries, G = 3 query heads per K = 2 kv heads, two per step.
    query, key, value = qkv(7, 5, 6, 2)
    tiles = to_tiles(query, key, value, 4, 2, 2)[0]  # (steps, per_step, G * Tq, H)
    assert tiles.shape == (3 * 2 * 2 // 2, 2, 3 * 4, 5)
    np.testing.assert_array_equal(from_tiles(tiles, 3, 6, 2, 7), query)


def test_the_tiling_clips_blocks_to_the_lengths_and_tiles_to_the_blocks_there_are():
    # T = 700, causal: blocks of 128, two to a tile (default_blocks); S = 100 < 128.
    assert choose_tiling(700, 100, True) == Tiling(700, 100, 256, 100, True)
    # Seven queries in blocks of 3: three blocks, so a tile of 4 blocks holds 3 (9 rows).
    assert choose_tiling(7, 7, False, block_size=3, parallel_blocks=4) == Tiling(7, 7, 9, 3, False)
    assert choose_tiling(2048, 2048, True) == Tiling(2048, 2048, 512, 256, True)


def test_empty_and_integer_inputs_raise_naming_them():
    query, key, value = qkv(7, 7, 6, 3)
    with pytest.raises(ValueError, match=r"query \(3, 0, 6, 5\) has an empty axis"):
        jaxloops.blockwise_attention(query[:, :0], key, value)
    with pytest.raises(ValueError, match=r"key \(3, 0, 3, 5\) has an empty axis"):
        jaxloops.blockwise_attention(query, key[:, :0], value[:, :0])
    with pytest.raises(ValueError, match="key must be floating point, got int32"):
        jaxloops.blockwise_attention(query, key.astype(np.int32), value)


def test_plain_autodiff_control_gives_the_same_gradient_with_more_scratch():
    query, key, value = qkv(24, 24, 2, 2, head_dim=3, batch=1)
    loss = lambda fn: lambda q, k, v: (fn(q, k, v) ** 2).sum()
    grads = {
        custom: jax.grad(
            loss(
                functools.partial(
                    jaxloops.blockwise_attention, block_size=8, parallel_blocks=1, custom_vjp=custom
                )
            ),
            argnums=(0, 1, 2),
        )
        for custom in (True, False)
    }
    # Each gradient compiled once: its values and its scratch come from the same program.
    compiled = {
        custom: jax.jit(grad).lower(query, key, value).compile() for custom, grad in grads.items()
    }
    plain_grads, custom_grads = (compiled[c](query, key, value) for c in (False, True))
    for name, got, expected in zip("qkv", plain_grads, custom_grads):
        scale = np.abs(np.asarray(expected)).max()
        assert_within_rounding(got, expected, query, key, scale, f"d{name}", grad=True)
    scratch = {
        custom: measure.compiled.scratch_bytes(program.memory_analysis())
        for custom, program in compiled.items()
    }
    # Plain autodiff keeps every trip's (R, Sb) scores: 9 trips of 8 x 8 per head, at least.
    assert scratch[False] >= scratch[True] + 9 * 8 * 8 * 2 * 4, scratch
    causal = functools.partial(
        jaxloops.blockwise_attention, is_causal=True, block_size=8, custom_vjp=False
    )
    with pytest.raises(ValueError, match="while_loop or lax.fori_loop with dynamic"):
        jax.grad(loss(causal))(query, key, value)
