"""The KV cache: its size, its arrays, and one decode step against it.

While generating, each new token's key and value are written into a preallocated cache of
S slots per layer; the token's query then attends to every filled slot. This is the one
cache of the package: chapter 10 measures it, the transformer (chapter 11) decodes with it.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import checkify

from jaxloops.attention import causal_mask, masked_fill_value, softmax
from jaxloops.losses import known_value

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
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"{heads} query heads is not a multiple of {kv_heads} key/value heads")
    if kv_heads == heads:
        return "MHA"
    return "MQA" if kv_heads == 1 else "GQA"


def kv_cache_bytes(
    *, layers: int, kv_heads: int, head_dim: int, length: int, batch: int, bytes_per_element: int
) -> int:
    """Bytes of a KV cache: 2 (K and V) * L * K * H * S * B * bytes per element."""
    sizes = (layers, kv_heads, head_dim, length, batch, bytes_per_element)
    if min(sizes) < 1:
        raise ValueError(
            f"every size must be >= 1, got layers={layers}, kv_heads={kv_heads}, "
            f"head_dim={head_dim}, length={length}, batch={batch}, "
            f"bytes_per_element={bytes_per_element}"
        )
    return 2 * layers * kv_heads * head_dim * length * batch * bytes_per_element


def init_kv_cache(
    *, layers: int, batch: int, length: int, kv_heads: int, head_dim: int, dtype=jnp.bfloat16
) -> tuple[dict, ...]:
    """An empty cache: one {"key", "value"} per layer, each (B, K, S, H) zeros.

    Heads-major, unlike the (B, S, K, H) of `attention`: a decode step then reads each
    head's (S, H) slab contiguously, as its matrix products want, with no transpose. One
    array per layer rather than one (L, B, K, S, H) block, so a decode step writes its
    layer in place and nothing else.
    """
    if min(layers, batch, length, kv_heads, head_dim) < 1:
        raise ValueError(
            f"every size must be >= 1, got layers={layers}, batch={batch}, "
            f"length={length}, kv_heads={kv_heads}, head_dim={head_dim}"
        )
    shape = (batch, kv_heads, length, head_dim)  # (B, K, S, H)
    return tuple(
        {"key": jnp.zeros(shape, dtype), "value": jnp.zeros(shape, dtype)} for _ in range(layers)
    )


def check_decode_shapes(query, cache_key, cache_value) -> tuple[int, ...]:
    """Checks a (B, T, N, H) query against a (B, K, S, H) cache; returns (B, T, N, K, S, H)."""
    if query.ndim != 4:
        raise ValueError(f"query must be (B, T, N, H), got {query.shape}")
    if cache_key.ndim != 4 or cache_key.shape != cache_value.shape:
        raise ValueError(
            f"cache key and value must be equal (B, K, S, H) arrays, got "
            f"{cache_key.shape} and {cache_value.shape}"
        )
    B, T, N, H = query.shape
    cache_batch, K, S, cache_head_dim = cache_key.shape
    if (cache_batch, cache_head_dim) != (B, H) or N % K or T > S:
        raise ValueError(
            f"query {query.shape} (B, T, N, H) does not fit cache "
            f"{cache_key.shape} (B, K, S, H): need equal B and H, N % K == 0 and T <= S"
        )
    return B, T, N, K, S, H


def drop_unit_axes(cache):
    """Cache arrays (B, K, S, H) without their size-1 B and K axes: the same bytes, shaped as
    the matrix products of a decode step read them. Works on one array or a whole cache.

    XLA can drop size-1 axes from a product's operands. A loop that carries a (1, K, S, H)
    cache, or (B, 1, S, H), may then hand its products a reshaped view of the array it has
    just written, and XLA:CPU writes the new slot twice, into the carry and into a full copy
    of the cache, on every step (XLA:TPU, for a v5e, made no such copy). A loop that carries
    this form has nothing to reshape, whatever the compiler.
    """

    def squeeze(x):
        return x.reshape(*(d for d in x.shape[:2] if d > 1), *x.shape[2:])

    return jax.tree.map(squeeze, cache)


def _decode_shapes(query, cache_key, cache_value) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(B, T, N, K, S, H) and the cache's leading axes, for a (B, K, S, H) cache or its
    `drop_unit_axes` form; the checks are `check_decode_shapes`' on the (B, K, S, H) shape."""
    lead = cache_key.shape[:-2]  # (B, K), or what drop_unit_axes left of them
    if cache_key.ndim != 4 and query.ndim == 4 and cache_key.ndim in (2, 3):
        B = query.shape[0]
        K = math.prod(lead) // B
        if K < 1 or tuple(d for d in (B, K) if d > 1) != lead:
            raise ValueError(
                f"query {query.shape} (B, T, N, H) does not fit cache {cache_key.shape}, the "
                f"drop_unit_axes form of a (B, K, S, H) cache: need its leading axes to be (B, K) "
                f"without size-1 axes"
            )
        if cache_key.shape == cache_value.shape:  # else check_decode_shapes says they differ
            cache_key = cache_value = jax.ShapeDtypeStruct((B, K, *cache_key.shape[-2:]), "f4")
    return check_decode_shapes(query, cache_key, cache_value), lead


def check_start(start, T: int, S: int) -> None:
    """Raises ValueError unless T tokens from slot `start` fit S slots, when `start` is known.

    A traced `start` cannot be checked here: `lax.dynamic_update_slice` would clamp it and
    write the last T slots instead. `checked_decode_step` checks it under `checkify`.
    """
    value = known_value(start)
    if value is not None and not (value.ndim == 0 and 0 <= value <= S - T):
        raise ValueError(
            f"start {value} does not fit {T} new tokens into a cache of {S} slots: "
            f"need 0 <= start <= {S - T}"
        )


def decode_attention(query, cache_key, cache_value, start):
    """Attention of T new tokens, at positions start..start+T-1, over a heads-major cache.

    Each query sees the slots up to its own position: earlier tokens and itself (already
    written), not later ones and not slots never written. The G = N // K query heads of a
    group are the rows of one matrix product with their shared key/value head, so each
    key and value is read once per group, not once per query head.

    Args:
      query: (B, T, N, H); T = 1 for a decode step, the prompt for a prefill.
      cache_key, cache_value: (B, K, S, H), one layer of the cache, or its `drop_unit_axes` form.
      start: position of the first query (a traced int is fine).

    Returns:
      (B, T, N, H).
    """
    (B, T, N, K, S, H), lead = _decode_shapes(query, cache_key, cache_value)
    check_start(start, T, S)
    G, R = N // K, N // K * T
    # The G heads of a group and the T tokens are the R = G * T rows of one product per
    # (b, k): each key and value of the group is read once for all of them. The rows take
    # the cache's leading axes, (B, K) or fewer, so the cache itself is never reshaped.
    query_rows = (
        query.reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4).reshape(*lead, R, H)
    )  # (B, T, N, H) -> (B, K, G, T, H) -> (..., R, H), row r = g * T + t
    # The cache is the left operand, S rows of H read in order, and the scores come out
    # S-major, (..., S, R): the softmax then runs down S with the R rows side by side.
    # (On XLA's CPU backend, (..., R, S) scores ran GQA's and MQA's step about 1.4x slower.)
    scores = jnp.einsum(
        "...SH,...RH->...SR", cache_key, query_rows, preferred_element_type=jnp.float32
    ) / math.sqrt(H)  # (..., S, R)
    # `is_causal` would align top-left and show query 0 slot 0 only: mask by position.
    visible = jnp.tile(causal_mask(T, S, offset=start), (G, 1)).T  # (S, R): s <= start + t
    scores = jnp.where(visible, scores, masked_fill_value(jnp.float32))
    # One row (MHA decoding) is the same bytes as a (1, S) row: reduce it as one (XLA's CPU
    # backend reduced the (S, 1) column about 1.6x slower).
    if R == 1:
        weights = softmax(scores.swapaxes(-1, -2)).swapaxes(-1, -2)
    else:
        weights = softmax(scores, axis=-2)  # over S, for each of the R rows
    out = jnp.einsum(
        "...SR,...SH->...RH", weights.astype(cache_value.dtype), cache_value
    )  # (..., R, H)
    return out.reshape(B, K, G, T, H).transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)  # (B, T, N, H)


def decode_step(query, new_key, new_value, cache_key, cache_value, start):
    """Writes T new keys/values into slots start..start+T-1, then attends over the cache.

    Under `jit` with the cache donated, or in the carry of a `lax.scan` or `fori_loop`
    that carries its `drop_unit_axes` form, the write happens in place: only the T new slots are
    written, the rest is not copied.

    Args:
      query: (B, T, N, H); new_key, new_value: (B, T, K, H), as a projection gives them.
      cache_key, cache_value: (B, K, S, H), or its `drop_unit_axes` form (what a loop should carry).
      start: the slot of the first new token (a traced int is fine).

    Returns:
      (output (B, T, N, H), cache_key, cache_value).
    """
    (B, T, _, K, S, H), lead = _decode_shapes(query, cache_key, cache_value)
    check_start(start, T, S)
    if new_key.shape != (B, T, K, H) or new_value.shape != (B, T, K, H):
        raise ValueError(
            f"new key/value must be (B, T, K, H) = {(B, T, K, H)} to match the "
            f"cache {cache_key.shape}; got {new_key.shape} and {new_value.shape}"
        )
    # (B, T, K, H) -> (B, K, T, H), shaped like the cache (or its loop form)
    new_key = new_key.swapaxes(1, 2).reshape(*lead, T, H).astype(cache_key.dtype)
    new_value = new_value.swapaxes(1, 2).reshape(*lead, T, H).astype(cache_value.dtype)
    slot = (0,) * len(lead) + (start, 0)  # slot `start` of every (b, k)
    cache_key = lax.dynamic_update_slice(cache_key, new_key, slot)
    cache_value = lax.dynamic_update_slice(cache_value, new_value, slot)
    return decode_attention(query, cache_key, cache_value, start), cache_key, cache_value


def checked_decode_step(query, new_key, new_value, cache_key, cache_value, start):
    """`decode_step` that checks a traced `start` too: under `checkify.checkify`, a start
    past the cache becomes an error naming it, instead of a write into the last slots."""
    T, S = query.shape[1], cache_key.shape[-2]
    checkify.check(
        (start >= 0) & (start <= S - T),
        f"start {{start}} does not fit {T} new tokens into a cache of {S} slots",
        start=start,
    )
    return decode_step(query, new_key, new_value, cache_key, cache_value, start)


def start_checked_first(jitted):
    """`jitted` (a decoder over a cache) behind a check of its `start`, run before the
    compiled function is entered: inside it `start` is traced, and a start past the cache
    would be clamped by `lax.dynamic_update_slice`, writing the wrong slots with no error."""

    @functools.wraps(jitted)
    def call(queries, keys, values, cache_key, cache_value, start):
        T, S = jnp.shape(queries)[1], jnp.shape(cache_key)[-2]
        if T <= S:  # else the compiled function names the overflow itself
            check_start(start, T, S)
        return jitted(queries, keys, values, cache_key, cache_value, start)

    call.lower = jitted.lower  # shapes only: nothing to check
    return call


@start_checked_first
@functools.partial(jax.jit, donate_argnums=(3, 4))
def decode_tokens(queries, keys, values, cache_key, cache_value, start):
    """Decodes T tokens one after another, each step writing its slot and attending, as
    generation does: a `lax.scan` of `decode_step` with the cache in its carry.

    The cache passed in is donated and the loop carries its `drop_unit_axes` form: the compiled loop
    writes one slot per step into the same buffers and returns them, and copies no cache,
    whatever B and K.

    Args:
      queries: (B, T, N, H); keys, values: (B, T, K, H), the T tokens' projections.
      cache_key, cache_value: (B, K, S, H), donated.
      start: the slot of the first token.

    Returns:
      (outputs (B, T, N, H), cache_key, cache_value).
    """

    def step(carry, new):
        cache_key, cache_value, position = carry
        query, key, value = (x[:, None] for x in new)  # (B, 1, N, H), (B, 1, K, H) twice
        out, cache_key, cache_value = decode_step(
            query, key, value, cache_key, cache_value, position
        )
        return (cache_key, cache_value, position + 1), out[:, 0]  # (B, N, H)

    shape = cache_key.shape  # (B, K, S, H)
    if queries.shape[1] > shape[-2]:  # start is traced here: only this much can be checked
        raise ValueError(f"{queries.shape[1]} tokens cannot fit a cache of {shape[-2]} slots")
    tokens_first = tuple(x.swapaxes(0, 1) for x in (queries, keys, values))  # (T, B, ., H)
    (cache_key, cache_value, _), outs = lax.scan(
        step, (*drop_unit_axes((cache_key, cache_value)), start), tokens_first
    )  # outs (T, B, N, H)
    return outs.swapaxes(0, 1), cache_key.reshape(shape), cache_value.reshape(shape)
