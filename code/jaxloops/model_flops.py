"""Model FLOPs and MFU, counted the way the field publishes them (PaLM, MaxText): from the
model's configuration, not from what a compiler or a kernel happened to execute.

A training step of a decoder-only transformer does, per token, 6 FLOPs per parameter that
multiplies an activation (2 forward, 4 backward: the gradients with respect to the input and
to the weight), plus attention's two products over the sequence: 4·T·D a token forward
(Q Kᵀ and P V, D = N·H), 12·T·D with the backward, halved when the mask is causal. Embedding
lookups multiply nothing and count nothing; the unembedding is a matmul and counts.

MFU is those model FLOPs per second over the chip's published peak: recomputation (remat)
and padding do not raise it, and a kernel that skips masked blocks does not lower it.
"""

import math

from jaxloops.transformer import TransformerConfig


def matmul_params(config: TransformerConfig) -> int:
    """The parameters that multiply an activation: every block's query, key, value and
    output projections and its MLP, and the unembedding (not the embedding tables)."""
    D, N, K, H, F = (config.model_dim, config.num_heads, config.num_kv_heads, config.head_dim,
                     config.hidden_dim)  # fmt: skip
    per_block = D * N * H + 2 * D * K * H + N * H * D + 2 * D * F
    return config.num_layers * per_block + D * config.vocab_size


def train_flops(
    config: TransformerConfig, batch: int, length: int, *, causal: bool = True
) -> float:
    """Model FLOPs of one training step on `batch` sequences of `length` tokens:
    6 · P · B · T + 12 · L · B · T² · D, the attention term halved when `causal`."""
    for name, value in (("batch", batch), ("length", length)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if length > config.max_len:
        raise ValueError(f"length {length} is longer than the model's max_len {config.max_len}")
    tokens = batch * length
    D = config.num_heads * config.head_dim
    attention = 12 * config.num_layers * batch * length**2 * D * (0.5 if causal else 1.0)
    return 6 * matmul_params(config) * tokens + attention


def mfu(flops: float, seconds: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: `flops` done in `seconds`, over the published peak."""
    for name, value in (
        ("flops", flops),
        ("seconds", seconds),
        ("peak_flops_per_s", peak_flops_per_s),
    ):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return flops / seconds / peak_flops_per_s
