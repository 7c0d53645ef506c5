"""Scaled dot-product attention in four moves, with MHA, GQA and MQA in one function.

Layout and semantics follow `jax.nn.dot_product_attention`: query (B, T, N, H),
key/value (B, S, K, H), query head n reads key/value head n // G with G = N // K.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxloops.rounding import ATTENTION, backend_eps


def check_attention_shapes(query, key, value, mask=None) -> tuple[int, ...]:
    """Checks shapes at the public boundary and returns the sizes.

    Args:
      query: (B, T, N, H).
      key: (B, S, K, H).
      value: (B, S, K, H).
      mask: optional boolean, broadcastable to (B, N, T, S); True = attend.

    Returns:
      (B, T, S, N, K, H).
    """
    for name, array in (("query", query), ("key", key), ("value", value)):
        if jnp.ndim(array) != 4:
            raise ValueError(
                f"{name} must have rank 4 ((B, T, N, H) for query, (B, S, K, H) for "
                f"key/value), got shape {jnp.shape(array)}"
            )
    for name, array in (("query", query), ("key", key), ("value", value)):
        if not jnp.issubdtype(jnp.result_type(array), jnp.floating):
            raise ValueError(f"{name} must be floating point, got {jnp.result_type(array)}")
    B, T, N, H = query.shape
    if min(B, T, N, H) < 1:
        raise ValueError(f"query {query.shape} has an empty axis; need B, T, N, H >= 1")
    if key.shape != value.shape:
        raise ValueError(f"key and value shapes differ: key {key.shape}, value {value.shape}")
    key_batch, S, K, key_head_dim = key.shape
    if min(S, K) < 1:
        raise ValueError(f"key {key.shape} has an empty axis; need S, K >= 1")
    if key_batch != B:
        raise ValueError(
            f"query has batch {B}, key/value have batch {key_batch} "
            f"(query {query.shape}, key {key.shape})"
        )
    if key_head_dim != H:
        raise ValueError(
            f"query head dim {H} != key/value head dim {key_head_dim} "
            f"(query {query.shape}, key {key.shape})"
        )
    if N % K != 0:
        raise ValueError(
            f"query has {N} heads, key/value has {K}; {N} is not a multiple of "
            f"{K} (query {query.shape}, key {key.shape})"
        )
    if mask is not None:
        mask_shape = jnp.shape(mask)
        if jnp.result_type(mask) != jnp.bool_:
            raise ValueError(f"mask must be boolean (True = attend), got {jnp.result_type(mask)}")
        try:
            full = np.broadcast_shapes(mask_shape, (B, N, T, S))
        except ValueError:
            full = None
        if len(mask_shape) > 4 or full != (B, N, T, S):
            raise ValueError(
                f"mask shape {mask_shape} does not broadcast to (B, N, T, S) = {(B, N, T, S)}"
            )
    return B, T, S, N, K, H


def causal_mask(T: int, S: int, *, offset: int = 0):
    """Boolean (T, S) mask: query t attends to key s where s <= t + offset.

    offset = 0 is the top-left alignment of `is_causal`; offset = S - T puts the T queries
    at the end of the S keys (bottom-right), as for new tokens appended to a cache.
    """
    if T < 1 or S < 1:  # an empty mask would broadcast against nothing, silently
        raise ValueError(f"T and S must be >= 1, got T = {T}, S = {S}")
    return jnp.arange(T)[:, None] + offset >= jnp.arange(S)[None, :]  # (T, S)


def grouped_mask(mask, N: int, K: int):
    """Reshapes a mask broadcastable to (B, N, T, S) into one broadcastable to (B, K, G, T, S)."""
    mask = jnp.asarray(mask)
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)  # (B|1, N|1, T|1, S|1)
    mB, mN, mT, mS = mask.shape
    if mN == 1:
        return mask[:, :, None]  # (B|1, 1, 1, T|1, S|1)
    return mask.reshape(mB, K, N // K, mT, mS)  # (B|1, K, G, T|1, S|1)


def masked_fill_value(dtype):
    """The large finite negative logit that masked positions get (as jax's XLA path does).

    Finite, not -inf: a row with every key masked averages V instead of returning NaN.
    """
    return -0.7 * float(jnp.finfo(dtype).max)


def softmax(scores, axis: int = -1):
    """Softmax over `axis` (the keys), subtracting the max along it for stability.

    The max is a constant to the gradient (`stop_gradient`): the softmax does not depend on
    it, and differentiating through it would add a pass over the scores for a zero."""
    shifted = scores - jax.lax.stop_gradient(scores.max(axis=axis, keepdims=True))
    weights = jnp.exp(shifted)
    return weights / weights.sum(axis=axis, keepdims=True)


def causal_bias(T: int, S: int, dtype=jnp.float32):
    """The causal mask as a (T, S) constant to add to the scores: 0 where query t sees key s
    (s <= t), the masked fill value elsewhere. Added, it needs no select in the backward."""
    return jnp.where(causal_mask(T, S), 0.0, masked_fill_value(dtype)).astype(dtype)


def grouped_scores(query, key, *, is_causal: bool = False, mask=None):
    """Moves 1 and 2 of attention and the masks: logits (B, K, G, T, S), in at least float32.

    The 1/sqrt(H) scales the queries (T H numbers) rather than the scores (T S)."""
    B, T, N, H = query.shape
    _, S, K, _ = key.shape
    G = N // K
    # Logits and softmax in at least float32, as jax's XLA path does for bf16/fp16.
    logits_dtype = jnp.promote_types(query.dtype, jnp.float32)
    # Move 2, done first: scale so the logits' variance does not grow with H.
    query = query * jnp.asarray(1.0 / math.sqrt(H), query.dtype)
    # Heads-major layouts, so that the batch dimensions of the matmul lead.
    query_BKGTH = query.reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4)  # (B, K, G, T, H)
    key_BKSH = key.transpose(0, 2, 1, 3)  # (B, K, S, H)
    # Move 1: every query against every key.
    scores = jnp.einsum(
        "BKGTH,BKSH->BKGTS", query_BKGTH, key_BKSH, preferred_element_type=logits_dtype
    )  # (B, K, G, T, S)
    if is_causal:
        scores = scores + causal_bias(T, S, scores.dtype)[None, None, None]  # + (1, 1, 1, T, S)
    if mask is not None:
        scores = jnp.where(grouped_mask(mask, N, K), scores, masked_fill_value(scores.dtype))
    return scores


def attention_weights(query, key, *, is_causal: bool = False, mask=None):
    """Softmax weights (B, N, T, S): row t says how query t spreads over the S keys.

    Moves 1-3 of attention (scores, scale, mask, softmax), in at least float32.

    Args:
      query: (B, T, N, H).
      key: (B, S, K, H) with N % K == 0.
      is_causal: query t attends to keys s <= t (aligned top-left, like jax).
      mask: optional boolean, broadcastable to (B, N, T, S); True = attend.
    """
    B, T, N, _ = query.shape
    scores = grouped_scores(query, key, is_causal=is_causal, mask=mask)  # (B, K, G, T, S)
    # Move 3: softmax over the keys.
    return softmax(scores).reshape(B, N, T, -1)  # (B, K, G, T, S) -> (B, N, T, S)


@functools.partial(jax.jit, static_argnames=("is_causal",))
def attention(query, key, value, *, is_causal: bool = False, mask=None):
    """Naive attention: materialises the (T, S) scores for every batch and head.

    Move 3, the softmax, is split around move 4: its exponentials before the mix, its
    division after it, on (T, H) outputs instead of (T, S) weights.

    Args:
      query: (B, T, N, H), floating point.
      key: (B, S, K, H) with N % K == 0 (K = N MHA, 1 < K < N GQA, K = 1 MQA).
      value: (B, S, K, H).
      is_causal: query t attends to keys s <= t (aligned top-left, like jax).
      mask: optional boolean, broadcastable to (B, N, T, S); True = attend.

    Returns:
      (B, T, N, H), in the dtype of value.
    """
    query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    B, T, S, N, K, H = check_attention_shapes(query, key, value, mask)
    scores = grouped_scores(query, key, is_causal=is_causal, mask=mask)  # (B, K, G, T, S)
    # Move 3, first half: the softmax's exponentials, shifted by the row max for stability.
    exps = jnp.exp(scores - jax.lax.stop_gradient(scores.max(axis=-1, keepdims=True)))
    value_BKSH = value.transpose(0, 2, 1, 3)  # (B, K, S, H)
    # Move 4: mix the values with the unnormalised weights.
    out = jnp.einsum(
        "BKGTS,BKSH->BKGTH",
        exps.astype(value.dtype),
        value_BKSH,
        preferred_element_type=exps.dtype,
    )  # (B, K, G, T, H)
    # Move 3, second half: divide by each row's sum of exponentials.
    out = (out / exps.sum(axis=-1, keepdims=True)).astype(value.dtype)  # (B, K, G, T, H)
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)  # (B, T, N, H)


@functools.partial(jax.jit, static_argnames=("is_causal",))
def textbook_attention(query, key, value, *, is_causal: bool = True):
    """The control: causal attention as its formula reads, softmax(Q K^T / sqrt(H)) V, with the
    mask a select, the softmax's max differentiated and its division before the mix: the
    layouts and moves of `attention` before chapter 11's rewrite. The same numbers as
    `attention`; chapter 11 times the train step with each.

    Args:
      query: (B, T, N, H); key, value: (B, S, K, H).
    """
    B, T, N, H = query.shape
    _, S, K, _ = key.shape
    query_BKGTH = query.reshape(B, T, K, N // K, H).transpose(0, 2, 3, 1, 4)  # (B, K, G, T, H)
    key_BKSH, value_BKSH = key.transpose(0, 2, 1, 3), value.transpose(0, 2, 1, 3)  # (B, K, S, H)
    scores = jnp.einsum("BKGTH,BKSH->BKGTS", query_BKGTH, key_BKSH) * (1.0 / math.sqrt(H))
    if is_causal:  # (B, K, G, T, S)
        scores = jnp.where(causal_mask(T, S), scores, masked_fill_value(scores.dtype))
    weights = jnp.exp(scores - scores.max(axis=-1, keepdims=True))  # (B, K, G, T, S)
    weights = weights / weights.sum(axis=-1, keepdims=True)
    out = jnp.einsum("BKGTS,BKSH->BKGTH", weights, value_BKSH)  # (B, K, G, T, H)
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)  # (B, T, N, H)


def attention_rounding_bound(
    query, key, scale, eps: float | None = None, *, storage_eps: float = 0.0, magnitude=None
) -> float:
    """The largest difference float32 rounding explains between two correct attentions (or
    their gradients) of `query` (B, T, N, H) and `key` (B, S, K, H), for results of size at
    most `scale` (max |value| for outputs, max |gradient| for a gradient):

        2 * eps * scale * (1 + sqrt(S) + A),  A = max over (t, s) of
        sum_h |q_th k_sh| / sqrt(H),

    eps the relative error of one float32 operation: by default the machine epsilon, or the
    larger error this backend commits in an attention's operations (`rounding.backend_eps`,
    measured: a TPU's exp, its matmuls' bfloat16 passes); a gradient through a saved
    log-sum-exp passes `backend_eps((*ATTENTION, "log"))`. A score sums H products: its
    rounding error is at most about eps * A, and shifts the softmax weights by as much,
    relatively; the softmax's
    sum and the weighted sum of values add S terms each, rounding errors growing as sqrt(S)
    (random signs), each term at most `scale`. The 2 covers the two sums and the exp.
    A known-wrong answer (a stale cache slot, shifted positions) misses by O(scale).

    Inputs stored in a coarser dtype than the float32 arithmetic (bfloat16) add
    3 * storage_eps * magnitude, storage_eps that dtype's epsilon: each of the two attentions
    rounds at most three numbers of a result's path to it (the weights before the mix, an
    intermediate of the backward pass, the result), each by at most storage_eps / 2 of the
    sum of the absolute values of the terms, `magnitude` (default `scale`; for outputs
    max |value|, for gradients `rounding_magnitudes`).
    """
    query, key = np.abs(np.asarray(query, np.float64)), np.abs(np.asarray(key, np.float64))
    B, T, N, H = query.shape
    S, K = key.shape[1], key.shape[2]
    grouped = query.reshape(B, T, K, N // K, H)  # (B, T, K, G, H)
    A = np.einsum("BTKGH,BSKH->BKGTS", grouped, key).max() / math.sqrt(H)
    eps = backend_eps(ATTENTION) if eps is None else eps
    magnitude = scale if magnitude is None else magnitude
    storage = 3 * storage_eps * float(magnitude)
    return float(2 * eps * float(scale) * (1 + math.sqrt(S) + A) + storage)


def rounding_magnitudes(query, key, value, d_out, *, is_causal: bool = False) -> dict:
    """The sums of absolute terms that a rounding of an attention's output and gradients
    is relative to (`attention_rounding_bound`'s `magnitude`), in float64 NumPy: with P the
    weights, dP = dO V^T, |D| = sum_h |dO_h O_h| and c = 1/sqrt(H),

      out: max |v|;  dv: max of P^T |dO|;  dq: c max of (P (|dP| + |D|)) |K|;
      dk: c max of (P (|dP| + |D|))^T |Q|

    (a gradient of a key/value head sums its G query heads).

    Args:
      query: (B, T, N, H); key, value: (B, S, K, H); d_out: (B, T, N, H), the gradient of
        the output.
    """
    q, k, v, do = (np.asarray(x, np.float64) for x in (query, key, value, d_out))
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G, c = N // K, 1.0 / math.sqrt(H)
    k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)  # (B, S, N, H): head n reads n // G
    scores = np.einsum("BTNH,BSNH->BNTS", q, k, optimize=True) * c  # (B, N, T, S)
    if is_causal:
        scores = np.where(np.asarray(causal_mask(T, S)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)  # (B, N, T, S)
    out = np.einsum("BNTS,BSNH->BTNH", weights, v, optimize=True)
    d_weights = np.abs(np.einsum("BTNH,BSNH->BNTS", do, v, optimize=True))  # |dP|, (B, N, T, S)
    d_rows = np.einsum("BTNH,BTNH->BNT", np.abs(do), np.abs(out), optimize=True)[..., None]  # |D|
    spread = weights * (d_weights + d_rows)  # (B, N, T, S)

    def per_kv_head(x_BSNH):  # (B, S, N, H) -> (B, S, K, H): the G query heads summed
        return x_BSNH.reshape(B, S, K, G, H).sum(axis=3)

    return {
        "out": float(np.abs(v).max()),
        "dq": float(c * np.einsum("BNTS,BSNH->BTNH", spread, np.abs(k), optimize=True).max()),
        "dk": float(
            c * per_kv_head(np.einsum("BNTS,BTNH->BSNH", spread, np.abs(q), optimize=True)).max()
        ),
        "dv": float(
            per_kv_head(np.einsum("BNTS,BTNH->BSNH", weights, np.abs(do), optimize=True)).max()
        ),
    }
