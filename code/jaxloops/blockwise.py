"""Blockwise attention with an online softmax, in pure JAX.

The (T, S) score matrix is never built: queries go block by block (`lax.map`), and for each
query block a `lax.scan` walks the key blocks carrying the running max, the running sum of
exponentials and the unnormalised output, rescaling them when the max grows.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxloops.attention import check_attention_shapes, masked_fill_value


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


def _pad_to(x, axis: int, multiple: int):
    """Zero-pads `axis` of x up to a multiple of `multiple`."""
    pad = -x.shape[axis] % multiple
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


@functools.partial(jax.jit, static_argnames=("is_causal", "block_size"))
def blockwise_attention(query, key, value, *, is_causal: bool = False, block_size: int = 128):
    """Attention that never materialises (T, S): memory grows linearly in the lengths.

    Args:
      query: (B, T, N, H).
      key: (B, S, K, H) with N % K == 0.
      value: (B, S, K, H).
      is_causal: query t attends to keys s <= t (top-left); key blocks entirely above the
        diagonal are skipped, not just masked.
      block_size: queries and keys per block; T and S need not be multiples of it.

    Returns:
      (B, T, N, H), in the dtype of value.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    B, T, S, N, K, H = check_attention_shapes(query, key, value)
    G = N // K
    q_block, k_block = min(block_size, T), min(block_size, S)
    fill = masked_fill_value(jnp.float32)
    scale = 1.0 / math.sqrt(H)

    query = _pad_to(query, 1, q_block).reshape(B, -1, q_block, K, G, H)  # (B, nT, Tb, K, G, H)
    query = query.transpose(1, 0, 3, 4, 2, 5)  # (nT, B, K, G, Tb, H)
    key = _pad_to(key, 1, k_block).reshape(B, -1, k_block, K, H)  # (B, nS, Sb, K, H)
    value = _pad_to(value, 1, k_block).reshape(B, -1, k_block, K, H)  # (B, nS, Sb, K, H)
    key = key.transpose(1, 0, 3, 2, 4)  # (nS, B, K, Sb, H)
    value = value.transpose(1, 0, 3, 2, 4)  # (nS, B, K, Sb, H)

    def one_query_block(args):
        query_block, q_index = args  # (B, K, G, Tb, H), ()
        q_pos = q_index * q_block + jnp.arange(q_block)  # (Tb,)

        def fold_key_block(carry, xs):
            key_block, value_block, k_index = xs  # (B, K, Sb, H), (B, K, Sb, H), ()
            k_pos = k_index * k_block + jnp.arange(k_block)  # (Sb,)

            def update(carry):
                scores = jnp.einsum(
                    "BKGTH,BKSH->BKGTS", query_block, key_block, preferred_element_type=jnp.float32
                )  # (B, K, G, Tb, Sb)
                scores = scores * scale
                if S % k_block:  # keys padded up to a whole block never count
                    scores = jnp.where(k_pos[None, :] < S, scores, fill)  # (B, K, G, Tb, Sb)
                if is_causal:
                    scores = jnp.where(q_pos[:, None] >= k_pos[None, :], scores, fill)
                return online_softmax_step(carry, scores, value_block)

            if not is_causal:
                return update(carry), None
            # The block's first key lies after the block's last query: nothing to see.
            visible = k_index * k_block <= q_index * q_block + q_block - 1
            return lax.cond(visible, update, lambda c: c, carry), None

        init = (
            jnp.full((B, K, G, q_block), fill, jnp.float32),
            jnp.zeros((B, K, G, q_block), jnp.float32),
            jnp.zeros((B, K, G, q_block, H), jnp.float32),
        )
        (_, running_sum, out), _ = lax.scan(
            fold_key_block, init, (key, value, jnp.arange(key.shape[0]))
        )
        return (out / running_sum[..., None]).astype(value.dtype)  # (B, K, G, Tb, H)

    out = lax.map(one_query_block, (query, jnp.arange(query.shape[0])))  # (nT, B, K, G, Tb, H)
    out = out.transpose(1, 0, 4, 2, 3, 5).reshape(B, -1, N, H)  # (B, nT * Tb, N, H)
    return out[:, :T]  # (B, T, N, H)
