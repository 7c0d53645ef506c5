"""jaxloops: the tested code behind the book "JAX training loops, executed".

Notation, used in every einsum, shape comment and suffix:

  B batch, T query length, S key/value length, D model width, F hidden width,
  N query heads, K key/value heads, G = N // K, H head dim, V vocabulary,
  C classes, L layers.

Where things live:

  jaxloops            the concepts a reader uses: data, models, losses, gradients, the train
                      step, the loop, evaluation, attention, the KV cache, the transformer,
                      generation, and `experiment_sizes()`.
  jaxloops.measure    measuring: timing, throughput, sweeps, the roofline, machine facts.
  jaxloops.solutions  the answers to the chapters' exercises.

Two rules, applied everywhere:

  Keys. A PRNG key is always an explicit argument, and always the first one
  (`init_mlp(key, sizes)`, `generate(key, params, prompt, ...)`,
  `random_qkv(key, ...)`); nothing takes an integer seed or keeps random state.
  jit. A function a reader calls on arrays from the top level is jitted where it is defined
  (`init_*`, `epoch_batches`, `attention`, `blockwise_attention`, `generate`); a building
  block that only runs inside another program (`mlp_logits`, `attention_weights`,
  `decode_step`) is not; a train step is built plain by `make_train_step`, and the driver
  that runs it (`fit`, or the reader) applies `jax.jit`, so it decides donation.
"""

from jaxloops.data import Batch
from jaxloops.data import Split
from jaxloops.data import epoch_batches
from jaxloops.data import load_digits_split
from jaxloops.data import ragged_batches
from jaxloops.data import to_device
from jaxloops.mlp import init_mlp
from jaxloops.mlp import mlp_logits
from jaxloops.mlp import mlp_loss
from jaxloops.losses import accuracy
from jaxloops.losses import cross_entropy
from jaxloops.grads import finite_difference
from jaxloops.grads import sgd_update
from jaxloops.train import decay_mask
from jaxloops.train import make_optimizer
from jaxloops.train import make_train_step
from jaxloops.loop import fit
from jaxloops.loop import make_epoch
from jaxloops.loop import python_loop
from jaxloops.loop import unstack
from jaxloops.evaluate import EvalBatches
from jaxloops.evaluate import accuracy_from_confusion
from jaxloops.evaluate import confusion_matrix
from jaxloops.evaluate import evaluate
from jaxloops.evaluate import most_confused
from jaxloops.evaluate import pad_batches
from jaxloops.evaluate import per_class_accuracy
from jaxloops.attention import attention
from jaxloops.attention import attention_weights
from jaxloops.attention import causal_mask
from jaxloops.attention import check_attention_shapes
from jaxloops.blockwise import blockwise_attention
from jaxloops.blockwise import online_softmax_step
from jaxloops.kvcache import attention_kind
from jaxloops.kvcache import decode_attention
from jaxloops.kvcache import decode_step
from jaxloops.kvcache import init_kv_cache
from jaxloops.kvcache import kv_cache_bytes
from jaxloops.transformer import TransformerConfig
from jaxloops.transformer import attention_map
from jaxloops.transformer import cached_logits
from jaxloops.transformer import init_transformer
from jaxloops.transformer import transformer_logits
from jaxloops.transformer import transformer_loss
from jaxloops.generation import generate
from jaxloops.generation import generate_without_cache
from jaxloops.generation import init_cache
from jaxloops.generation import sample_token
from jaxloops.text import Corpus
from jaxloops.text import ids_to_text
from jaxloops.text import load_stdlib_corpus
from jaxloops.text import sample_windows
from jaxloops.text import spaced_windows
from jaxloops.text import text_to_ids
from jaxloops.backend import Sizes
from jaxloops.backend import experiment_sizes

__all__ = (
    "accuracy",
    "accuracy_from_confusion",
    "attention",
    "attention_kind",
    "attention_map",
    "attention_weights",
    "Batch",
    "blockwise_attention",
    "cached_logits",
    "causal_mask",
    "check_attention_shapes",
    "confusion_matrix",
    "Corpus",
    "cross_entropy",
    "decay_mask",
    "decode_attention",
    "decode_step",
    "epoch_batches",
    "EvalBatches",
    "evaluate",
    "experiment_sizes",
    "finite_difference",
    "fit",
    "generate",
    "generate_without_cache",
    "ids_to_text",
    "init_cache",
    "init_kv_cache",
    "init_mlp",
    "init_transformer",
    "kv_cache_bytes",
    "load_digits_split",
    "load_stdlib_corpus",
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
    "sample_token",
    "sample_windows",
    "sgd_update",
    "Sizes",
    "spaced_windows",
    "Split",
    "text_to_ids",
    "to_device",
    "transformer_logits",
    "transformer_loss",
    "TransformerConfig",
    "unstack",
)
