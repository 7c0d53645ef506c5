"""What a transformer train step keeps in memory, and remat: keeping less by recomputing.

The chapter-11 transformer's blocks, applied here one `jax.checkpoint` per block under a
named policy, or stacked on a leading L axis and run by a `lax.scan`. The formula for the
residuals (the activations the backward pass reads) is `activation_bytes`; the step's
other state (parameters, gradients, AdamW's two moments) is `state_bytes`.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxloops.data import Batch
from jaxloops.losses import accuracy, cross_entropy
from jaxloops.transformer import (
    TransformerConfig,
    attention_block,
    check_tokens,
    embed,
    mlp_block,
    num_blocks,
    rms_norm,
)

MID = "block_mid"  # the residual stream between a block's attention and its MLP

# Remat policies by name: which values inside a checkpointed block are kept for the backward
# pass (the rest is recomputed). "names" keeps only the values tagged `checkpoint_name(MID)`.
POLICIES = {
    "nothing": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "names": jax.checkpoint_policies.save_only_these_names(MID),
    "everything": jax.checkpoint_policies.everything_saveable,
}


def remat_policy(name: str):
    """The `jax.checkpoint` policy called `name`, one of POLICIES."""
    if name not in POLICIES:
        raise ValueError(f"unknown remat policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name]


def block(params, x: jax.Array) -> jax.Array:
    """One transformer block (attention, then MLP) of x (B, T, D), as chapter 11 applies it;
    the residual stream between the two is tagged MID for the "names" policy."""
    x, _ = attention_block(params["attention"], x)  # (B, T, D)
    x = checkpoint_name(x, MID)
    return mlp_block(params["mlp"], x)  # (B, T, D)


def remat_block(policy: str | None):
    """`block`, wrapped in `jax.checkpoint` under the named policy (None: not wrapped)."""
    return block if policy is None else jax.checkpoint(block, policy=remat_policy(policy))


def head_loss(params, x: jax.Array, labels: jax.Array):
    """Final norm, unembedding and mean cross-entropy of x (B, T, D) against labels (B, T)."""
    logits = jnp.einsum("BTD,DV->BTV", rms_norm(params["norm"], x), params["unembed"]["w"])
    V = logits.shape[-1]
    logits_V, labels = logits.reshape(-1, V), labels.reshape(-1)  # (B*T, V), (B*T,)
    return cross_entropy(logits_V, labels), {"accuracy": accuracy(logits_V, labels)}


def remat_loss(params, batch: Batch, policy: str | None = None):
    """`transformer_loss` with each of the L blocks checkpointed under `policy`.

    Args:
      policy: a name in POLICIES, or None for no remat (then equal to `transformer_loss`).
    """
    check_tokens(params, batch.x)
    apply = remat_block(policy)
    x = embed(params, batch.x)  # (B, T, D)
    for i in range(num_blocks(params)):
        x = apply(params[f"block_{i}"], x)
    return head_loss(params, x, batch.y)


def whole_remat_loss(params, batch: Batch, policy: str = "nothing"):
    """The control: one `jax.checkpoint` around the whole loss. The backward pass then
    recomputes the whole forward pass first, and holds every block's residuals at once."""
    return jax.checkpoint(remat_loss, policy=remat_policy(policy), static_argnums=(2,))(
        params, batch, None
    )


def stack_blocks(params):
    """The L blocks' parameters stacked on a leading L axis, under "blocks"; the rest as is."""
    L = num_blocks(params)
    blocks = [params[f"block_{i}"] for i in range(L)]
    rest = {name: value for name, value in params.items() if not name.startswith("block_")}
    return {**rest, "blocks": jax.tree.map(lambda *layers: jnp.stack(layers), *blocks)}


def scanned_loss(stacked, batch: Batch, policy: str | None = None):
    """`remat_loss` on `stack_blocks(params)`: one block body, run L times by `lax.scan`,
    so the program holds one copy of it whatever L is."""
    check_tokens(stacked, batch.x)
    apply = remat_block(policy)

    def body(x, block_params):
        return apply(block_params, x), None

    x, _ = jax.lax.scan(body, embed(stacked, batch.x), stacked["blocks"])  # (B, T, D)
    return head_loss(stacked, x, batch.y)


def activation_bytes(config: TransformerConfig, batch: int, length: int, itemsize: int = 4):
    """The residuals a step must keep for its backward pass, at the least (no remat).

    Per block, in elements: attention reads its input x and norm(x) (2 BTD), the query,
    key and value (BT(N + 2K)H), the softmax weights (BNTS with S = T) and its output
    (BTNH); the MLP its input and norm (2 BTD) and the hidden layer before and after the
    gelu (2 BTF); each norm its 1/rms (BT). The head keeps x, norm(x) (2 BTD) and the
    softmax of the logits (BTV).

    Returns:
      {"per_layer", "head", "total"} in bytes, for batch B and length T.
    """
    B, T, D, F = batch, length, config.model_dim, config.hidden_dim
    N, K, H, V = config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size
    per_layer = 4 * B * T * D + B * T * (2 * N + 2 * K) * H + B * N * T * T + 2 * B * T * F
    per_layer += 2 * B * T
    head = 2 * B * T * D + B * T * V
    per_layer, head = itemsize * per_layer, itemsize * head
    return {"per_layer": per_layer, "head": head, "total": config.num_layers * per_layer + head}


def kept_per_block(config: TransformerConfig, batch: int, length: int, policy="nothing"):
    """Elements a checkpointed block keeps for the backward pass under `policy`: its input x
    (BTD); for "names" the residual stream MID too (BTD); for "dots" the matmul outputs the
    backward pass reads: q, k, v (BT(N + 2K)H), the scores (BNTS with S = T), the mixed
    values (BTNH), the output projection (BTD) and the MLP's first matmul (BTF), not its
    second, whose output only the residual sum reads."""
    B, T, D, F = batch, length, config.model_dim, config.hidden_dim
    N, K, H = config.num_heads, config.num_kv_heads, config.head_dim
    kept = {"nothing": B * T * D, "names": 2 * B * T * D}
    kept["dots"] = 2 * B * T * D + B * T * (2 * N + 2 * K) * H + B * N * T * T + B * T * F
    if policy not in kept:
        raise ValueError(f"the formula counts remat policies {', '.join(kept)}; got {policy!r}")
    return kept[policy]


def remat_activation_bytes(config, batch: int, length: int, itemsize=4, policy="nothing"):
    """`activation_bytes` under remat per block: what each of the L blocks keeps
    (`kept_per_block`), and one block's residuals rebuilt at a time in the backward pass,
    beside the head's."""
    full = activation_bytes(config, batch, length, itemsize)
    kept = itemsize * kept_per_block(config, batch, length, policy)
    return config.num_layers * kept + full["per_layer"] + full["head"]


def step_bytes(config, batch: int, length: int, *, remat=None, micro=1, itemsize=4):
    """What the formula says a train step holds, as (fixed bytes, residual bytes).

    Fixed: float32 parameters, gradients and AdamW's two moments; plus the float32 gradient
    sum when accumulating over `micro` > 1 micro-batches, and the 16-bit copy of the
    parameters when computing in `itemsize` < 4 bytes. Residuals: those of B / micro
    examples, of `itemsize` bytes each, without remat (`remat=None`) or under remat per
    block with the named policy ("nothing", "names" or "dots").
    """
    if micro < 1 or batch % micro:
        raise ValueError(f"M = {micro} micro-batches must be >= 1 and divide the batch {batch}")
    state = state_bytes(config)
    fixed = sum(state.values()) + (state["grads"] if micro > 1 else 0)
    fixed += itemsize * parameter_count(config) if itemsize < 4 else 0
    micro_batch = batch // micro
    if remat is not None:
        return fixed, remat_activation_bytes(config, micro_batch, length, itemsize, remat)
    return fixed, activation_bytes(config, micro_batch, length, itemsize)["total"]


def largest(fits, limit: int = 2**16, step: int = 1) -> int:
    """The largest multiple n of `step` in [step, limit] with fits(n), for a `fits` that
    holds up to some n and fails beyond it (0 if not even n = step fits)."""
    low, high = 0, limit // step  # fits(low * step) is taken to hold, fits(high + 1) to fail
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid * step) else (low, mid - 1)
    return low * step


def biggest_model(config, batch, length, budget, *, margin=1.0, **technique) -> dict:
    """The largest L (at this batch) and the largest B (at config's L, a multiple of the
    micro-batch count) whose `step_bytes` fit `budget`, the residuals multiplied by `margin`
    (above 1 where a compiled step keeps more than the formula counts, as XLA:CPU's does;
    below 1 where it keeps less, as XLA:TPU's can).

    Args:
      technique: `step_bytes`'s remat, micro and itemsize.
    """
    if not margin > 0 or budget < 1:
        raise ValueError(f"need margin > 0 and budget >= 1 byte, got {margin}, {budget}")

    def fits(c, b):
        fixed, residuals = step_bytes(c, b, length, **technique)
        return fixed + margin * residuals <= budget

    def layers_fit(n):
        return fits(dataclasses.replace(config, num_layers=n), batch)

    micro = technique.get("micro", 1)
    return {
        "L": largest(layers_fit),
        "B": largest(lambda b: fits(config, b), step=micro),
    }


def parameter_count(config: TransformerConfig) -> int:
    """Parameters of `init_transformer(key, config)`, from the sizes alone."""
    V, D, F = config.vocab_size, config.model_dim, config.hidden_dim
    N, K, H = config.num_heads, config.num_kv_heads, config.head_dim
    per_layer = D * (N + 2 * K) * H + N * H * D + 2 * D * F + 2 * D
    return V * D + config.max_len * D + config.num_layers * per_layer + D + D * V


def state_bytes(config: TransformerConfig, itemsize: int = 4) -> dict:
    """The step's state besides activations: parameters, their gradients, AdamW's mu and nu."""
    P = itemsize * parameter_count(config)
    return {"params": P, "grads": P, "adam": 2 * P}


def tree_bytes(tree) -> int:
    """Bytes of every array (or ShapeDtypeStruct) in a pytree."""
    return sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def rounding_matmuls(config: TransformerConfig) -> int:
    """The matmuls among the contractions `rounding_terms` counts: per block the projections,
    the weighted values, the output projection and the MLP's two, and the head's unembedding."""
    return 5 * config.num_layers + 1


def rounding_terms(config: TransformerConfig, length: int, extra: int = 0, matmul_eps=None) -> int:
    """n of the float32 error bound n * eps * max|g| between two evaluations of the same
    gradient that round differently: the contraction lengths the gradient passes through
    (per block D for the projections, S = T for the weighted values, N H for the output
    projection, D and F for the MLP; D and V in the head), plus `extra` (terms of a sum
    that is reassociated, e.g. the B T tokens of a mean split into micro-batches).

    Args:
      matmul_eps: the relative error of one float32 matmul on this backend
        (`rounding.backend_eps(("matmul",))`). Where it exceeds eps, the matmul rounds its
        inputs (a TPU at JAX's default precision multiplies float32 in one bfloat16 pass),
        which no contraction length accounts for: each of the `rounding_matmuls` adds
        matmul_eps / eps - 1 terms. None: float32's matmuls, nothing added.
    """
    D, F, NH = config.model_dim, config.hidden_dim, config.num_heads * config.head_dim
    terms = config.num_layers * (2 * D + length + NH + F) + D + config.vocab_size + extra
    if matmul_eps is None:
        return terms
    eps = float(np.finfo(np.float32).eps)
    if not matmul_eps > 0:
        raise ValueError(f"matmul_eps must be a positive relative error, got {matmul_eps}")
    return terms + math.ceil(rounding_matmuls(config) * max(matmul_eps / eps - 1, 0.0))


def max_error(a, b) -> tuple[float, float]:
    """(max |a - b| over every leaf, max |a| over every leaf) of two pytrees of arrays,
    computed exactly (float64) on the host."""
    leaves = lambda tree: [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]  # noqa: E731
    a_leaves = leaves(a)  # fetched and converted once, for both maxima
    diff = max(float(np.max(np.abs(x - y))) for x, y in zip(a_leaves, leaves(b)))
    scale = max(float(np.max(np.abs(x))) for x in a_leaves)
    return diff, scale


def close_within(reference, other, terms: int, dtype=jnp.float32, added_to=None) -> dict:
    """Whether `other` equals `reference` within terms * eps(dtype) * max|reference|.

    Args:
      added_to: for two moves of the same parameters (new parameters minus old), the
        parameters they were added to. Each addition p + u rounds once, to within half a
        spacing of its result, so two moves that differ by less than the bound can still
        differ by eps * max|p + u| more (one spacing of the largest parameter): the bound
        adds it. None: `reference` and `other` are values, not moves.

    Returns:
      {"error", "bound", "ok"}: the largest difference, the bound, and error <= bound.
    """
    if terms < 1:
        raise ValueError(f"terms must be >= 1, got {terms}")
    error, scale = max_error(reference, other)
    eps = float(jnp.finfo(dtype).eps)
    bound = terms * eps * scale
    if added_to is not None:
        bound += eps * max(float(np.max(np.abs(np.asarray(p)))) for p in jax.tree.leaves(added_to))
    return {"error": error, "bound": bound, "ok": error <= bound}
