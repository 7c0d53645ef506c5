"""Blockwise attention with an online softmax and a recomputing backward pass, in pure JAX.

The (T, S) score matrix is never built, forward or backward. Queries are cut into blocks of
Tb and keys into blocks of Sb. As in FlashAttention-2, the work is split into independent
tiles, one per (batch element, key/value head, query tile): each walks the key blocks of its
head with the running max, sum and output of an online softmax. A tile stacks
`parallel_blocks` query blocks (Tq = parallel_blocks * Tb queries) of each of the G query
heads that share the key/value head: R = G * Tq rows, so each key and value block is read
once for all of them and each product is a plain (R x H) by (H x Sb) matrix product. Small
tiles walk together, several heads per step (`heads_per_step`), so that a step's products
are large enough to be worth splitting over the cores. The backward pass
(`jax.custom_vjp`) keeps only Q, K, V, the output and one log-sum-exp per query row, and
recomputes each tile's scores from them. Causal, with T = S, the forward pass folds each
key block on the diagonal only into the rows that see some of it, and up to T = 1024 runs
unrolled (`unrolls`): each tile a step of its own, the keys before it one block. What one
tile does lives in `blockwise_tiles`.
"""

import functools
import math
import operator

import jax
import jax.numpy as jnp
from jax import lax

from jaxloops.attention import check_attention_shapes, masked_fill_value
from jaxloops.blockwise_tiles import (  # re-exported: the tiles' pieces, one import away
    ROWS_PER_STEP,
    Tiling,
    computed_scores,
    fold_rows,
    from_tiles,
    heads_per_step,
    online_softmax_step,
    splits_diagonal,
    tile_grads,
    tile_scores,
    to_tiles,
    unmasked_key_blocks,
    visible_key_blocks,
    walk_key_blocks,
    walk_split_diagonal,
)

__all__ = (
    "ROWS_PER_STEP",
    "Tiling",
    "blockwise_attention",
    "can_unroll",
    "choose_tiling",
    "computed_scores",
    "default_blocks",
    "fold_rows",
    "from_tiles",
    "heads_per_step",
    "online_softmax_step",
    "splits_diagonal",
    "tile_grads",
    "tile_scores",
    "to_tiles",
    "unmasked_key_blocks",
    "unrolls",
    "visible_key_blocks",
    "walk_key_blocks",
    "walk_split_diagonal",
)


def _empty_carry(heads: int, R: int, H: int):
    """The online softmax's (max, sum, output) before any key: (heads, R), (heads, R) and
    (heads, R, H) float32, the max at the fill value."""
    fill = masked_fill_value(jnp.float32)
    return (
        jnp.full((heads, R), fill, jnp.float32),
        jnp.zeros((heads, R), jnp.float32),
        jnp.zeros((heads, R, H), jnp.float32),
    )


def _forward(query, key, value, tiling: Tiling):
    """Output and per-row log-sum-exp, one step (of per_step tiles) after another.

    Args:
      query: (steps, per_step, R, H), steps = nT * B * K / per_step: step i holds query
        chunk c = i // (B * K / per_step), queries c * Tq to c * Tq + Tq - 1, of per_step
        consecutive key/value heads, the first (i % (B * K / per_step)) * per_step.
      key, value: (nS, B * K, Sb, H).

    Returns:
      out (steps, per_step, R, H) float32, lse (steps, per_step, R) float32.
    """
    n_steps, per_step, R, H = query.shape
    n_key_blocks, n_heads, Sb = key.shape[:3]
    groups, Tq = n_heads // per_step, tiling.Tq  # steps per query chunk

    def one_step(args):
        query_tiles, i = args  # (per_step, R, H), ()
        chunk, first_head = i // groups, (i % groups) * per_step
        query_tiles = query_tiles * jnp.asarray(1.0 / math.sqrt(H), query_tiles.dtype)

        def fold_key_block(j, carry, masked, rows=(0, Tq)):
            """Folds key block j into each head's queries rows[0] .. rows[1] - 1."""
            keys = lax.dynamic_slice_in_dim(key[j], first_head, per_step)  # (per_step, Sb, H)
            values = lax.dynamic_slice_in_dim(value[j], first_head, per_step)  # (per_step, Sb, H)
            return fold_rows(
                carry, query_tiles, keys, values, chunk * Tq, j * Sb, tiling, masked, rows
            )

        init = _empty_carry(per_step, R, H)
        if splits_diagonal(tiling):
            running_max, running_sum, out = walk_split_diagonal(
                fold_key_block, chunk, tiling, n_key_blocks, init
            )
        else:
            running_max, running_sum, out = walk_key_blocks(
                fold_key_block, chunk, tiling, n_key_blocks, init
            )
        # The log-sum-exp of each row is all the backward pass needs to rebuild the weights.
        return out / running_sum[..., None], running_max + jnp.log(running_sum)

    return lax.map(one_step, (query, jnp.arange(n_steps)))


# A causal call of at most this many query tiles and queries runs its forward pass unrolled
# (`unrolls`): on the 2-core CPU of chapter 9, unrolled causal tiles ran faster than walked
# ones at T = 1024, and unrolling full attention's tiles gained nothing (chapter 9 measures
# both). The bound on T bounds the scores an unrolled tile holds at once (Tq x T at most).
MAX_UNROLLED_TILES, MAX_UNROLLED_LENGTH = 4, 1024


def can_unroll(tiling: Tiling) -> bool:
    """Whether `_forward_unrolled` can run this tiling: full attention always; causal when
    T = S and a query tile is whole key blocks (its diagonal is its own last blocks)."""
    return not tiling.is_causal or (tiling.T == tiling.S and tiling.Tq % tiling.Sb == 0)


def unrolls(tiling: Tiling) -> bool:
    """Whether `blockwise_attention` unrolls the forward pass by default (unroll=None):
    causal, `can_unroll`, at most MAX_UNROLLED_TILES query tiles and MAX_UNROLLED_LENGTH
    queries."""
    n_query_tiles = -(-tiling.T // tiling.Tq)
    return (
        tiling.is_causal
        and can_unroll(tiling)
        and n_query_tiles <= MAX_UNROLLED_TILES
        and tiling.T <= MAX_UNROLLED_LENGTH
    )


def _forward_unrolled(query, key, value, tiling: Tiling):
    """`_forward` with no loop: each query tile, for all heads at once, a step of its own.

    The keys all of a tile's rows see (causal: those before the tile; full: every key)
    are one block, folded as one product of Tq x (those keys) scores a head: a tile's
    scores are no longer bounded by Tq x Sb. Causal, the tile's own Tq / Sb key blocks
    follow, each folded into the rows that see it (as `walk_split_diagonal` does). Padded
    keys are seen only by padded queries, which are dropped. Arguments and results as in
    `_forward`.
    """
    steps, per_step, R, H = query.shape
    n_key_blocks, n_heads, Sb = key.shape[:3]
    n_tiles, Tq = steps * per_step // n_heads, tiling.Tq
    scale = jnp.asarray(1.0 / math.sqrt(H), query.dtype)
    tiles = query.reshape(n_tiles, n_heads, R, H) * scale  # (tiles, B * K, R, H)
    # Every key of each head in order: (B * K, nS * Sb, H).
    keys, values = (x.transpose(1, 0, 2, 3).reshape(n_heads, -1, H) for x in (key, value))
    outs, lses = [], []
    for chunk in range(n_tiles):
        carry = _empty_carry(n_heads, R, H)
        seen = chunk * Tq if tiling.is_causal else tiling.S  # keys every row sees
        if seen:
            carry = fold_rows(
                carry, tiles[chunk], keys[:, :seen], values[:, :seen], chunk * Tq, 0,
                tiling, False, (0, Tq),
            )  # fmt: skip
        for m in range(Tq // Sb if tiling.is_causal else 0):  # the tile's own key blocks
            j = chunk * Tq // Sb + m
            carry = fold_rows(
                carry, tiles[chunk], key[j], value[j], chunk * Tq, j * Sb, tiling, True,
                (m * Sb, Tq),
            )  # fmt: skip
        running_max, running_sum, out = carry
        outs.append(out / running_sum[..., None])
        lses.append(running_max + jnp.log(running_sum))
    return jnp.stack(outs).reshape(query.shape), jnp.stack(lses).reshape(query.shape[:3])


def _add_into(total, j, first_head, part):
    """total[j, first_head : first_head + per_step] += part.

    total: (nS, B * K, Sb, H); part: (per_step, Sb, H).
    """
    start = (j, first_head, 0, 0)
    block = lax.dynamic_slice(total, start, (1, *part.shape))  # (1, per_step, Sb, H)
    return lax.dynamic_update_slice(total, block + part[None], start)


def _backward(tiling: Tiling, forward, residuals, d_out):
    """Gradients w.r.t. the tiled query, key and value: the same walk, scores recomputed.

    Whichever `forward` ran (walked or unrolled), the backward pass walks.

    Steps go one after another, each over its visible key blocks, adding into dQ of its
    tiles and into dK, dV of the key block; nothing of size T x S is kept.
    """
    query, key, value, out, lse = residuals
    n_steps, per_step = query.shape[:2]
    n_key_blocks, n_heads, Sb = key.shape[:3]
    groups, Tq = n_heads // per_step, tiling.Tq
    scale = 1.0 / math.sqrt(query.shape[-1])
    scaled = (query * jnp.asarray(scale, query.dtype)).astype(jnp.float32)  # as forward saw it
    key32, value32 = key.astype(jnp.float32), value.astype(jnp.float32)
    d_out = d_out.astype(jnp.float32)
    delta = (d_out * out).sum(axis=-1)  # (n_steps, per_step, R)

    def one_step(carry, args):
        query_tiles, d_out_tiles, lse_tiles, delta_tiles, i = args
        chunk, first_head = i // groups, (i % groups) * per_step

        def fold_key_block(j, inner, masked):
            d_query, d_key, d_value = inner
            dq, dk, dv = tile_grads(
                query_tiles,
                lax.dynamic_slice_in_dim(key32[j], first_head, per_step),
                lax.dynamic_slice_in_dim(value32[j], first_head, per_step),
                d_out_tiles,
                lse_tiles,
                delta_tiles,
                chunk * Tq,
                j * Sb,
                tiling,
                masked,
            )  # (per_step, R, H), (per_step, Sb, H), (per_step, Sb, H)
            d_key = _add_into(d_key, j, first_head, dk)
            return d_query + dq, d_key, _add_into(d_value, j, first_head, dv)

        init = (jnp.zeros_like(query_tiles), *carry)
        d_query, d_key, d_value = walk_key_blocks(fold_key_block, chunk, tiling, n_key_blocks, init)
        return (d_key, d_value), d_query

    zeros = jnp.zeros_like(key32)  # (nS, B * K, Sb, H)
    (d_key, d_value), d_query = lax.scan(
        one_step, (zeros, zeros), (scaled, d_out, lse, delta, jnp.arange(n_steps))
    )
    return d_query.astype(query.dtype), d_key.astype(key.dtype), d_value.astype(value.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _blockwise_core(query, key, value, tiling: Tiling, forward=_forward):
    return forward(query, key, value, tiling)[0]


def _blockwise_core_fwd(query, key, value, tiling: Tiling, forward=_forward):
    out, lse = forward(query, key, value, tiling)  # `_forward` or `_forward_unrolled`
    return out, (query, key, value, out, lse)  # O(T + S) residuals, no (T, S) array


_blockwise_core.defvjp(_blockwise_core_fwd, _backward)


# Default tiles. Full attention: blocks of 512, four to a query tile (Tq = 2048), so that each
# step's products are large. Causal: a tile skips the key blocks after its last query, and
# (T = S) the rows of its diagonal blocks that see none of their keys. Up to T = 1024, query
# tiles of 256 in key blocks of 128: at most four tiles, which run unrolled (`unrolls`).
# Longer, query tiles of 512 and key blocks of T / 4 (128 to 256): walked, tiles of fewer
# queries ran their steps too slowly to gain on the 2-core CPU of chapter 9, and key blocks
# of 512 ran slower at T = 2048 (see the commit log).
FULL_BLOCK, FULL_PARALLEL_BLOCKS = 512, 4
SHORT_CAUSAL_BLOCK, SHORT_CAUSAL_PARALLEL_BLOCKS = 128, 2
CAUSAL_QUERY_TILE, CAUSAL_MIN_BLOCK, CAUSAL_MAX_BLOCK = 512, 128, 256


def default_blocks(T: int, is_causal: bool) -> tuple[int, int]:
    """(block_size, parallel_blocks) that `blockwise_attention` uses for T queries by default.

    Full attention: (512, 4) at every T. Causal: up to T = MAX_UNROLLED_LENGTH (1024),
    (128, 2), query tiles of 256: at most four, unrolled. Longer: key blocks of T / 4 rounded
    down to a power of two and clipped to [128, 256], as many to a query tile as make it 512
    queries.
    """
    T = operator.index(T)  # a NumPy integer too
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    if not is_causal:
        return FULL_BLOCK, FULL_PARALLEL_BLOCKS
    if T <= MAX_UNROLLED_LENGTH:
        return SHORT_CAUSAL_BLOCK, SHORT_CAUSAL_PARALLEL_BLOCKS
    quarter = 2 ** max(0, (T // 4).bit_length() - 1)  # largest power of two <= T / 4
    block = min(max(quarter, CAUSAL_MIN_BLOCK), CAUSAL_MAX_BLOCK)
    return block, CAUSAL_QUERY_TILE // block


def choose_tiling(
    T: int,
    S: int,
    is_causal: bool,
    block_size: int | None = None,
    parallel_blocks: int | None = None,
) -> Tiling:
    """The tiling `blockwise_attention` walks for T queries and S keys: blocks of
    `block_size` queries and keys (at most T and S), and query tiles of `parallel_blocks`
    query blocks, no more than there are. None takes `default_blocks(T, is_causal)`."""
    default_block, default_parallel = default_blocks(T, is_causal)
    block_size = default_block if block_size is None else block_size
    parallel_blocks = default_parallel if parallel_blocks is None else parallel_blocks
    if block_size < 1 or parallel_blocks < 1:
        raise ValueError(
            f"block_size and parallel_blocks must be >= 1, got {block_size}, {parallel_blocks}"
        )
    Tb = min(block_size, T)
    return Tiling(T, S, min(parallel_blocks, -(-T // Tb)) * Tb, min(block_size, S), is_causal)


@functools.partial(
    jax.jit,
    static_argnames=(
        "is_causal",
        "block_size",
        "parallel_blocks",
        "rows_per_step",
        "custom_vjp",
        "unroll",
    ),
)
def blockwise_attention(
    query,
    key,
    value,
    *,
    is_causal: bool = False,
    block_size: int | None = None,
    parallel_blocks: int | None = None,
    rows_per_step: int = ROWS_PER_STEP,
    custom_vjp: bool = True,
    unroll: bool | None = None,
):
    """Attention that never materialises (T, S), forward or backward: memory linear in T, S
    (unrolled, a tile holds its scores against every key before it: at most Tq x S).

    Args:
      query: (B, T, N, H).
      key: (B, S, K, H) with N % K == 0.
      value: (B, S, K, H).
      is_causal: query t attends to keys s <= t (top-left); key blocks entirely after a
        tile's last query are skipped, not just masked, and (T = S, `splits_diagonal`) the
        forward pass folds each block on the diagonal only into the rows that see it.
      block_size: queries and keys per block (Tb = Sb); T and S need not be multiples of it.
        None: `default_blocks(T, is_causal)`.
      parallel_blocks: query blocks of one head that walk the key blocks together, as one
        tile (Tq = parallel_blocks * Tb queries). None: `default_blocks(T, is_causal)`.
      rows_per_step: tiles of several heads walk together while their rows add up to at
        most this (one tile a step if it alone is larger).
      custom_vjp: False differentiates the same walk with plain autodiff instead, which
        keeps every trip's score tiles for the backward pass, and cannot differentiate a
        causal walk at all (its loop bounds depend on the tile); a control, not for use.
      unroll: whether the forward pass runs with no loop (`_forward_unrolled`): each query
        tile a step of its own, the keys all its rows see folded as one block (Tq x those
        keys scores at once). None: `unrolls(tiling)` (short causal calls) with the custom
        VJP, never without it. The backward pass always walks.

    Returns:
      (B, T, N, H), in the dtype of value. Differentiable: the backward pass recomputes
      the scores from the saved per-row log-sum-exp.
    """
    query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    B, T, S, N, K, H = check_attention_shapes(query, key, value)
    tiling = choose_tiling(T, S, is_causal, block_size, parallel_blocks)
    per_step = heads_per_step(B * K, (N // K) * tiling.Tq, rows_per_step)

    unroll = custom_vjp and unrolls(tiling) if unroll is None else unroll
    if unroll and not can_unroll(tiling):
        raise ValueError(
            f"unroll=True needs T = S and query tiles of whole key blocks when causal: got T "
            f"{T}, S {S}, {tiling.Tq} queries a tile, key blocks of {tiling.Sb}"
        )
    forward = _forward_unrolled if unroll else _forward

    tiles = to_tiles(query, key, value, tiling.Tq, tiling.Sb, per_step)
    if custom_vjp:
        out = _blockwise_core(*tiles, tiling, forward)  # (steps, per_step, R, H)
    else:
        out = forward(*tiles, tiling)[0]
    return from_tiles(out, B, N, K, T).astype(value.dtype)  # (B, T, N, H)
