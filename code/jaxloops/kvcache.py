"""The KV cache: its size, its arrays, and one decode step against it.

While generating, each new token's key and value are written into a preallocated cache of
S slots per layer; the token's query then attends to every filled slot.
"""

import math

import jax.numpy as jnp
from jax import lax

from jaxloops.attention import causal_mask, masked_fill_value, softmax

# Published shapes of a few open models: L layers, N query heads, K key/value heads, H.
MODEL_CONFIGS = (
    {"model": "Llama 2 7B", "L": 32, "N": 32, "K": 32, "H": 128},
    {"model": "Llama 2 70B", "L": 80, "N": 64, "K": 8, "H": 128},
    {"model": "Llama 3 8B", "L": 32, "N": 32, "K": 8, "H": 128},
    {"model": "Mistral 7B", "L": 32, "N": 32, "K": 8, "H": 128},
    {"model": "Falcon 7B", "L": 32, "N": 71, "K": 1, "H": 64},
    {"model": "Gemma 2B", "L": 18, "N": 8, "K": 1, "H": 256},
)


def attention_kind(heads: int, kv_heads: int) -> str:
    """ "MHA" (K = N), "GQA" (1 < K < N) or "MQA" (K = 1)."""
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"{heads} query heads is not a multiple of {kv_heads} key/value heads")
    if kv_heads == heads:
        return "MHA"
    return "MQA" if kv_heads == 1 else "GQA"


def kv_cache_bytes(
    *, layers: int, kv_heads: int, head_dim: int, length: int, batch: int, bytes_per_element: int
) -> int:
    """Bytes of a KV cache: 2 (K and V) * L * K * H * S * B * bytes per element."""
    return 2 * layers * kv_heads * head_dim * length * batch * bytes_per_element


def init_kv_cache(
    *, layers: int, batch: int, length: int, kv_heads: int, head_dim: int, dtype=jnp.bfloat16
) -> dict:
    """An empty cache: {"key": (L, B, K, S, H), "value": (L, B, K, S, H)} of zeros.

    Heads-major, unlike the (B, S, K, H) of `attention`: a decode step then reads each
    head's (S, H) slab contiguously, as its matrix products want, with no transpose.
    """
    shape = (layers, batch, kv_heads, length, head_dim)
    return {"key": jnp.zeros(shape, dtype), "value": jnp.zeros(shape, dtype)}


def check_decode_shapes(query, cache_key, cache_value) -> tuple[int, ...]:
    """Checks a (B, 1, N, H) query against a (B, K, S, H) cache; returns (B, N, K, S, H)."""
    if query.ndim != 4 or query.shape[1] != 1:
        raise ValueError(f"query must be (B, 1, N, H) for one new token, got {query.shape}")
    if cache_key.ndim != 4 or cache_key.shape != cache_value.shape:
        raise ValueError(
            f"cache key and value must be equal (B, K, S, H) arrays, got "
            f"{cache_key.shape} and {cache_value.shape}"
        )
    B, _, N, H = query.shape
    cache_batch, K, S, cache_head_dim = cache_key.shape
    if (cache_batch, cache_head_dim) != (B, H) or N % K:
        raise ValueError(
            f"query {query.shape} (B, 1, N, H) does not fit cache "
            f"{cache_key.shape} (B, K, S, H): need equal B and H and N % K == 0"
        )
    return B, N, K, S, H


def decode_attention(query, cache_key, cache_value, length):
    """One new token's attention over the first `length` slots of a heads-major cache.

    Args:
      query: (B, 1, N, H), the new token (already written at slot length - 1).
      cache_key, cache_value: (B, K, S, H), one layer of the cache.
      length: number of filled slots (a traced int is fine).

    Returns:
      (B, 1, N, H).
    """
    B, N, K, S, H = check_decode_shapes(query, cache_key, cache_value)
    query_BKGH = query.reshape(B, K, N // K, H)  # (B, K, G, H)
    scores = jnp.einsum(
        "BKGH,BKSH->BKGS", query_BKGH, cache_key, preferred_element_type=jnp.float32
    ) / math.sqrt(H)  # (B, K, G, S)
    # `is_causal` would align top-left and show the one query slot 0 only: mask instead.
    filled = causal_mask(1, S, offset=length - 1)  # (1, S): slots < length
    weights = softmax(jnp.where(filled, scores, masked_fill_value(jnp.float32)))
    out = jnp.einsum(
        "BKGS,BKSH->BKGH", weights.astype(cache_value.dtype), cache_value
    )  # (B, K, G, H)
    return out.reshape(B, 1, N, H)  # (B, 1, N, H)


def decode_step(query, new_key, new_value, cache_key, cache_value, position):
    """Writes the token's key/value into slot `position`, then attends over slots <= it.

    Args:
      query: (B, 1, N, H); new_key, new_value: (B, 1, K, H), as a projection gives them.
      cache_key, cache_value: (B, K, S, H).
      position: the slot of this token (a traced int is fine).

    Returns:
      (output (B, 1, N, H), cache_key, cache_value).
    """
    B, _, K, _, H = check_decode_shapes(query, cache_key, cache_value)
    if new_key.shape != (B, 1, K, H) or new_value.shape != (B, 1, K, H):
        raise ValueError(
            f"new key/value must be (B, 1, K, H) = {(B, 1, K, H)} to match the "
            f"cache {cache_key.shape}; got {new_key.shape} and {new_value.shape}"
        )
    start = (0, 0, position, 0)
    cache_key = lax.dynamic_update_slice(
        cache_key, new_key.swapaxes(1, 2).astype(cache_key.dtype), start
    )  # (B, K, S, H)
    cache_value = lax.dynamic_update_slice(
        cache_value, new_value.swapaxes(1, 2).astype(cache_value.dtype), start
    )
    return decode_attention(query, cache_key, cache_value, position + 1), cache_key, cache_value
