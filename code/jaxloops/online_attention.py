"""Attention as a `lax.scan` over key/value blocks with an online softmax: the whole idea of
blockwise attention in one short function, before `jaxloops.blockwise` adds tiles, padding,
grouped heads, a causal mask and a backward pass that recomputes (chapter 8b).
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxloops.blockwise_tiles import online_softmax_step


def check_blocks(query, key, value, block_size: int) -> None:
    """ValueError unless query (B, T, N, H) and key, value (B, S, N, H) agree and
    `block_size` divides S."""
    if query.ndim != 4 or key.shape != value.shape or key.ndim != 4:
        raise ValueError(f"query {query.shape}, key {key.shape}, value {value.shape}: "
                         "expected (B, T, N, H) and two equal (B, S, N, H)")  # fmt: skip
    if (query.shape[0], *query.shape[2:]) != (key.shape[0], *key.shape[2:]):
        raise ValueError(f"query {query.shape} and key {key.shape} differ in B, N or H")
    if not isinstance(block_size, int) or block_size < 1 or key.shape[1] % block_size:
        raise ValueError(f"block_size {block_size!r} must be a positive int dividing "
                         f"S = {key.shape[1]}")  # fmt: skip


@functools.partial(jax.jit, static_argnames="block_size")
def scan_attention(query, key, value, *, block_size: int):
    """softmax(Q Kᵀ / √H) V, one key/value block per step of a `lax.scan`.

    Args:
      query: (B, T, N, H); key, value: (B, S, N, H), S a multiple of `block_size`.

    Returns:
      (B, T, N, H), float32. No step holds more than a (T, block_size) tile of scores a head.
    """
    check_blocks(query, key, value, block_size)
    B, S, N, H = key.shape
    q = jnp.swapaxes(query, 1, 2) / math.sqrt(H)  # (B, N, T, H)
    # (B, S, N, H) -> (S / Sb, B, N, Sb, H): the scan walks the leading axis, a block a step
    blocks = lambda x: x.reshape(B, S // block_size, block_size, N, H).transpose(1, 0, 3, 2, 4)  # noqa: E731

    def step(carry, kv):
        k, v = kv  # (B, N, Sb, H) each
        scores = jnp.einsum("BNTH,BNSH->BNTS", q, k, preferred_element_type=jnp.float32)
        return online_softmax_step(carry, scores, v), None  # running (max, sum, output)

    rows = q.shape[:3]  # (B, N, T): one running max and sum per query row
    start = (jnp.full(rows, -jnp.inf), jnp.zeros(rows), jnp.zeros((*rows, H)))
    (_, total, out), _ = lax.scan(step, start, (blocks(key), blocks(value)))
    return jnp.swapaxes(out / total[..., None], 1, 2)  # (B, T, N, H)
