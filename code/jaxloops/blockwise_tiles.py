"""The tiles of blockwise attention: what one tile computes against one key block.

A tile is R = G * Tq query rows of one (batch element, key/value head); it walks the key
blocks of Sb keys of its head, folding each into the running (max, sum, output) of an online
softmax. `to_tiles` cuts the arrays into tiles; `jaxloops.blockwise` walks them, forward and
backward.
"""

import math
from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

from jaxloops.attention import masked_fill_value


class Tiling(NamedTuple):
    """Static facts of one blockwise call (hashable, so it can be a custom_vjp static)."""

    T: int  # queries before padding
    S: int  # keys before padding
    Tq: int  # queries of one head in a tile: parallel_blocks * Tb
    Sb: int  # keys in a block
    is_causal: bool


# A step of the walk handles tiles of several heads at once when one tile has fewer rows than
# this: enough rows for a product worth splitting over the cores, and a score tile of
# 4 MiB at Sb = 512 (float32), which stays in a CPU's last-level cache.
ROWS_PER_STEP = 2048


def heads_per_step(n_heads: int, rows: int, max_rows: int = ROWS_PER_STEP) -> int:
    """How many tiles of one query chunk (one per head, of n_heads = B * K) walk together.

    The largest divisor of n_heads that keeps (divisor * rows) <= max_rows; 1 if even one
    tile is larger.
    """
    if max_rows < 1:
        raise ValueError(f"rows_per_step (max_rows) must be >= 1, got {max_rows}")
    fits = [p for p in range(1, n_heads + 1) if n_heads % p == 0 and p * rows <= max_rows]
    return max(fits, default=1)


def online_softmax_step(carry, scores, value_block):
    """Folds one key block into the running (max, sum, output) of an online softmax.

    Args:
      carry: running max (..., R), sum (..., R) and output (..., R, H) of R query rows,
        float32; `...` is any leading axes (the tiles walking together).
      scores: this block's scaled, masked logits (..., R, Sb), float32.
      value_block: this block's values (..., Sb, H).

    Returns:
      The updated carry.
    """
    running_max, running_sum, out = carry
    new_max = jnp.maximum(running_max, scores.max(axis=-1))  # (..., R)
    # Everything summed so far was relative to the old max: rescale it to the new one.
    correction = jnp.exp(running_max - new_max)  # (..., R)
    weights = jnp.exp(scores - new_max[..., None])  # (..., R, Sb)
    new_sum = running_sum * correction + weights.sum(axis=-1)  # (..., R)
    mixed = jnp.einsum(
        "...RS,...SH->...RH",
        weights.astype(value_block.dtype),
        value_block,
        preferred_element_type=out.dtype,
    )  # (..., R, H)
    return new_max, new_sum, out * correction[..., None] + mixed


def tile_scores(query_tile, key_block, q_start, k_start, tiling: Tiling, masked: bool = True):
    """Masked float32 logits of query tiles against one key block.

    Args:
      query_tile: (..., R, H), R = G * Tq rows (query head g's query t in row g * Tq + t),
        already multiplied by 1/sqrt(H) (once per tile, instead of once per score).
      key_block: (..., Sb, H).
      q_start, k_start: positions of the tiles' first query and the block's first key.
      masked: False for a block every row sees whole (`unmasked_key_blocks`): no mask built.

    Returns:
      (..., R, Sb); padded keys and, if causal, keys after the query get the fill value.
    """
    rows = query_tile.shape[-2]  # R = G * Tq
    scores = jnp.einsum(
        "...RH,...SH->...RS", query_tile, key_block, preferred_element_type=jnp.float32
    )  # (..., R, Sb)
    if not masked:
        return scores
    k_pos = k_start + jnp.arange(tiling.Sb)  # (Sb,)
    visible = None
    if tiling.S % tiling.Sb:  # keys padded up to a whole block never count
        visible = jnp.broadcast_to(k_pos < tiling.S, (rows, tiling.Sb))
    if tiling.is_causal:
        q_pos = q_start + jnp.arange(rows) % tiling.Tq  # (R,): each head's rows restart
        causal = q_pos[:, None] >= k_pos[None, :]  # (R, Sb)
        visible = causal if visible is None else visible & causal
    if visible is None:
        return scores
    return jnp.where(visible, scores, masked_fill_value(jnp.float32))


def visible_key_blocks(chunk, tiling: Tiling, n_key_blocks: int):
    """How many key blocks, from the first, the query tile at position `chunk` must see.

    Causal: the tile's last query sees keys up to its own position, and no block after.
    """
    if not tiling.is_causal:
        return n_key_blocks
    last_query = (chunk + 1) * tiling.Tq - 1
    return jnp.minimum(last_query // tiling.Sb + 1, n_key_blocks)


def unmasked_key_blocks(chunk, tiling: Tiling, n_key_blocks: int):
    """How many key blocks, from the first, every row of tile `chunk` sees whole.

    They need no mask: no padded key, and (causal) no key after the tile's first query.
    The walk builds masks only for the blocks after them, up to `visible_key_blocks`.
    """
    whole = tiling.S // tiling.Sb  # blocks without padded keys
    if not tiling.is_causal:
        return whole
    first_query = chunk * tiling.Tq
    return jnp.minimum((first_query + 1) // tiling.Sb, whole)


def walk_key_blocks(fold, chunk, tiling: Tiling, n_key_blocks: int, init):
    """Folds the visible key blocks of tile `chunk` into `init`: the unmasked ones first.

    fold(j, carry, masked) folds key block j; masked is a Python bool (two loop bodies).
    """
    n_unmasked = unmasked_key_blocks(chunk, tiling, n_key_blocks)
    n_visible = visible_key_blocks(chunk, tiling, n_key_blocks)
    carry = lax.fori_loop(0, n_unmasked, lambda j, c: fold(j, c, False), init)
    return lax.fori_loop(n_unmasked, n_visible, lambda j, c: fold(j, c, True), carry)


def splits_diagonal(tiling: Tiling) -> bool:
    """Whether each tile's masked key blocks are its own last Tq / Sb ones (T = S, aligned).

    Then masked block m of a tile (m = 0 .. Tq / Sb - 1) is seen only by the tile's queries
    from m * Sb on, and the forward pass folds it into those rows alone.
    """
    Tq, Sb = tiling.Tq, tiling.Sb
    return tiling.is_causal and tiling.T == tiling.S and tiling.T % Tq == 0 and Tq % Sb == 0


def rows_from(x, rows: tuple[int, int], Tq: int):
    """Each head's queries rows[0] to rows[1] - 1 of a tile.

    x: (P, G * Tq, ...), returns (P, G * (rows[1] - rows[0]), ...).
    """
    P, R = x.shape[:2]
    heads = x.reshape(P, R // Tq, Tq, *x.shape[2:])  # (P, G, Tq, ...)
    return heads[:, :, rows[0] : rows[1]].reshape(P, -1, *x.shape[2:])


def set_rows_from(x, rows: tuple[int, int], Tq: int, part):
    """x with `rows_from(x, rows, Tq)` replaced by part."""
    P, R = x.shape[:2]
    heads = x.reshape(P, R // Tq, Tq, *x.shape[2:])  # (P, G, Tq, ...)
    part = part.reshape(P, R // Tq, rows[1] - rows[0], *x.shape[2:])  # (P, G, rows, ...)
    return heads.at[:, :, rows[0] : rows[1]].set(part).reshape(x.shape)


def fold_rows(carry, query_tile, key_block, value_block, q_start, k_start, tiling, masked, rows):
    """Folds one key block into each head's queries rows[0] .. rows[1] - 1 of query tiles.

    Args:
      carry: running (max, sum, output) of the tiles' R = G * Tq rows (`online_softmax_step`).
      query_tile: (..., R, H), scaled; key_block, value_block: (..., Sb, H).
      q_start, k_start, masked: as in `tile_scores`; rows: (first, end) query of each head.
    """
    Tq = tiling.Tq
    if rows == (0, Tq):
        scores = tile_scores(query_tile, key_block, q_start, k_start, tiling, masked)
        return online_softmax_step(carry, scores, value_block)  # scores: (..., R, Sb)
    part = tiling._replace(Tq=rows[1] - rows[0])  # G heads of part.Tq queries each
    scores = tile_scores(
        rows_from(query_tile, rows, Tq), key_block, q_start + rows[0], k_start, part, masked
    )  # (..., G * part.Tq, Sb)
    new = online_softmax_step([rows_from(c, rows, Tq) for c in carry], scores, value_block)
    return tuple(set_rows_from(c, rows, Tq, x) for c, x in zip(carry, new))


def walk_split_diagonal(fold, chunk, tiling: Tiling, n_key_blocks: int, init):
    """`walk_key_blocks`, each masked block folded only into the tile's rows that see it.

    Masked block m (of the tile's last Tq / Sb, `splits_diagonal`) holds the keys at the
    tile's own positions m * Sb to m * Sb + Sb - 1: the queries before them see none of it.
    fold(j, carry, masked, rows) folds key block j into each head's queries rows[0] to
    rows[1] - 1 of the tile.
    """
    Tq, Sb = tiling.Tq, tiling.Sb
    n_unmasked = unmasked_key_blocks(chunk, tiling, n_key_blocks)
    carry = lax.fori_loop(0, n_unmasked, lambda j, c: fold(j, c, False, (0, Tq)), init)
    for m in range(Tq // Sb):
        carry = fold(n_unmasked + m, carry, True, (m * Sb, Tq))
    return carry


def computed_scores(tiling: Tiling, n_query_tiles: int, n_key_blocks: int) -> int:
    """Scores per head that the forward pass computes, all query tiles together.

    Tq * Sb for each key block a tile walks, less the rows that `walk_split_diagonal` skips.
    """
    total = 0
    for chunk in range(n_query_tiles):
        walked = int(visible_key_blocks(chunk, tiling, n_key_blocks))
        total += walked * tiling.Tq * tiling.Sb
        if splits_diagonal(tiling):
            m = tiling.Tq // tiling.Sb  # masked blocks, each skipping m * Sb rows
            total -= sum(range(m)) * tiling.Sb * tiling.Sb
    return total


def tile_grads(
    query_tile, key_block, value_block, d_out, lse, delta, q_start, k_start, tiling, masked=True
):
    """Gradient contributions of query tiles against one key block, scores recomputed.

    Args:
      query_tile: (..., R, H), multiplied by 1/sqrt(H) as in the forward pass.
      d_out: (..., R, H); key_block, value_block: (..., Sb, H).
      lse, delta: (..., R): log-sum-exp of each row, and sum(d_out * out) of each row.

    Returns:
      d_query (..., R, H), d_key and d_value (..., Sb, H), float32; the key and value
      gradients are summed over the R rows, so over the G query heads that share them.
    """
    H = query_tile.shape[-1]
    scores = tile_scores(query_tile, key_block, q_start, k_start, tiling, masked)
    weights = jnp.exp(scores - lse[..., None])  # (..., R, Sb): the forward's softmax
    d_value = jnp.einsum("...RS,...RH->...SH", weights, d_out)  # (..., Sb, H)
    d_weights = jnp.einsum("...RH,...SH->...RS", d_out, value_block)  # (..., R, Sb)
    # Softmax backward: dS = P * (dP - sum_s P dP), and sum_s P dP = sum_h dO * O per row.
    d_scores = weights * (d_weights - delta[..., None])  # (..., R, Sb)
    # scores = (scale * Q) K^T: dQ gets the scale, dK sees the scaled query.
    d_query = jnp.einsum("...RS,...SH->...RH", d_scores, key_block) * (1.0 / math.sqrt(H))
    d_key = jnp.einsum("...RS,...RH->...SH", d_scores, query_tile)  # (..., Sb, H)
    return d_query, d_key, d_value


def _pad_to(x, axis: int, multiple: int):
    """Zero-pads `axis` of x up to a multiple of `multiple`."""
    pad = -x.shape[axis] % multiple
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def to_tiles(query, key, value, Tq: int, Sb: int, per_step: int):
    """Pads and cuts query into (steps, per_step, R, H) tiles, key and value into
    (nS, B * K, Sb, H) blocks (see `blockwise._forward`)."""
    B, _, K, H = key.shape
    G = query.shape[2] // K
    query = _pad_to(query, 1, Tq)  # (B, nT * Tq, N, H)
    query = query.reshape(B, -1, Tq, K, G, H)  # (B, nT, Tq, K, G, H)
    query = query.transpose(1, 0, 3, 4, 2, 5)  # (nT, B, K, G, Tq, H)
    query = query.reshape(-1, per_step, G * Tq, H)  # (steps, per_step, R, H)
    key, value = (
        _pad_to(x, 1, Sb)  # (B, nS * Sb, K, H)
        .reshape(B, -1, Sb, K, H)  # (B, nS, Sb, K, H)
        .transpose(1, 0, 3, 2, 4)  # (nS, B, K, Sb, H)
        .reshape(-1, B * K, Sb, H)  # (nS, B * K, Sb, H)
        for x in (key, value)
    )
    return query, key, value


def from_tiles(out, batch: int, heads: int, kv_heads: int, T: int):
    """Undoes `to_tiles` for the output: tiles (steps, per_step, R, H) of R = G * Tq rows
    (G = heads / kv_heads) back to (B, T, N, H), the padded queries dropped."""
    G = heads // kv_heads
    Tq, H = out.shape[2] // G, out.shape[3]
    out = out.reshape(-1, batch, kv_heads, G, Tq, H)  # (nT, B, K, G, Tq, H)
    out = out.transpose(1, 0, 4, 2, 3, 5).reshape(batch, -1, heads, H)  # (B, nT * Tq, N, H)
    return out[:, :T]
