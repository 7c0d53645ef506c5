"""Chapter 10's decode step of a whole layer: the bytes it reads are its weights plus its cache.

`decode_sweep` times the attention of a decode step alone, which reads only the cache. A
model's decode step also reads every weight once per token: at a short cache, or with few
key/value heads, the weights are most of its bytes. Here the step is the book's transformer
(`cached_logits`) with one layer of width D = N * H and an MLP of 4 D, timed per token against
the roofline's time for its weights plus its cache.
"""

import statistics

import jax
import jax.numpy as jnp

from jaxloops.kvcache import drop_unit_axes
from jaxloops.measure.compiled import compiled_flops
from jaxloops.measure.roofline import samples_beside_ceiling
from jaxloops.memory import tree_bytes
from jaxloops.transformer import TransformerConfig, cached_logits, init_transformer, kv_cache_for

VOCAB = 256  # bytes, as chapter 11's model reads them


def layer_config(length: int, kv_heads: int, *, heads: int, head_dim: int) -> TransformerConfig:
    """One layer of width D = heads * head_dim, an MLP of 4 D, `length` positions."""
    D = heads * head_dim
    return TransformerConfig(vocab_size=VOCAB, num_layers=1, model_dim=D, num_heads=heads,
                             num_kv_heads=kv_heads, hidden_dim=4 * D, max_len=length)  # fmt: skip


def weight_bytes(params, batch: int) -> int:
    """Bytes of weights one decode step of `batch` tokens reads: every matrix and scale, and of
    the two embedding tables only the rows it looks up (one token row per sequence, one
    position row). The position table has a row per cached position; a step reads one."""
    tokens, positions = params["embed"]["tokens"], params["embed"]["positions"]
    row = tokens.shape[1] * tokens.dtype.itemsize
    return tree_bytes(params) - tokens.nbytes - positions.nbytes + (batch + 1) * row


def _steps(params, token, cache, *, steps: int):
    """`steps` decode steps at the cache's last position (each reads every cached position),
    each feeding the most likely next token to the next: (the last token, the cache)."""
    start = cache[0]["key"].shape[-2] - 1

    def step(_, carry):
        token, cache = carry
        logits, cache = cached_logits(params, token, cache, start)  # (B, 1, V)
        return jnp.argmax(logits, axis=-1).astype(token.dtype), cache

    return jax.lax.fori_loop(0, steps, step, (token, cache))


def layer_decode_sweep(key: jax.Array, cache_lengths, kv_heads, *, batch: int, heads: int,
                       head_dim: int, dtype, repeats: int, steps: int) -> list[dict]:  # fmt: skip
    """Seconds per token of a one-layer model's decode step, for each K and S.

    One timed call runs `steps` steps in one compiled loop, the cache carried in its
    `drop_unit_axes` form and donated from call to call: each step writes its slot in place
    (XLA:TPU copies MHA's cache into the loop's own layout and back once per call, which the
    call's steps share). At
    each S the K values take turns, with the roofline's matmul and read
    (`samples_beside_ceiling`).

    Returns:
      Rows with K, S, seconds (per step, median of `repeats` calls; "round_seconds" each
      round's, the K values' rounds at one S taken in turn, so paired), weight_bytes
      (`weight_bytes`), cache_bytes (the K and V arrays), bytes (their sum) and flops (one
      step's, from the compiler's cost analysis).
    """
    if steps < 1 or repeats < 1:
        raise ValueError(f"need steps >= 1 and repeats >= 1, got {steps}, {repeats}")
    program = jax.jit(_steps, static_argnames="steps", donate_argnums=2)
    init = jax.jit(init_transformer, static_argnums=1)
    token = jnp.zeros((batch, 1), jnp.int32)
    rows = []
    for length in cache_lengths:
        states, params, runs = {}, {}, {}  # the last length's arrays go with the old ones
        for kv in kv_heads:
            config = layer_config(length, kv, heads=heads, head_dim=head_dim)
            drawn = init(key, config)  # one program, not one per operation
            params[kv] = jax.tree.map(lambda a: a.astype(dtype), drawn)
            states[kv] = (token, drop_unit_axes(kv_cache_for(params[kv], batch, length)))

            def run(kv=kv, states=states, params=params):  # the cache: donated, then replaced
                states[kv] = program(params[kv], *states[kv], steps=steps)
                return states[kv][0]

            runs[kv] = run
        samples, _ = samples_beside_ceiling(runs, repeats, read=True)
        for kv in kv_heads:
            cache = states[kv][1]
            one = lambda p, t, c: _steps(p, t, c, steps=1)
            row = {"K": int(kv), "S": int(length),
                   "seconds": statistics.median(samples[kv]) / steps,
                   "round_seconds": [t / steps for t in samples[kv]],
                   "weight_bytes": weight_bytes(params[kv], batch),
                   "cache_bytes": tree_bytes(cache),
                   "flops": compiled_flops(one, params[kv], token, cache)}  # fmt: skip
            rows.append({**row, "bytes": row["weight_bytes"] + row["cache_bytes"]})
    return rows


def crossover_length(weights: int, batch: int, kv_heads: int, head_dim: int, itemsize: int):
    """The cache length S at which one layer's cache (2 B K S H elements) holds as many bytes
    as its weights: below it a decode step reads mostly weights."""
    per_position = 2 * batch * kv_heads * head_dim * itemsize
    return weights / per_position
