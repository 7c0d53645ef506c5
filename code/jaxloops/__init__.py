"""jaxloops: the tested code behind the book "JAX training loops, executed".

Notation, used in every einsum, shape comment and suffix:

  B batch, T query length, S key/value length, D model width, F hidden width,
  N query heads, K key/value heads, G = N // K, H head dim, V vocabulary,
  C classes, L layers.

Local letters: P prompt length, M micro-batches, Tb / Sb query / key block lengths, Tq a
query tile's queries per head (query blocks stacked), R = G * Tq a tile's rows (the G query
heads of one key/value head stacked), Tc a chunk's length, nT / nS numbers of query tiles /
key blocks. L is never a length.

Where things live:

  jaxloops            the concepts a reader uses: data, models, losses, gradients, the train
                      step, the loop, evaluation, attention, the KV cache, the transformer,
                      generation, and `experiment_sizes()`.
  jaxloops.measure    the instruments: what runs, times, compiles or traces something and
                      returns rows (timing, the roofline, compiled programs, throughput,
                      sweeps, machine and published chip facts).
  jaxloops.pages      each chapter's bookkeeping: its rows turned into the page's numbers,
                      tables, plots and checks (`pages/chNN_slug.py`, and `pages.check`).
  jaxloops.equivalence  the float32 rounding bounds that equivalence checks compare within.
  jaxloops.workers    the processes chapters 1, 11, 12, 13 and 15 start (`python -m`),
                      started through `jaxloops.processes`.
  jaxloops.sharding   the rest of chapter 12: placement, HLO collectives, multi-process runs.
  jaxloops.solutions  the answers to the chapters' exercises.
  jaxloops.tracing    chapter 1: a Python branch on a traced value and its traced forms, a
                      static size, a value-dependent shape.
  jaxloops.memory, jaxloops.accumulate, jaxloops.precision
                      chapter 14: remat and the scan over layers, gradient accumulation,
                      mixed precision and loss scaling.
  jaxloops.pallas_attention, jaxloops.pallas_kernels
                      chapter 17: blockwise attention as Pallas kernels for a TPU, forward
                      and backward (interpreted on other backends).

Two rules, applied everywhere:

  Keys. A PRNG key is always an explicit argument, and always the first one
  (`init_mlp(key, sizes)`, `generate(key, params, prompt, ...)`,
  `random_qkv(key, ...)`); nothing takes an integer seed or keeps random state.
  jit. A function with static configuration among its arguments (sizes, flags, a block size,
  a number of steps) is jitted where it is defined, with those arguments static: `init_mlp`,
  `init_transformer`, `epoch_batches`, `attention`, `blockwise_attention`, `generate`; a
  reader never has to know which arguments are static. Pure functions of arrays (models,
  losses, `attention_weights`, `decode_step`) are left plain, for the caller to jit or to
  compose into a larger program; a train step is built plain by `make_train_step`, and the
  driver that runs it (`fit`, or the reader) applies `jax.jit` and decides donation.
"""

import importlib

from jaxloops import accumulate as accumulate  # chapter 14: gradient accumulation
from jaxloops import memory as memory  # chapter 14: remat, the scan over layers, the formula
from jaxloops import precision as precision  # chapter 14: mixed precision, loss scaling
from jaxloops.attention import attention, attention_weights, causal_mask
from jaxloops.blockwise import blockwise_attention, online_softmax_step
from jaxloops.data import Batch, epoch_batches, load_digits_split, ragged_batches, to_device
from jaxloops.evaluate import (
    accuracy_from_confusion,
    checked_confusion_matrix,
    confusion_matrix,
    evaluate,
    most_confused,
    pad_batches,
    per_class_accuracy,
)
from jaxloops.generation import generate, generate_without_cache
from jaxloops.grads import finite_difference, sgd_update
from jaxloops.kvcache import (
    attention_kind,
    checked_decode_step,
    decode_attention,
    decode_step,
    decode_tokens,
    drop_unit_axes,
    init_kv_cache,
    kv_cache_bytes,
)
from jaxloops.loop import fit, make_epoch, python_loop, unstack
from jaxloops.losses import accuracy, checked_cross_entropy, cross_entropy
from jaxloops.mlp import init_mlp, mlp_logits, mlp_loss
from jaxloops.sharding import (
    data_mesh,
    fit_data_parallel,
    shard_map_step,
    sharded_step,
    strategy_specs,
)
from jaxloops.sizes import experiment_sizes
from jaxloops.text import (
    ids_to_text,
    load_stdlib_corpus,
    sample_windows,
    spaced_windows,
    text_to_ids,
)
from jaxloops.train import make_optimizer, make_train_step
from jaxloops.transformer import (
    TransformerConfig,
    attention_map,
    cached_logits,
    init_transformer,
    transformer_logits,
    transformer_loss,
)

__all__ = (
    "accuracy",
    "accuracy_from_confusion",
    "attention",
    "attention_kind",
    "attention_map",
    "attention_weights",
    "Batch",
    "blockwise_attention",
    "BrokenCheckpointWarning",
    "cached_logits",
    "causal_mask",
    "checkpoint_hook",
    "checkpoint_manager",
    "confusion_matrix",
    "checked_confusion_matrix",
    "checked_cross_entropy",
    "checked_decode_step",
    "cross_entropy",
    "data_mesh",
    "decode_attention",
    "decode_step",
    "decode_tokens",
    "epoch_batches",
    "evaluate",
    "experiment_sizes",
    "finite_difference",
    "fit",
    "fit_data_parallel",
    "generate",
    "generate_without_cache",
    "ids_to_text",
    "init_kv_cache",
    "init_mlp",
    "init_transformer",
    "kv_cache_bytes",
    "load_digits_split",
    "load_stdlib_corpus",
    "drop_unit_axes",
    "make_epoch",
    "make_optimizer",
    "make_train_step",
    "mlp_logits",
    "mlp_loss",
    "most_confused",
    "online_softmax_step",
    "pad_batches",
    "per_class_accuracy",
    "python_loop",
    "ragged_batches",
    "restore_latest",
    "sample_windows",
    "sgd_update",
    "shard_map_step",
    "sharded_step",
    "spaced_windows",
    "strategy_specs",
    "text_to_ids",
    "to_device",
    "transformer_logits",
    "transformer_loss",
    "TransformerConfig",
    "unstack",
)

# Chapter 13's checkpointing is imported at its first use: orbax takes 0.15 s to import, which
# every process that never saves (most chapters' kernels, most of the tests' processes) would
# pay. `jaxloops.checkpoint_manager` and `jaxloops.checkpoint` work as if imported above.
_CHECKPOINT = ("BrokenCheckpointWarning", "checkpoint_hook", "checkpoint_manager", "restore_latest")


def __getattr__(name):
    if name == "checkpoint" or name in _CHECKPOINT:
        checkpoint = importlib.import_module("jaxloops.checkpoint")
        return checkpoint if name == "checkpoint" else getattr(checkpoint, name)
    raise AttributeError(f"module 'jaxloops' has no attribute {name!r}")
