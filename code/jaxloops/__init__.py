"""jaxloops: the tested code behind the book "JAX training loops, executed".

Notation, used in every einsum, shape comment and suffix:

  B batch, T query length, S key/value length, D model width, F hidden width,
  N query heads, K key/value heads, G = N // K, H head dim, V vocabulary,
  C classes, L layers.
"""

from jaxloops.attention import attention
from jaxloops.attention import causal_mask
from jaxloops.attention import check_attention_shapes
from jaxloops.attention_bench import attention_sweep
from jaxloops.attention_bench import causal_sweep
from jaxloops.attention_bench import decode_sweep
from jaxloops.attention_bench import numerics_table
from jaxloops.attention_bench import random_cache
from jaxloops.attention_bench import random_qkv
from jaxloops.attention_bench import read_bandwidth
from jaxloops.attention_bench import reference_attention
from jaxloops.backend import Sizes
from jaxloops.backend import describe_backend
from jaxloops.backend import experiment_sizes
from jaxloops.backend import gpu_facts
from jaxloops.backend import run_label
from jaxloops.backend import versions
from jaxloops.blockwise import blockwise_attention
from jaxloops.blockwise import online_softmax_step
from jaxloops.data import Batch
from jaxloops.data import Split
from jaxloops.data import epoch_batches
from jaxloops.data import load_digits_split
from jaxloops.data import ragged_batches
from jaxloops.data import to_device
from jaxloops.evaluate import EvalBatches
from jaxloops.evaluate import accuracy_from_confusion
from jaxloops.evaluate import confusion_matrix
from jaxloops.evaluate import evaluate
from jaxloops.evaluate import most_confused
from jaxloops.evaluate import pad_batches
from jaxloops.evaluate import per_class_accuracy
from jaxloops.exercises import adamw_update
from jaxloops.exercises import epoch_example_counts
from jaxloops.exercises import host_syncs
from jaxloops.exercises import label_smoothed_cross_entropy
from jaxloops.exercises import make_accumulating_train_step
from jaxloops.exercises import make_clipped_optimizer
from jaxloops.exercises import mlp_parameter_count
from jaxloops.exercises import momentum_update
from jaxloops.exercises import precision_recall_f1
from jaxloops.exercises import ragged_compile_count
from jaxloops.exercises import softmax_cross_entropy_grad
from jaxloops.exercises import top_k_accuracy
from jaxloops.exercises import traced_shapes
from jaxloops.exercises_attention import chunked_causal_attention
from jaxloops.exercises_attention import einsum_attention
from jaxloops.exercises_attention import incremental_logits
from jaxloops.exercises_attention import max_kv_heads
from jaxloops.exercises_attention import merge_partials
from jaxloops.exercises_attention import naive_attention_temp_bytes
from jaxloops.exercises_attention import partial_attention
from jaxloops.exercises_attention import ragged_decode_attention
from jaxloops.exercises_attention import sliding_window_mask
from jaxloops.exercises_attention import split_kv_attention
from jaxloops.exercises_attention import temperature_probs
from jaxloops.generation import generate
from jaxloops.generation import generate_without_cache
from jaxloops.generation import init_cache
from jaxloops.generation import sample_token
from jaxloops.grads import finite_difference
from jaxloops.grads import sgd_update
from jaxloops.kernels import attention_fn
from jaxloops.kernels import attention_with_fallback
from jaxloops.kernels import implementation_report
from jaxloops.kernels import run_attention
from jaxloops.kernels import uses_cudnn_kernel
from jaxloops.kvcache import allocated_bytes
from jaxloops.kvcache import attention_kind
from jaxloops.kvcache import decode_attention
from jaxloops.kvcache import decode_step
from jaxloops.kvcache import init_kv_cache
from jaxloops.kvcache import kv_cache_bytes
from jaxloops.loop import fit
from jaxloops.loop import make_epoch
from jaxloops.loop import python_loop
from jaxloops.loop import unstack
from jaxloops.mlp import accuracy
from jaxloops.mlp import cross_entropy
from jaxloops.mlp import init_mlp
from jaxloops.mlp import mlp_logits
from jaxloops.mlp import mlp_loss
from jaxloops.text import Corpus
from jaxloops.text import ids_to_text
from jaxloops.text import load_stdlib_corpus
from jaxloops.text import sample_windows
from jaxloops.text import spaced_windows
from jaxloops.text import text_to_ids
from jaxloops.timing import CompileLog
from jaxloops.timing import compiled_flops
from jaxloops.timing import compiled_temp_bytes
from jaxloops.timing import count_compiles
from jaxloops.timing import matmul_throughput
from jaxloops.timing import time_call
from jaxloops.timing import time_dispatch
from jaxloops.train import decay_mask
from jaxloops.train import make_optimizer
from jaxloops.train import make_train_step
from jaxloops.transformer import TransformerConfig
from jaxloops.transformer import attention_map
from jaxloops.transformer import cached_logits
from jaxloops.transformer import init_transformer
from jaxloops.transformer import transformer_logits
from jaxloops.transformer import transformer_loss

__all__ = (
    "accuracy",
    "accuracy_from_confusion",
    "adamw_update",
    "allocated_bytes",
    "attention",
    "attention_fn",
    "attention_kind",
    "attention_map",
    "attention_sweep",
    "attention_with_fallback",
    "Batch",
    "blockwise_attention",
    "cached_logits",
    "causal_mask",
    "causal_sweep",
    "check_attention_shapes",
    "chunked_causal_attention",
    "compiled_flops",
    "compiled_temp_bytes",
    "CompileLog",
    "confusion_matrix",
    "Corpus",
    "count_compiles",
    "cross_entropy",
    "decay_mask",
    "decode_attention",
    "decode_step",
    "decode_sweep",
    "describe_backend",
    "einsum_attention",
    "epoch_batches",
    "epoch_example_counts",
    "EvalBatches",
    "evaluate",
    "experiment_sizes",
    "finite_difference",
    "fit",
    "generate",
    "generate_without_cache",
    "gpu_facts",
    "host_syncs",
    "ids_to_text",
    "implementation_report",
    "incremental_logits",
    "init_cache",
    "init_kv_cache",
    "init_mlp",
    "init_transformer",
    "kv_cache_bytes",
    "label_smoothed_cross_entropy",
    "load_digits_split",
    "load_stdlib_corpus",
    "make_accumulating_train_step",
    "make_clipped_optimizer",
    "make_epoch",
    "make_optimizer",
    "make_train_step",
    "matmul_throughput",
    "max_kv_heads",
    "merge_partials",
    "mlp_logits",
    "mlp_loss",
    "mlp_parameter_count",
    "momentum_update",
    "most_confused",
    "naive_attention_temp_bytes",
    "numerics_table",
    "online_softmax_step",
    "pad_batches",
    "partial_attention",
    "per_class_accuracy",
    "precision_recall_f1",
    "python_loop",
    "ragged_batches",
    "ragged_compile_count",
    "ragged_decode_attention",
    "random_cache",
    "random_qkv",
    "read_bandwidth",
    "reference_attention",
    "run_attention",
    "run_label",
    "sample_token",
    "sample_windows",
    "sgd_update",
    "Sizes",
    "sliding_window_mask",
    "softmax_cross_entropy_grad",
    "spaced_windows",
    "Split",
    "split_kv_attention",
    "temperature_probs",
    "text_to_ids",
    "time_call",
    "time_dispatch",
    "to_device",
    "top_k_accuracy",
    "traced_shapes",
    "transformer_logits",
    "transformer_loss",
    "TransformerConfig",
    "unstack",
    "uses_cudnn_kernel",
    "versions",
)
