"""Solutions to the exercises of chapters 8-11 whose answer is code.

tests/test_exercises_attention.py checks each against a reference.
"""

import functools
import math

import jax
import jax.numpy as jnp

from jaxloops.attention import attention, causal_mask, masked_fill_value
from jaxloops.kvcache import check_decode_shapes, kv_cache_bytes
from jaxloops.losses import known_value
from jaxloops.transformer import cached_logits, kv_cache_for


# Chapter 8.
def naive_attention_temp_bytes(batch: int, heads: int, q_len: int, kv_len: int, dtype) -> int:
    """Leading term of naive attention's scratch memory: two (B, N, T, S) arrays at a time (each
    pass over the scores reads one and writes the next: scaled scores, exponentials, weights),
    2 * B * N * T * S elements in the logits dtype (float32 at least, even for bfloat16 inputs).
    """
    logits_dtype = jnp.promote_types(dtype, jnp.float32)
    return 2 * batch * heads * q_len * kv_len * jnp.dtype(logits_dtype).itemsize


def einsum_attention(query, key, value):
    """The four moves for MHA, GQA and MQA, with two einsums and no transposes.

    Args:
      query: (B, T, N, H); key, value: (B, S, K, H) with N % K == 0.
    Returns:
      (B, T, N, H).
    """
    B, T, N, H = query.shape
    K = key.shape[2]
    if N % K:
        raise ValueError(f"query has {N} heads, key/value has {K}; {N} is not a multiple of {K}")
    query_BTKGH = query.reshape(B, T, K, N // K, H)  # (B, T, K, G, H): head n = (n // G, n % G)
    scores = jnp.einsum("BTKGH,BSKH->BKGTS", query_BTKGH, key)  # move 1: (B, K, G, T, S)
    scores = scores / math.sqrt(H)  # move 2
    weights = jnp.exp(scores - scores.max(axis=-1, keepdims=True))  # move 3, stably
    weights = weights / weights.sum(axis=-1, keepdims=True)  # (B, K, G, T, S)
    out = jnp.einsum("BKGTS,BSKH->BTKGH", weights, value)  # move 4: (B, T, K, G, H)
    return out.reshape(B, T, N, H)  # (B, T, N, H)


# Chapter 8b.
def partial_attention(query, key, value):
    """Unnormalised attention over one slice of the keys: (m, l, o) of the online softmax.

    Returns:
      m (B, K, G, T) row maxima, l (B, K, G, T) sums of exp(s - m), o (B, K, G, T, H).
    """
    B, T, N, H = query.shape
    K = key.shape[2]
    query_BTKGH = query.reshape(B, T, K, N // K, H)  # (B, T, K, G, H)
    scores = jnp.einsum("BTKGH,BSKH->BKGTS", query_BTKGH, key) / math.sqrt(H)  # (B, K, G, T, S)
    m = scores.max(axis=-1)  # (B, K, G, T)
    p = jnp.exp(scores - m[..., None])  # (B, K, G, T, S)
    return m, p.sum(axis=-1), jnp.einsum("BKGTS,BSKH->BKGTH", p, value)  # o: (B, K, G, T, H)


def merge_partials(a, b):
    """Combines the (m, l, o) of two disjoint key slices into the (m, l, o) of their union."""
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = jnp.maximum(m_a, m_b)
    scale_a, scale_b = jnp.exp(m_a - m), jnp.exp(m_b - m)  # rescale each to the shared max
    return m, l_a * scale_a + l_b * scale_b, o_a * scale_a[..., None] + o_b * scale_b[..., None]


@functools.partial(jax.jit, static_argnames="split")
def split_kv_attention(query, key, value, split: int):
    """Attention computed separately over keys [0, split) and [split, S), then merged.

    Returns:
      (B, T, N, H), equal to full attention.
    """
    S = key.shape[1]
    if not 0 < split < S:
        raise ValueError(f"split {split} must be in [1, {S - 1}] (the keys are {S})")
    _, l, o = merge_partials(
        partial_attention(query, key[:, :split], value[:, :split]),
        partial_attention(query, key[:, split:], value[:, split:]),
    )
    out = o / l[..., None]  # (B, K, G, T, H)
    B, K, G, T, H = out.shape
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, K * G, H)  # (B, T, N, H)


# Chapter 9.
def chunked_causal_attention(query, key, value, chunk: int):
    """Causal self-attention, `chunk` queries at a time: chunked prefill into a cache.

    The chunk starting at `start` attends to all S slots through `causal_mask(Tc, S,
    offset=start)`, which hides both later tokens and slots not yet written.
    """
    T, S = query.shape[1], key.shape[1]
    if T != S or chunk < 1:
        raise ValueError(f"need T == S and chunk >= 1, got T={T}, S={S}, chunk={chunk}")
    outs = []
    for start in range(0, T, chunk):
        block = query[:, start : start + chunk]  # (B, Tc, N, H), Tc = chunk except at the end
        mask = causal_mask(block.shape[1], S, offset=start)  # (Tc, S)
        outs.append(attention(block, key, value, mask=mask))
    return jnp.concatenate(outs, axis=1)  # (B, T, N, H)


def sliding_window_mask(T: int, S: int, window: int, *, offset: int = 0):
    """Boolean (T, S): query t sees the `window` keys s, t + offset - window < s <= t + offset."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    position = jnp.arange(T)[:, None] + offset  # (T, 1): where each query sits among the keys
    s = jnp.arange(S)[None, :]  # (1, S)
    return (s <= position) & (s > position - window)  # (T, S)


# Chapter 10.
def max_kv_heads(
    budget_bytes: int,
    *,
    layers: int,
    heads: int,
    head_dim: int,
    length: int,
    batch: int,
    bytes_per_element: int,
) -> int:
    """The largest K dividing N whose KV cache (`kv_cache_bytes`) fits in `budget_bytes`."""
    shape = dict(
        layers=layers,
        head_dim=head_dim,
        length=length,
        batch=batch,
        bytes_per_element=bytes_per_element,
    )
    for kv_heads in sorted((k for k in range(1, heads + 1) if heads % k == 0), reverse=True):
        if kv_cache_bytes(kv_heads=kv_heads, **shape) <= budget_bytes:
            return kv_heads
    raise ValueError(
        f"even K = 1 needs {kv_cache_bytes(kv_heads=1, **shape):,d} bytes, "
        f"more than the budget of {budget_bytes:,d}"
    )


def ragged_decode_attention(query, cache_key, cache_value, lengths):
    """One new token per sequence against a heads-major cache, sequence b filled to lengths[b].

    Args:
      query: (B, 1, N, H); cache_key, cache_value: (B, K, S, H); lengths: (B,) ints >= 1.
    Returns:
      (B, 1, N, H).
    """
    B, T, N, K, S, H = check_decode_shapes(query, cache_key, cache_value)
    if T != 1:
        raise ValueError(
            f"one new token per sequence: query must be (B, 1, N, H), got {query.shape}"
        )
    known = known_value(lengths)
    if known is not None and (known.shape != (B,) or known.min() < 1 or known.max() > S):
        # A length of 0 would mask every slot and average the values; one past S reads none.
        raise ValueError(f"lengths {known} must be (B,) = ({B},) ints in [1, {S}] (the slots)")
    query_BKGH = query.reshape(B, K, N // K, H)  # (B, K, G, H)
    scores = jnp.einsum(
        "BKGH,BKSH->BKGS", query_BKGH, cache_key, preferred_element_type=jnp.float32
    ) / math.sqrt(H)  # (B, K, G, S)
    filled = jnp.arange(S)[None, :] < jnp.asarray(lengths)[:, None]  # (B, S): one length per row
    scores = jnp.where(filled[:, None, None, :], scores, masked_fill_value(jnp.float32))
    weights = jax.nn.softmax(scores, axis=-1)  # (B, K, G, S)
    out = jnp.einsum("BKGS,BKSH->BKGH", weights.astype(cache_value.dtype), cache_value)
    return out.reshape(B, 1, N, H)  # (B, 1, N, H)


# Chapter 11.
def temperature_probs(logits, temperature: float):
    """The distribution `sample_token` draws from: softmax(logits / temperature) over the
    last axis (V); temperature 0 puts all the mass on the argmax."""
    if not temperature >= 0:  # NaN refused too
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    logits = jnp.asarray(logits, jnp.float32)
    if temperature == 0:
        return jax.nn.one_hot(logits.argmax(axis=-1), logits.shape[-1])
    return jax.nn.softmax(logits / temperature, axis=-1)


@functools.partial(jax.jit, static_argnames="prefill")
def incremental_logits(params, tokens, *, prefill: int):
    """Logits (B, T, V) of tokens (B, T) from a prefill of the first `prefill` tokens, then
    one cached decode step per remaining token: what `generate` computes, every position kept.
    """
    B, T = tokens.shape
    if not 0 < prefill <= T:
        raise ValueError(f"prefill {prefill} must be in [1, {T}]")
    logits, cache = cached_logits(params, tokens[:, :prefill], kv_cache_for(params, B, T), 0)
    steps = [logits]  # (B, P, V)
    for position in range(prefill, T):
        step_logits, cache = cached_logits(
            params, tokens[:, position : position + 1], cache, position
        )
        steps.append(step_logits)  # (B, 1, V)
    return jnp.concatenate(steps, axis=1)  # (B, T, V)
