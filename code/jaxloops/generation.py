"""Sampling from the transformer: prefill, then one-token decode steps that reuse the KV
cache of chapter 10 (`init_kv_cache`, heads-major, one array per layer), and, for
comparison, decoding that recomputes the whole prefix every step.

P is the prompt's length (the T of the prefill); the cache holds S = P + steps positions.

Both decoders are one compiled program each (a `lax.fori_loop` under `jax.jit`) and draw
token i with `fold_in(key, i)`, so for the same key they produce the same tokens.
"""

import functools

import jax
import jax.numpy as jnp

from jaxloops.kvcache import drop_unit_axes
from jaxloops.losses import check_ids, check_labels
from jaxloops.transformer import (
    Params,
    cached_logits,
    check_tokens,
    kv_cache_for,
    transformer_logits,
)


def sample_token(key: jax.Array, logits: jax.Array, temperature: float) -> jax.Array:
    """Token ids (B,) drawn from logits (B, V) / temperature; temperature 0 is argmax."""
    if not temperature >= 0:  # written so that NaN is refused too
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, logits.astype(jnp.float32) / temperature).astype(jnp.int32)


def check_generation(params: Params, prompt, steps: int) -> tuple[int, int]:
    """Raises ValueError unless prompt (B, P) plus `steps` new tokens fit the model; (B, P)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    check_tokens(params, prompt, length=prompt.shape[1] + steps)
    return prompt.shape


def checked_prompt(jitted):
    """`jitted` (a decoder) behind a thin check of its prompt's token ids, run before the
    compiled function is entered: inside it the prompt is traced, and an id outside [0, V)
    would embed as NaN and decode tokens all the same. A prompt that is itself traced (the
    caller's own `jit`) is left to `checked_generate` under `checkify`."""

    @functools.wraps(jitted)
    def call(key, params, prompt, *, steps: int, temperature: float = 1.0):
        check_ids(prompt, params["embed"]["tokens"].shape[0], "prompt tokens")
        return jitted(key, params, prompt, steps=steps, temperature=temperature)

    call.lower = jitted.lower  # shapes only: nothing to check
    return call


@checked_prompt
@functools.partial(jax.jit, static_argnames=("steps", "temperature"))
def generate(
    key: jax.Array, params: Params, prompt: jax.Array, *, steps: int, temperature: float = 1.0
) -> jax.Array:
    """Prompt (B, P) followed by `steps` sampled tokens: (B, P + steps), using a KV cache.

    The cache holds S = P + steps positions. Prefill runs the prompt through the model once
    and writes its keys and values; each decode step then feeds one token, writes one
    position, and attends to the positions written so far. The cache lives in the loop's
    carry in its `drop_unit_axes` form, so each step writes its one position in place instead of
    copying the cache.
    """
    B, P = check_generation(params, prompt, steps)
    S = P + steps
    tokens = jnp.zeros((B, S), jnp.int32).at[:, :P].set(prompt)  # (B, S)
    # Prefill: the whole prompt in one call; only the last position's logits are needed.
    cache = drop_unit_axes(kv_cache_for(params, B, S))  # no size-1 axis for XLA to reshape
    logits, cache = cached_logits(params, prompt, cache, 0)  # (B, P, V)
    first = sample_token(jax.random.fold_in(key, 0), logits[:, -1], temperature)  # (B,)
    tokens = tokens.at[:, P].set(first)

    def step(i, carry):
        tokens, cache = carry
        position = P + i - 1  # of the newest token, whose keys and values are not cached yet
        last = jax.lax.dynamic_slice_in_dim(tokens, position, 1, axis=1)  # (B, 1)
        logits, cache = cached_logits(params, last, cache, position)  # (B, 1, V)
        token = sample_token(jax.random.fold_in(key, i), logits[:, 0], temperature)  # (B,)
        tokens = jax.lax.dynamic_update_slice_in_dim(tokens, token[:, None], position + 1, axis=1)
        return tokens, cache

    tokens, _ = jax.lax.fori_loop(1, steps, step, (tokens, cache))
    return tokens


def checked_generate(
    key: jax.Array, params: Params, prompt: jax.Array, *, steps: int, temperature: float = 1.0
) -> jax.Array:
    """`generate` that checks the prompt's token ids too: inside `jit` the prompt is traced,
    and an id outside [0, V) would embed as NaN and decode garbage. Functionalise it with
    `checkify.checkify` (steps and temperature bound first, e.g. with `functools.partial`):
    the check then becomes an error naming the bad ids' extremes."""
    check_labels(prompt, params["embed"]["tokens"].shape[0], "prompt tokens")
    return generate(key, params, prompt, steps=steps, temperature=temperature)


@checked_prompt
@functools.partial(jax.jit, static_argnames=("steps", "temperature"))
def generate_without_cache(
    key: jax.Array, params: Params, prompt: jax.Array, *, steps: int, temperature: float = 1.0
) -> jax.Array:
    """Same tokens as `generate`, but every step runs the full forward pass again.

    Shapes must be static under jit, so each step runs the whole (B, P + steps) window;
    causal attention keeps the not-yet-written positions from touching the logits read.
    """
    B, P = check_generation(params, prompt, steps)
    tokens = jnp.zeros((B, P + steps), jnp.int32).at[:, :P].set(prompt)  # (B, S)

    def step(i, tokens):
        logits = transformer_logits(params, tokens)  # (B, S, V): the whole window, again
        last = jax.lax.dynamic_index_in_dim(logits, P + i - 1, axis=1, keepdims=False)  # (B, V)
        token = sample_token(jax.random.fold_in(key, i), last, temperature)  # (B,)
        return jax.lax.dynamic_update_slice_in_dim(tokens, token[:, None], P + i, axis=1)

    return jax.lax.fori_loop(0, steps, step, tokens)
