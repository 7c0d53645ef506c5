"""A decoder-only transformer on plain pytrees: embeddings, pre-norm blocks, output head.

Only `init_transformer` takes the config; the apply functions read every size from the
parameter shapes: embed tokens (V, D) and positions (max_len, D); per block, attention
query (D, N, H), key and value (D, K, H), out (N, H, D), and mlp w_in (D, F), w_out (F, D);
unembed (D, V). The number of blocks is L.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from jaxloops.attention import attention, attention_weights
from jaxloops.data import Batch
from jaxloops.dropout import check_rate, dropout
from jaxloops.initializers import draw_normal
from jaxloops.kvcache import decode_step, init_kv_cache
from jaxloops.losses import accuracy, check_ids, cross_entropy, known_value

Params = dict


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Sizes of a decoder-only transformer; checked when it is made."""

    vocab_size: int  # V
    num_layers: int  # L
    model_dim: int  # D
    num_heads: int  # N query heads
    num_kv_heads: int  # K key/value heads: K = N is MHA, 1 < K < N GQA, K = 1 MQA
    hidden_dim: int  # F, the MLP's width
    max_len: int  # rows of the position table: the longest sequence the model can read
    dropout_rate: float = 0.0  # of each residual branch in training (`make_dropout_train_step`)

    def __post_init__(self):
        check_rate(self.dropout_rate)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "dropout_rate":
                continue
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field.name} must be a positive int, got {value!r}")
        if self.model_dim % self.num_heads:
            raise ValueError(
                f"model_dim {self.model_dim} is not divisible by num_heads "
                f"{self.num_heads}: the heads must split D evenly"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads "
                f"{self.num_kv_heads}: each key/value head serves G = N // K heads"
            )

    @classmethod
    def from_sizes(cls, sizes, vocab_size: int) -> "TransformerConfig":
        """The model of `experiment_sizes().lm` (a `LanguageModelSizes`) for `vocab_size`."""
        names = [f.name for f in dataclasses.fields(cls) if hasattr(sizes, f.name)]
        return cls(vocab_size=vocab_size, **{name: getattr(sizes, name) for name in names})

    @property
    def head_dim(self) -> int:  # H
        return self.model_dim // self.num_heads


@functools.partial(jax.jit, static_argnums=1)
def init_transformer(key: jax.Array, config: TransformerConfig) -> Params:
    """Weights N(0, 1/fan_in), norm scales 1; the two projections that write into the
    residual stream are also scaled by 1/sqrt(2L), so its variance does not grow with L; the
    unembedding by 1/sqrt(D), so the fresh model's logits have a standard deviation of about
    1/sqrt(D) and its loss starts near ln V (it reads a normalised stream, rms 1: at unit
    gain the logits' std would be 1 at any D, and the loss about half a nat above ln V).
    Jitted: one compiled program per config instead of dozens of small eager ops.

    Returns:
      {"embed": {"tokens", "positions"}, "block_0": {"attention": {...}, "mlp": {...}}, ...,
       "norm": {"scale"}, "unembed": {"w"}}.
    """
    V, L, D = config.vocab_size, config.num_layers, config.model_dim
    N, K, H, F = config.num_heads, config.num_kv_heads, config.head_dim, config.hidden_dim
    residual = 1 / math.sqrt(2 * L)
    # (shape, fan_in, gain) of every weight.
    spec = {"embed": {"tokens": ((V, D), D, 1.0), "positions": ((config.max_len, D), D, 1.0)}}
    for i in range(L):
        spec[f"block_{i}"] = {
            "attention": {
                "query": ((D, N, H), D, 1.0),
                "key": ((D, K, H), D, 1.0),
                "value": ((D, K, H), D, 1.0),
                "out": ((N, H, D), N * H, residual),
            },
            "mlp": {"w_in": ((D, F), D, 1.0), "w_out": ((F, D), F, residual)},
        }
    spec["unembed"] = {"w": ((D, V), D, 1 / math.sqrt(D))}  # logits' std 1/sqrt(D)
    params = draw_normal(key, spec)
    for i in range(L):
        params[f"block_{i}"]["attention"]["norm"] = {"scale": jnp.ones(D)}
        params[f"block_{i}"]["mlp"]["norm"] = {"scale": jnp.ones(D)}
    params["norm"] = {"scale": jnp.ones(D)}
    return params


def num_blocks(params: Params) -> int:
    """L, counted from the parameter tree."""
    return sum(name.startswith("block_") for name in params)


def rms_norm(params: Params, x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / rms(x) * scale over the last axis (D), computed in float32."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32**2, axis=-1, keepdims=True) + eps)
    scale = params["scale"].reshape((1,) * (x.ndim - 1) + (-1,))  # (D,) -> (1, ..., 1, D)
    return (x32 * scale).astype(x.dtype)


def dense(x: jax.Array, w: jax.Array, axes: int = 1) -> jax.Array:
    """x (..., *in) times w (*in, *out), contracting the `axes` trailing axes of x with the
    leading ones of w, as one 2-D matmul: (rows, prod in) @ (prod in, prod out).

    The same numbers as `jnp.einsum`; the 2-D form is what XLA's CPU matmuls take without
    the transposing copies its backward pass makes for a 3-D einsum (chapter 11 measures).
    """
    lead, inner = x.shape[: x.ndim - axes], x.shape[x.ndim - axes :]
    size = math.prod(inner)
    out = x.reshape(-1, size) @ w.reshape(size, -1)  # (rows, in) @ (in, out)
    return out.reshape(lead + w.shape[axes:])  # (..., *out)


def project_qkv(params: Params, x: jax.Array):
    """The pre-norm and the query, key and value projections of an attention block.

    Returns:
      query (B, T, N, H), key (B, T, K, H), value (B, T, K, H).
    """
    h = rms_norm(params["norm"], x)  # (B, T, D)
    query = dense(h, params["query"])  # (B, T, D) @ (D, N, H) -> (B, T, N, H)
    key = dense(h, params["key"])  # (B, T, D) @ (D, K, H) -> (B, T, K, H)
    value = dense(h, params["value"])  # (B, T, D) @ (D, K, H) -> (B, T, K, H)
    return query, key, value


def attention_block(params: Params, x: jax.Array, cache=None, start=0, attend=attention, drop=None):
    """x + causal GQA attention of norm(x). With a cache, the T new tokens sit at
    positions start..start+T-1 and attend to every position written so far.

    Args:
      x: (B, T, D).
      cache: None, or this layer's {"key", "value"}, each (B, K, S, H) (`init_kv_cache`).
      start: where the T new positions begin in the cache (may be traced).
      attend: the causal attention used without a cache: `attention`, or any function
        with its signature, such as `blockwise_attention`.
      drop: None, or (rate, key) of dropout on the branch's output (training only).
    Returns:
      (x (B, T, D), the cache with the new keys and values written in, or None).
    """
    query, key, value = project_qkv(params, x)  # (B, T, N, H), (B, T, K, H), (B, T, K, H)
    if cache is None:
        out = attend(query, key, value, is_causal=True)  # (B, T, N, H)
    else:
        out, cache_key, cache_value = decode_step(
            query, key, value, cache["key"], cache["value"], start
        )  # (B, T, N, H): chapter 10's step, T tokens at a time
        cache = {"key": cache_key, "value": cache_value}
    out = dense(out, params["out"], axes=2)  # (B, T, N, H) @ (N, H, D) -> (B, T, D)
    return x + (out if drop is None else dropout(out, *drop)), cache


def mlp_block(params: Params, x: jax.Array, drop=None) -> jax.Array:
    """x + W_out gelu(W_in norm(x)), for x (B, T, D) with hidden width F; `drop` as for
    `attention_block`."""
    h = dense(rms_norm(params["norm"], x), params["w_in"])  # (B, T, D) @ (D, F) -> (B, T, F)
    out = dense(jax.nn.gelu(h), params["w_out"])  # (B, T, F) @ (F, D) -> (B, T, D)
    return x + (out if drop is None else dropout(out, *drop))


def check_tokens(params: Params, tokens, length: int | None = None) -> None:
    """Raises ValueError unless tokens are (B, T) integers and `length` (default T, the
    last position the call can reach) fits the position table."""
    max_len = params["embed"]["positions"].shape[0]
    if jnp.ndim(tokens) != 2 or not jnp.issubdtype(jnp.result_type(tokens), jnp.integer):
        raise ValueError(
            f"tokens must be (B, T) integers, got shape {jnp.shape(tokens)} "
            f"of {jnp.result_type(tokens)}"
        )
    length = tokens.shape[1] if length is None else length
    if length > max_len:
        raise ValueError(
            f"a sequence of {length} positions is longer than the position "
            f"table ({max_len} positions)"
        )


def embed(params: Params, tokens: jax.Array, start=0) -> jax.Array:
    """Token plus position embeddings (B, T, D) of tokens (B, T) at positions start + t.

    A token outside [0, V), or positions past the table, raise ValueError when known (an
    eager call). Traced, an out-of-vocabulary token (a negative one too) embeds as NaN,
    never as another token's row.
    """
    V, max_len = params["embed"]["tokens"].shape[0], params["embed"]["positions"].shape[0]
    check_ids(tokens, V, "tokens")
    first = known_value(start)
    if first is not None and not 0 <= first <= max_len - tokens.shape[1]:
        raise ValueError(
            f"start {first} puts {tokens.shape[1]} tokens past the position table "
            f"({max_len} positions): need 0 <= start <= {max_len - tokens.shape[1]}"
        )
    positions = jax.lax.dynamic_slice_in_dim(
        params["embed"]["positions"], start, tokens.shape[1]
    )  # (T, D)
    tokens = jnp.where(tokens < 0, V, tokens)  # out of bounds, not wrapped to V + token
    rows = params["embed"]["tokens"].at[tokens].get(mode="fill", fill_value=jnp.nan)  # (B, T, D)
    return rows + positions[None]  # (B, T, D) + (1, T, D)


def apply_blocks(params: Params, x: jax.Array, cache=None, start=0, attend=attention, drop=None):
    """The L blocks, then the final norm and the unembedding: logits (B, T, V), cache.
    `drop`: None, or (rate, key): block i's two branches use fold_in(key, 2 i) and 2 i + 1."""
    new_cache = []
    for i in range(num_blocks(params)):
        block = params[f"block_{i}"]
        drops = [None if drop is None else (drop[0], jax.random.fold_in(drop[1], 2 * i + j))
                 for j in range(2)]  # fmt: skip
        x, layer_cache = attention_block(
            block["attention"], x, None if cache is None else cache[i], start, attend, drops[0]
        )
        new_cache.append(layer_cache)
        x = mlp_block(block["mlp"], x, drops[1])
    x = rms_norm(params["norm"], x)  # (B, T, D)
    logits = dense(x, params["unembed"]["w"])  # (B, T, D) @ (D, V) -> (B, T, V)
    return logits, (None if cache is None else tuple(new_cache))


def transformer_logits(params: Params, tokens: jax.Array, attend=attention) -> jax.Array:
    """Next-token logits (B, T, V) of tokens (B, T); position t sees tokens 0..t only."""
    check_tokens(params, tokens)
    logits, _ = apply_blocks(params, embed(params, tokens), attend=attend)
    return logits


def kv_cache_for(params: Params, batch: int, length: int) -> tuple[dict, ...]:
    """The model's empty KV cache: `init_kv_cache` with L, K, H and the dtype of `params`.

    Only shapes and dtypes are read, so `jax.eval_shape(init_transformer, ...)` will do.
    """
    _, K, H = params["block_0"]["attention"]["key"].shape  # (D, K, H)
    return init_kv_cache(
        layers=num_blocks(params),
        batch=batch,
        length=length,
        kv_heads=K,
        head_dim=H,
        dtype=params["block_0"]["attention"]["key"].dtype,
    )


def cached_logits(params: Params, tokens: jax.Array, cache, start):
    """Logits (B, T, V) of T new tokens at positions start.., reading and extending `cache`.

    Prefill is tokens = the prompt (B, P) at start 0; a decode step is one token (B, 1) at
    start = the number of tokens already in the cache. The caller keeps start + T <= S.

    Args:
      cache: one {"key", "value"} per layer, each (B, K, S, H), as `kv_cache_for` makes,
        or its `drop_unit_axes` form.
    Returns:
      (logits (B, T, V), the cache with the T new positions written).
    """
    if len(cache) != num_blocks(params):
        raise ValueError(f"cache has {len(cache)} layers, the model {num_blocks(params)}")
    check_tokens(params, tokens, length=cache[0]["key"].shape[-2])  # S
    return apply_blocks(params, embed(params, tokens, start), cache, start)


def transformer_loss(params: Params, batch: Batch, attend=attention, *, dropout_rate=0.0, key=None):
    """Mean next-token cross-entropy (nats) of x (B, T) against y (B, T), and accuracy.

    `attend` is the attention of every block (default `attention`; `blockwise_attention`
    trains the same model without materialising the (T, S) scores). With dropout_rate > 0
    (training), `key` draws the dropout masks; at 0 no key is taken."""
    check_rate(dropout_rate)
    if dropout_rate == 0.0:
        logits = transformer_logits(params, batch.x, attend)  # (B, T, V)
    elif key is None:
        raise ValueError(f"dropout_rate {dropout_rate} needs a key")
    else:
        check_tokens(params, batch.x)
        x = embed(params, batch.x)  # (B, T, D)
        logits, _ = apply_blocks(params, x, attend=attend, drop=(dropout_rate, key))
    V = logits.shape[-1]
    logits_V, labels = logits.reshape(-1, V), batch.y.reshape(-1)  # (B*T, V), (B*T,)
    return cross_entropy(logits_V, labels), {"accuracy": accuracy(logits_V, labels)}


def attention_map(params: Params, tokens: jax.Array, layer: int) -> jax.Array:
    """Attention weights (B, N, T, T) of block `layer`: row t is how query t spreads over keys."""
    check_tokens(params, tokens)
    if not 0 <= layer < num_blocks(params):
        raise ValueError(f"layer {layer} is not in [0, {num_blocks(params) - 1}]")
    x = embed(params, tokens)  # (B, T, D)
    for i in range(layer):
        x, _ = attention_block(params[f"block_{i}"]["attention"], x)
        x = mlp_block(params[f"block_{i}"]["mlp"], x)
    query, key, _ = project_qkv(params[f"block_{layer}"]["attention"], x)
    return attention_weights(query, key, is_causal=True)  # (B, N, T, S=T)
