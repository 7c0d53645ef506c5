"""Answers to the chapters' exercises (loop chapters 1-7, attention chapters 8-11)."""

from jaxloops.solutions.loop import traced_shapes
from jaxloops.solutions.loop import ragged_compile_count
from jaxloops.solutions.loop import epoch_example_counts
from jaxloops.solutions.loop import mlp_parameter_count
from jaxloops.solutions.loop import label_smoothed_cross_entropy
from jaxloops.solutions.loop import softmax_cross_entropy_grad
from jaxloops.solutions.loop import momentum_update
from jaxloops.solutions.loop import adamw_update
from jaxloops.solutions.loop import make_clipped_optimizer
from jaxloops.solutions.loop import make_accumulating_train_step
from jaxloops.solutions.loop import host_syncs
from jaxloops.solutions.loop import precision_recall_f1
from jaxloops.solutions.loop import top_k_accuracy
from jaxloops.solutions.attention import naive_attention_temp_bytes
from jaxloops.solutions.attention import einsum_attention
from jaxloops.solutions.attention import partial_attention
from jaxloops.solutions.attention import merge_partials
from jaxloops.solutions.attention import split_kv_attention
from jaxloops.solutions.attention import chunked_causal_attention
from jaxloops.solutions.attention import sliding_window_mask
from jaxloops.solutions.attention import max_kv_heads
from jaxloops.solutions.attention import ragged_decode_attention
from jaxloops.solutions.attention import temperature_probs
from jaxloops.solutions.attention import incremental_logits

__all__ = (
    "adamw_update",
    "chunked_causal_attention",
    "einsum_attention",
    "epoch_example_counts",
    "host_syncs",
    "incremental_logits",
    "label_smoothed_cross_entropy",
    "make_accumulating_train_step",
    "make_clipped_optimizer",
    "max_kv_heads",
    "merge_partials",
    "mlp_parameter_count",
    "momentum_update",
    "naive_attention_temp_bytes",
    "partial_attention",
    "precision_recall_f1",
    "ragged_compile_count",
    "ragged_decode_attention",
    "sliding_window_mask",
    "softmax_cross_entropy_grad",
    "split_kv_attention",
    "temperature_probs",
    "top_k_accuracy",
    "traced_shapes",
)
