"""Blockwise attention with an online softmax and a recomputing backward pass, in pure JAX.

The (T, S) score matrix is never built, forward or backward. Queries are cut into blocks of
Tb and keys into blocks of Sb. As in FlashAttention-2, the work is split over query blocks:
each one walks the key blocks with the running max, sum and output of an online softmax,
independently of the others, so `parallel_blocks` of them walk together, stacked into one
tile of Tq = parallel_blocks * Tb rows: what `jax.vmap` over the blocks computes, without the copies
of every score tile that its batch axis costs. The backward pass (`jax.custom_vjp`) keeps
only Q, K, V, the output and one log-sum-exp per query row, and recomputes each tile's
scores from them.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxloops.attention import check_attention_shapes, masked_fill_value


class Tiling(NamedTuple):
    """Static facts of one blockwise call (hashable, so it can be a custom_vjp static)."""

    T: int  # queries before padding
    S: int  # keys before padding
    q_block: int  # Tq = parallel_blocks * Tb: rows of one query tile
    k_block: int  # Sb
    is_causal: bool


def online_softmax_step(carry, scores, value_block):
    """Folds one key block into the running (max, sum, output) of an online softmax.

    Args:
      carry: running max (B, K, G, T), sum (B, K, G, T), output (B, K, G, T, H), float32.
      scores: this block's scaled, masked logits (B, K, G, T, S), float32.
      value_block: this block's values (B, K, S, H).

    Returns:
      The updated carry.
    """
    running_max, running_sum, out = carry
    new_max = jnp.maximum(running_max, scores.max(axis=-1))  # (B, K, G, T)
    # Everything summed so far was relative to the old max: rescale it to the new one.
    correction = jnp.exp(running_max - new_max)  # (B, K, G, T)
    weights = jnp.exp(scores - new_max[..., None])  # (B, K, G, T, S)
    new_sum = running_sum * correction + weights.sum(axis=-1)  # (B, K, G, T)
    mixed = jnp.einsum(
        "BKGTS,BKSH->BKGTH",
        weights.astype(value_block.dtype),
        value_block,
        preferred_element_type=out.dtype,
    )  # (B, K, G, T, H)
    return new_max, new_sum, out * correction[..., None] + mixed


def tile_scores(query_block, key_block, q_start, k_start, tiling: Tiling):
    """Masked float32 logits of one (query tile, key block) tile.

    Args:
      query_block: (B, K, G, Tq, H), already multiplied by 1/sqrt(H) (once per query tile,
        instead of once per score); key_block: (B, K, Sb, H).
      q_start, k_start: positions of the blocks' first query and first key.

    Returns:
      (B, K, G, Tq, Sb); padded keys and, if causal, keys after the query get the fill value.
    """
    scores = jnp.einsum(
        "BKGTH,BKSH->BKGTS", query_block, key_block, preferred_element_type=jnp.float32
    )  # (B, K, G, Tq, Sb)
    k_pos = k_start + jnp.arange(tiling.k_block)  # (Sb,)
    visible = None
    if tiling.S % tiling.k_block:  # keys padded up to a whole block never count
        visible = jnp.broadcast_to(k_pos < tiling.S, (tiling.q_block, tiling.k_block))
    if tiling.is_causal:
        q_pos = q_start + jnp.arange(tiling.q_block)  # (Tq,)
        causal = q_pos[:, None] >= k_pos[None, :]  # (Tq, Sb)
        visible = causal if visible is None else visible & causal
    if visible is None:
        return scores
    return jnp.where(visible, scores, masked_fill_value(jnp.float32))


def visible_key_blocks(tile, tiling: Tiling, n_key_blocks: int):
    """How many key blocks, from the first, query tile number `tile` must see.

    Causal: the tile's last query sees keys up to its own position, and no block after.
    """
    if not tiling.is_causal:
        return n_key_blocks
    last_query = (tile + 1) * tiling.q_block - 1
    return jnp.minimum(last_query // tiling.k_block + 1, n_key_blocks)


def _forward(query, key, value, tiling: Tiling):
    """Output and per-row log-sum-exp, query tiles one after another.

    Args:
      query: (nT, B, K, G, Tq, H): tiles of Tq = parallel_blocks * Tb query rows.
      key, value: (nS, B, K, Sb, H).

    Returns:
      out (nT, B, K, G, Tq, H) float32, lse (nT, B, K, G, Tq) float32.
    """
    _, B, K, G, Tq, H = query.shape
    n_key_blocks, Sb = key.shape[0], key.shape[3]
    fill = masked_fill_value(jnp.float32)

    def one_query_tile(args):
        query_tile, chunk = args  # (B, K, G, Tq, H), ()
        query_tile = query_tile * jnp.asarray(1.0 / math.sqrt(H), query_tile.dtype)

        def fold_key_block(j, carry):
            scores = tile_scores(query_tile, key[j], chunk * Tq, j * Sb, tiling)  # (B,K,G,Tq,Sb)
            return online_softmax_step(carry, scores, value[j])

        init = (
            jnp.full((B, K, G, Tq), fill, jnp.float32),
            jnp.zeros((B, K, G, Tq), jnp.float32),
            jnp.zeros((B, K, G, Tq, H), jnp.float32),
        )
        n_visible = visible_key_blocks(chunk, tiling, n_key_blocks)
        running_max, running_sum, out = lax.fori_loop(0, n_visible, fold_key_block, init)
        # The log-sum-exp of each row is all the backward pass needs to rebuild the weights.
        return out / running_sum[..., None], running_max + jnp.log(running_sum)

    return lax.map(one_query_tile, (query, jnp.arange(query.shape[0])))


def tile_grads(query_tile, key_block, value_block, d_out, lse, delta, q_start, k_start, tiling):
    """Gradient contributions of one tile, from its scores recomputed.

    Args:
      query_tile: (B, K, G, Tq, H), multiplied by 1/sqrt(H) as in the forward pass.
      d_out: (B, K, G, Tq, H); key_block, value_block: (B, K, Sb, H).
      lse, delta: (B, K, G, Tq): log-sum-exp of each row, and sum(d_out * out) of each row.

    Returns:
      d_query (B, K, G, Tq, H), d_key and d_value (B, K, Sb, H), float32.
    """
    H = query_tile.shape[-1]
    scores = tile_scores(query_tile, key_block, q_start, k_start, tiling)
    weights = jnp.exp(scores - lse[..., None])  # (B, K, G, Tq, Sb): the forward's softmax
    d_value = jnp.einsum("BKGTS,BKGTH->BKSH", weights, d_out)  # (B, K, Sb, H)
    d_weights = jnp.einsum("BKGTH,BKSH->BKGTS", d_out, value_block)  # (B, K, G, Tq, Sb)
    # Softmax backward: dS = P * (dP - sum_s P dP), and sum_s P dP = sum_h dO * O per row.
    d_scores = weights * (d_weights - delta[..., None])  # (B, K, G, Tq, Sb)
    # scores = (scale * Q) K^T: dQ gets the scale, dK sees the scaled query.
    d_query = jnp.einsum("BKGTS,BKSH->BKGTH", d_scores, key_block) * (1.0 / math.sqrt(H))
    d_key = jnp.einsum("BKGTS,BKGTH->BKSH", d_scores, query_tile)  # (B, K, Sb, H)
    return d_query, d_key, d_value


def _backward(tiling: Tiling, residuals, d_out):
    """Gradients w.r.t. the tiled query, key and value: the same walk, scores recomputed.

    Query tiles go one after another, each over its visible key blocks, adding into dQ of
    the tile and into dK, dV of the key block; nothing of size T x S is kept.
    """
    query, key, value, out, lse = residuals
    Tq = query.shape[-2]
    n_key_blocks, Sb = key.shape[0], key.shape[3]
    scale = 1.0 / math.sqrt(query.shape[-1])
    scaled = (query * jnp.asarray(scale, query.dtype)).astype(jnp.float32)  # as forward saw it
    key32, value32 = key.astype(jnp.float32), value.astype(jnp.float32)
    d_out = d_out.astype(jnp.float32)
    delta = (d_out * out).sum(axis=-1)  # (nT, B, K, G, Tq)

    def one_query_tile(carry, args):
        query_tile, d_out_tile, lse_tile, delta_tile, chunk = args

        def fold_key_block(j, inner):
            d_query, d_key, d_value = inner
            dq, dk, dv = tile_grads(
                query_tile,
                key32[j],
                value32[j],
                d_out_tile,
                lse_tile,
                delta_tile,
                chunk * Tq,
                j * Sb,
                tiling,
            )  # (B, K, G, Tq, H), (B, K, Sb, H), (B, K, Sb, H)
            return d_query + dq, d_key.at[j].add(dk), d_value.at[j].add(dv)

        n_visible = visible_key_blocks(chunk, tiling, n_key_blocks)
        init = (jnp.zeros_like(query_tile), *carry)
        d_query, d_key, d_value = lax.fori_loop(0, n_visible, fold_key_block, init)
        return (d_key, d_value), d_query

    zeros = jnp.zeros_like(key32)  # (nS, B, K, Sb, H)
    (d_key, d_value), d_query = lax.scan(
        one_query_tile, (zeros, zeros), (scaled, d_out, lse, delta, jnp.arange(query.shape[0]))
    )
    return d_query.astype(query.dtype), d_key.astype(key.dtype), d_value.astype(value.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _blockwise_core(query, key, value, tiling: Tiling):
    return _forward(query, key, value, tiling)[0]


def _blockwise_core_fwd(query, key, value, tiling: Tiling):
    out, lse = _forward(query, key, value, tiling)
    return out, (query, key, value, out, lse)  # O(T + S) residuals, no (T, S) array


_blockwise_core.defvjp(_blockwise_core_fwd, _backward)


def _pad_to(x, axis: int, multiple: int):
    """Zero-pads `axis` of x up to a multiple of `multiple`."""
    pad = -x.shape[axis] % multiple
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


@functools.partial(jax.jit, static_argnames=("is_causal", "block_size", "parallel_blocks"))
def blockwise_attention(
    query,
    key,
    value,
    *,
    is_causal: bool = False,
    block_size: int = 256,
    parallel_blocks: int = 4,
):
    """Attention that never materialises (T, S), forward or backward: memory linear in T, S.

    Args:
      query: (B, T, N, H).
      key: (B, S, K, H) with N % K == 0.
      value: (B, S, K, H).
      is_causal: query t attends to keys s <= t (top-left); key blocks entirely after a
        chunk's last query are skipped, not just masked.
      block_size: queries and keys per block (Tb = Sb); T and S need not be multiples of it.
      parallel_blocks: query blocks that walk the key blocks together, as one tile.

    Returns:
      (B, T, N, H), in the dtype of value. Differentiable: the backward pass recomputes
      the scores from the saved per-row log-sum-exp.
    """
    if block_size < 1 or parallel_blocks < 1:
        raise ValueError(
            f"block_size and parallel_blocks must be >= 1, got {block_size}, {parallel_blocks}"
        )
    query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    B, T, S, N, K, H = check_attention_shapes(query, key, value)
    G = N // K
    q_block, k_block = min(block_size, T), min(block_size, S)
    # No more parallel blocks than there are blocks; independent rows, stacked into one tile.
    Tq = min(parallel_blocks, -(-T // q_block)) * q_block
    tiling = Tiling(T, S, Tq, k_block, is_causal)

    query = _pad_to(query, 1, Tq)  # (B, nT * Tq, N, H)
    query = query.reshape(B, -1, Tq, K, G, H)  # (B, nT, Tq, K, G, H)
    query = query.transpose(1, 0, 3, 4, 2, 5)  # (nT, B, K, G, Tq, H)
    key = _pad_to(key, 1, k_block).reshape(B, -1, k_block, K, H)  # (B, nS, Sb, K, H)
    value = _pad_to(value, 1, k_block).reshape(B, -1, k_block, K, H)  # (B, nS, Sb, K, H)
    key = key.transpose(1, 0, 3, 2, 4)  # (nS, B, K, Sb, H)
    value = value.transpose(1, 0, 3, 2, 4)  # (nS, B, K, Sb, H)

    out = _blockwise_core(query, key, value, tiling)  # (nT, B, K, G, Tq, H)
    out = out.transpose(1, 0, 4, 2, 3, 5).reshape(B, -1, N, H)  # (B, nT * Tq, N, H)
    return out[:, :T].astype(value.dtype)  # (B, T, N, H)
